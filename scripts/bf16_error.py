"""How far bfloat16 logits are from the truth, on both paths the gate compares: the evidence for bf16's tolerance.

The gate compares a cached path with the full-prefix path in the model's dtype. In bfloat16 the two
run different kernels at different shapes (a one-row matmul for a step, a c-row one for the prefix),
so they round differently. Whether a difference between them is a bug or rounding can only be told
against a third computation that does not round: the same weights (the bf16 values, exactly) in
float64. This script measures, per preset and context, each path's error against that float64
reference and the two paths' difference, and the smallest bound of the gate's form atol + rtol |ref|
(atol = rtol) that passes twice the larger path error (two legitimate roundings may err in opposite
directions).

    python scripts/bf16_error.py --preset qwen2.5-0.5b --contexts 256 1024 --loop 32
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

from kvbench.config import DecoderConfig
from kvbench.workloads.decode import decode_cached, decode_full, steps, token_ids
from kvbench.model import build_model
from kvbench.measure.timing import set_threads

from study import parse_study, save_study, study_parser

OUTPUT = Path("results/limit/bf16-error.json")


def errors(candidate: torch.Tensor, truth: torch.Tensor) -> dict:
    """candidate's |difference| from truth (same shape, float64), and the atol = rtol bound twice it needs."""
    difference = (candidate.double() - truth).abs()
    needed = float((2 * difference / (1 + truth.abs())).max())  # 2|d| <= tol (1 + |ref|)
    return {"max_abs": float(difference.max()), "median_abs": float(difference.median()),
            "p99_abs": float(difference.flatten().quantile(0.99)), "tolerance_needed": needed}


def float64_twin(model):
    """The same weights, the bf16 values exactly, computing in float64 (no second random init)."""
    twin = copy.deepcopy(model).double()
    config = DecoderConfig.from_dict({**model.config.to_dict(), "dtype": "float64"})
    twin.config = config
    if hasattr(twin, "cos"):  # the tables are recomputed in float64 rather than kept at bf16's rounding
        from kvbench.model import rotary_tables

        twin.cos, twin.sin = (table.double() for table in rotary_tables(config))
    return twin


def measure(preset: str, contexts: list[int], loop: int) -> dict:
    config = DecoderConfig.from_preset(preset, dtype=torch.bfloat16, max_length=max([*contexts, loop]) + 1)
    model = build_model(config, seed=0)
    twin = float64_twin(model)
    ids = token_ids(config, 1, config.max_length)
    found = {"preset": preset, "contexts": {}, "loop": None}
    with torch.inference_mode():
        for context in contexts:
            cell = ids[:, : context + 1]
            truth = twin(cell)[0][:, -1:]
            full = model(cell)[0][:, -1:]
            stepping = steps(model, cell, "static", prompt=context)
            next(stepping)  # the prefill of the context
            static = next(stepping)[0][:, None]  # the first step after it, at position `context`
            stepping.close()
            found["contexts"][str(context)] = {
                "reference_std": float(truth.std()), "reference_max_abs": float(truth.abs().max()),
                "full": errors(full, truth), "static": errors(static, truth),
                "full_vs_static_max_abs": float((full.double() - static.double()).abs().max())}
        if loop:
            cell = ids[:, :loop]
            truth = torch.stack([twin(cell[:, : t + 1])[0][:, -1] for t in range(loop)], dim=1)
            full, static = decode_full(model, cell, keep_logits=True), decode_cached(model, cell, "static", True)
            found["loop"] = {"length": loop, "full": errors(full, truth), "static": errors(static, truth),
                             "full_vs_static_max_abs": float((full.double() - static.double()).abs().max())}
    return found


def main(argv: list[str] | None = None) -> int:
    parser = study_parser(__doc__, OUTPUT, preset=["llama-mini", "qwen2.5-0.5b"])
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--loop", type=int, default=32, help="positions of a decode loop to check (0: none)")
    args = parse_study(parser, argv)
    threads = set_threads(1)
    results = [measure(preset, args.contexts, args.loop) for preset in args.preset]
    save_study("bf16-error", args, threads, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
