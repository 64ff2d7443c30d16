"""Prefill (TTFT) in bfloat16 against float32, paired in the same rotations, on the same weights.

The bfloat16 model holds the float32 model's weights rounded to bfloat16. Each rotation (seeded random
order) times one prefill of `--prompt` tokens into a fresh static cache per dtype, on the wall clock and
the thread's CPU time. Before timing, the bf16 prefill's last logits are checked against float32's with
bfloat16's depth-scaled tolerance (kvbench.kinds.tolerance_for). Prints the median bf16/f32 ratio with
its 95% order-statistic interval; writes every sample.

    python scripts/bf16_prefill.py --preset llama-mini --prompt 512 --rotations 20
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

import torch

from kvbench.cache import make_cache
from kvbench.config import preset_config
from kvbench.workloads.decode import compare_logits, token_ids, tolerances
from kvbench.model import build_model
from kvbench.measure.stats import median_interval
from kvbench.measure.timing import set_threads

from study import parse_study, save_study, study_parser

OUTPUT = Path("results/limit/bf16-prefill.json")


def prefill(model, ids):
    cache = make_cache("static", model.config, ids.shape[0], ids.shape[1])
    return model(ids, cache)[0][:, -1]


def main(argv: list[str] | None = None) -> int:
    parser = study_parser(__doc__, OUTPUT)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--rotations", type=int, default=20)
    args = parse_study(parser, argv)
    threads = set_threads(1)
    models = {"float32": build_model(preset_config(args.preset), seed=0)}
    models["bfloat16"] = build_model(preset_config(args.preset, dtype=torch.bfloat16), seed=0)
    models["bfloat16"].load_state_dict({name: t.to(torch.bfloat16) for name, t in models["float32"].state_dict().items()})
    ids = token_ids(models["float32"].config, 1, args.prompt)
    samples = {name: {"wall": [], "cpu": []} for name in models}
    with torch.inference_mode():
        reference = prefill(models["float32"], ids)
        atol, rtol = tolerances(torch.bfloat16, models["bfloat16"].config.layers)
        check = compare_logits("bfloat16", prefill(models["bfloat16"], ids)[:, None].float(), reference[:, None],
                               atol, rtol).to_dict()
        order, shuffle = list(models), random.Random(0)
        for _ in range(args.rotations):
            shuffle.shuffle(order)
            for name in order:
                wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
                prefill(models[name], ids)
                samples[name]["cpu"].append((time.thread_time_ns() - cpu) / 1e9)
                samples[name]["wall"].append((time.perf_counter_ns() - wall) / 1e9)
    ratios = {}
    for clock in ("wall", "cpu"):
        values = [b / f for b, f in zip(samples["bfloat16"][clock], samples["float32"][clock])]
        low, high = median_interval(values)
        ratios[clock] = {"median": statistics.median(values), "low": low, "high": high}
    print(f"gate (bf16 prefill's last logits against float32's, atol = rtol = {atol:.3g}): "
          f"{'passed' if check['passed'] else 'FAILED'}, max |diff| {check['max_abs_diff']:.3g}")
    for clock, ratio in ratios.items():
        print(f"TTFT bf16/f32 ({clock}): {ratio['median']:.3f} [{ratio['low']:.3f}, {ratio['high']:.3f}]; medians ms "
              + ", ".join(f"{name} {1e3 * statistics.median(s[clock]):.2f}" for name, s in samples.items()))
    save_study("bf16-prefill", args, threads, prompt=args.prompt, check=check, ratios=ratios, samples=samples)
    return 0


if __name__ == "__main__":
    sys.exit(main())
