"""Where a decode step's time goes: kvbench's caches and transformers' on the same weights, under torch.profiler.

One teacher-forced loop per path (after a warmup), one thread, and per token: the matmuls
(the weights, read from memory at every step), attention, every other aten op, and how many
aten calls the step makes. The profiler inflates small ops, so the split says where the time
goes, not what a loop costs: scripts/hf_peers.py times that.

    python scripts/hf_profile.py --preset llama-mini --length 1024
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from kvbench.config import preset_config
from kvbench.files import check_output, write_json_atomic
from kvbench.measure.timing import set_threads
from kvbench.model import build_model
from kvbench.models import hf
from kvbench.record import utc_now
from kvbench.workloads.decode import decode, token_ids

MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")


def split(events, tokens: int) -> dict:
    """Per token: microseconds of matmuls, attention and the rest, and aten calls (self time, no double count)."""
    total = sum(e.self_cpu_time_total for e in events)
    matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMULS)
    attention = sum(e.self_cpu_time_total for e in events if "scaled_dot_product" in e.key or "attention" in e.key)
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:8]
    return {"us_per_token": total / tokens, "matmul_us": matmul / tokens, "attention_us": attention / tokens,
            "other_us": (total - matmul - attention) / tokens, "aten_calls": sum(e.count for e in events) / tokens,
            "top_ops_us": {e.key: e.self_cpu_time_total / tokens for e in top}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-mini")
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--output", type=Path, default=Path("results/external/hf-llama-mini-profile.json"))
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    check_output(args.output, args.force)
    transformers = hf.require_transformers()
    threads = set_threads(1)
    model = build_model(preset_config(args.preset), seed=0)
    theirs = hf.hf_model(model)
    ids = token_ids(model.config, 1, args.length)

    def transformers_loop() -> None:
        with torch.inference_mode():
            cache = transformers.DynamicCache(config=theirs.config)
            for t in range(args.length):
                theirs(input_ids=ids[:, t : t + 1], cache=cache, use_cache=True)

    loops = {"paged": lambda: decode(model, ids, "paged"), "static": lambda: decode(model, ids, "static"),
             "hf-llama-dynamic": transformers_loop}
    found = {}
    for label, loop in loops.items():
        loop()  # warmup
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            loop()
        found[label] = split(prof.key_averages(), args.length)
        print(f"{label:18s} {found[label]['us_per_token']:7.0f} us/token profiled: matmuls {found[label]['matmul_us']:.0f}, "
              f"attention {found[label]['attention_us']:.0f}, other {found[label]['other_us']:.0f} "
              f"({found[label]['aten_calls']:.0f} aten calls a token)")
    write_json_atomic({"schema": "kvbench.profile/1", "created_utc": utc_now(), "command": sys.argv,
                       "preset": args.preset, "config": model.config.to_dict(), "length": args.length,
                       "threads_in_effect": threads, "transformers_version": transformers.__version__,
                       "profile": found}, args.output, force=args.force)
    print(f"-> {args.output}")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except ValueError as error:
        print(f"hf_profile: error: {str(error).splitlines()[0]}", file=sys.stderr)
        raise SystemExit(2) from None
