"""What a score-based kind's compression costs, at each context: `cache.compress()` alone, timed in rotations.

For each context c and each kind, one sample prefills c tokens of the corpus (untimed: the scores a kind keeps,
the window of queries, h2o's running totals, are gathered by the prefill the static cache pays too) and times
the compression that follows: scoring every retained position of every layer, the top-k, and the gather that
frees what it drops. Kinds run in a rotated order (kvbench.measure.timing.rotation_order), one thread; each
cell's median comes with its 95% order-statistic interval (kvbench.measure.stats.median_interval).

    .venv/bin/python scripts/eviction_costs.py --contexts 1024,2048,4096 --rotations 5 \\
        --output results/eviction/compression-cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from kvbench import modes
from kvbench.cache import make_cache
from kvbench.files import write_bytes_atomic
from kvbench.measure import stats
from kvbench.measure.capture import collect_environment
from kvbench.measure.timing import rotation_order, set_threads, time_call
from kvbench.models import gguf

KINDS = [name for name, *_ in modes.SCORED_KINDS]


def sample(model, ids, kind: str, context: int, ratio: float) -> tuple[float, int]:
    """(seconds compress() took after a prefill of `context` ids, positions it evicted)."""
    cache = make_cache(kind, model.config, capacity=context, evict_ratio=ratio)
    with torch.inference_mode():
        model(ids[:, :context], cache)
        evicted = []
        seconds = time_call(lambda: evicted.append(cache.compress()))
    cache.release()
    return seconds, evicted[0]


def measure(contexts: list[int], kinds: list[str], rotations: int, ratio: float) -> dict:
    found = gguf.read_gguf(gguf.packaged_path("smollm2-135m"))
    model, ids, _, described = gguf.load(found, found.plain_config(), 1, max(contexts))
    cells: dict[str, dict[str, list]] = {f"{kind}@{c}": {"seconds": [], "evicted": []} for kind in kinds for c in contexts}
    for rotation in range(rotations):
        for context in contexts:
            for kind in rotation_order(kinds, rotation, "rotate", 0, context):
                seconds, evicted = sample(model, ids, kind, context, ratio)
                cells[f"{kind}@{context}"]["seconds"].append(seconds)
                cells[f"{kind}@{context}"]["evicted"].append(evicted)
                print(f"rotation {rotation + 1}: {kind} at {context}: {seconds * 1e3:.1f} ms", file=sys.stderr)
    for cell in cells.values():
        low, high = stats.median_interval(cell["seconds"])
        cell.update(median=statistics.median(cell["seconds"]), low=low, high=high)
    return {"schema": "kvbench.eviction-costs/1", "model": described, "evict_ratio": ratio, "rotations": rotations,
            "contexts": contexts, "kinds": kinds, "cells": cells}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="1024,2048,4096")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--rotations", type=int, default=5)
    parser.add_argument("--evict-ratio", type=float, default=0.5)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        contexts = [int(part) for part in args.contexts.split(",")]
        kinds = args.kinds.split(",")
        modes.check_modes(kinds, tuple(KINDS))
        if args.rotations < 3 or not 0 <= args.evict_ratio < 1 or min(contexts) < 128:
            raise ValueError(f"expected --rotations >= 3, --evict-ratio in [0, 1) and contexts >= 128, got "
                             f"{args.rotations}, {args.evict_ratio}, {contexts}")
    except ValueError as error:
        print(f"eviction_costs: error: {error}", file=sys.stderr)
        return 2
    set_threads(1)
    found = measure(contexts, kinds, args.rotations, args.evict_ratio)
    found["environment"] = collect_environment()
    write_bytes_atomic(args.output, (json.dumps(found, indent=1) + "\n").encode())
    for kind in kinds:
        print(kind, *(f"{c}: {found['cells'][f'{kind}@{c}']['median'] * 1e3:.1f} ms" for c in contexts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
