"""Where a batched decode iteration's fixed time goes, static rows against paged rows of one pool (docs/serving.md,
"Where the time goes"): per batch size, the thread CPU time of

  setup   building the batch's view (BatchedCache: positions, mask), the rows' checks and reservations (paged:
          block tables and pool slots), then giving the reservation back: what the cache costs per iteration
          before any arithmetic;
  step    one whole decode forward of the batch (llama-mini, one thread), the rows advancing one token.

Medians over many iterations, on `time.thread_time_ns` (a waiting thread is not charged), with the load average.
Usage: .venv/bin/python scripts/batched_decode_overhead.py [--rows 1,4,8,16] [--iterations 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from kvbench.cache import BlockPool, PagedCache, make_cache
from kvbench.cache.batch import BatchedCache
from kvbench.config import DecoderConfig
from kvbench.model import build_model


def rows_of(kind: str, config: DecoderConfig, model, count: int, iterations: int) -> list:
    """`count` requests prefilled to lengths 40, 60, ... with room for `iterations` more tokens each."""
    lengths = [40 + 20 * index for index in range(count)]
    pool = None
    if kind == "paged":
        size = 16
        pool = BlockPool(config, sum(-(-(length + 2 * iterations + 2) // size) for length in lengths), size)
    rows = []
    for length in lengths:
        capacity = length + 2 * iterations + 2
        cache = PagedCache(config, 1, capacity, pool=pool) if pool else make_cache("static", config, 1, capacity)
        model(torch.randint(0, config.vocab_size, (1, length)), cache)
        rows.append(cache)
    return rows


def setup_seconds(config: DecoderConfig, rows: list) -> float:
    start = time.thread_time_ns()
    batch = BatchedCache(rows, [1] * len(rows))
    batch.check_append(config, len(rows), 1)
    batch.reserve(1)
    elapsed = time.thread_time_ns() - start
    batch.rollback()
    return elapsed / 1e9


def step_seconds(model, config: DecoderConfig, rows: list) -> float:
    ids = torch.randint(0, config.vocab_size, (len(rows), 1))
    start = time.thread_time_ns()
    model(ids, BatchedCache(rows, [1] * len(rows)))
    return (time.thread_time_ns() - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,4,8,16")
    parser.add_argument("--iterations", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = DecoderConfig.from_preset("llama-mini")
    model = build_model(config, seed=0)
    print(f"load average {os.getloadavg()}; llama-mini, one thread; medians of {args.iterations} iterations, "
          "thread CPU ms")
    print(f"{'rows':>4} {'kind':>6} {'setup':>8} {'step':>8}")
    with torch.inference_mode():
        for count in map(int, args.rows.split(",")):
            for kind in ("static", "paged"):
                rows = rows_of(kind, config, model, count, args.iterations)
                setup = statistics.median(setup_seconds(config, rows) for _ in range(args.iterations))
                step = statistics.median(step_seconds(model, config, rows) for _ in range(args.iterations))
                print(f"{count:>4} {kind:>6} {setup * 1e3:>8.3f} {step * 1e3:>8.3f}")


if __name__ == "__main__":
    main()
