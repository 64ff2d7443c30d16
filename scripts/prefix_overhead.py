"""What the prefix cache's bookkeeping costs a replay that finds nothing to reuse (docs/serving.md, "Prefix cache
goals, measured"): the chat trace replayed on llama-mini by the paged kind with and without its prefix cache, and
the thread CPU time spent in the ledger's calls (admission, settling after each call, release, the memory
snapshot, the order's ranking) against the whole replay's. A wall-clock throughput ratio on a shared machine cannot
resolve 1%; this counts the extra work itself.

Usage: .venv/bin/python scripts/prefix_overhead.py [--requests 16] [--replays 3] [--budget-mib 32]
Prints one JSON object: per side, each replay's CPU seconds and the ledger's share of them, and the hit tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from kvbench.config import preset_config
from kvbench.model import build_model
from kvbench.serving.replay import Replay
from kvbench.serving.trace import make_trace, parse_arrivals, parse_lengths

CALLS = ("admit", "settle", "release", "snapshot", "growth_fits", "cached_tokens")


def timed(ledger, spent: list[int]) -> None:
    """Wrap the ledger's calls so their thread CPU time adds up in spent[0]."""
    for name in CALLS:
        call = getattr(ledger, name)

        def wrapper(*args, _call=call, **kwargs):
            start = time.thread_time_ns()
            try:
                return _call(*args, **kwargs)
            finally:
                spent[0] += time.thread_time_ns() - start
        setattr(ledger, name, wrapper)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--replays", type=int, default=3)
    parser.add_argument("--budget-mib", type=int, default=32)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    config = preset_config("llama-mini")
    model = build_model(config, seed=0)
    trace = make_trace({**parse_lengths("chat"), **parse_arrivals("all"), "requests": args.requests}, 0,
                       config.max_length)
    plain = {"block_size": 16, "share_prefix": False, "max_batched_tokens": 512}
    sides = {"paged": plain, "paged-prefix": {**plain, "kind": "paged", "prefix_cache": True}}
    out = {name: [] for name in sides}
    for _ in range(args.replays):
        for name, settings in sides.items():  # alternating, so that neither always runs first
            replay = Replay(model, trace, name, args.budget_mib << 20, settings)
            replay.prepare()
            spent = [0]
            timed(replay.scheduler.ledger, spent)
            start = time.thread_time_ns()
            replay()
            total = time.thread_time_ns() - start
            cached = replay.last.get("prefix_cache", {})
            out[name].append({"cpu_seconds": total / 1e9, "ledger_seconds": spent[0] / 1e9,
                              "ledger_share": spent[0] / total, "hit_tokens": sum(cached.get("hit_tokens", [0]))})
    print(json.dumps({"trace": "chat", "requests": args.requests, "load_average": os.getloadavg(), **out}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
