"""What one more decode row costs in a batched iteration, against what its arithmetic costs (docs/serving.md,
"What a row costs").

A random-weight model of SmolLM2-135M's shape (read from the packaged GGUF file's metadata when it is installed,
else the same numbers written here), one thread. Rows are requests of the chat trace (seed 0) half way through
their outputs: row i holds prompt_i + output_i / 2 positions. For B in --rows, in every round and in an order
that rotates from round to round:

  paged   one batched decode step (kvbench.cache.batch.BatchedCache over B paged rows of one pool), the way the
          scheduler calls it (with its Workspace);
  static  the same over B static rows;
  floor   the same step's matmuls alone, as plain calls on contiguous operands: every projection and the head on
          (B, C) activations, and each row's q.K and p.V against its own keys and values (the static rows'
          buffers, so they are read from memory as the step reads them). What no implementation of the step
          can skip; its time at B rows gives the matmul rate of these shapes on this machine in these rounds.

A row's marginal cost is the slope of the median time over B (least squares); its ratio to the floor's slope is
the figure the goal is set on (at most 1.5). Intervals: 95% percentile bootstrap over rounds (seeded). Times are
wall clock (perf_counter) with the thread's CPU time beside; the load average is recorded before and after,
since the machine is shared. One torch.profiler pass of each step at the largest B says where the time goes.
The rows grow by one position a step (no rollback): over the rounds the contexts drift by at most `rounds`
positions a row, recorded.

Usage: PYTHONPATH=. .venv/bin/python scripts/row_cost.py [--rows 1,4,8,16] [--rounds 15]
       [--output results/row-cost/smollm2-135m.json] [--force]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import random
import statistics
import subprocess
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from kvbench.cache import BlockPool, PagedCache, make_cache
from kvbench.cache import batch as batched
from kvbench.config import DecoderConfig
from kvbench.files import write_json_atomic
from kvbench.model import build_model
from kvbench.serving.trace import make_trace, parse_arrivals, parse_lengths

SCHEMA = "kvbench.row-cost/1"
# SmolLM2-135M-Instruct's shapes, as its GGUF file's metadata gives them (kvbench.models.gguf reads them there)
SMOLLM2_SHAPE = {"family": "llama", "vocab_size": 49152, "width": 576, "layers": 30, "heads": 9, "kv_heads": 3,
                 "head_dim": 64, "intermediate_size": 1536, "norm_eps": 1e-5, "rope_theta": 100000.0,
                 "tie_embeddings": True}
BLOCK_SIZE = 16


def model_shape() -> tuple[dict, str]:
    try:
        from kvbench.models import gguf

        found = gguf.read_gguf(gguf.packaged_path("smollm2-135m")).config
        return {name: found[name] for name in SMOLLM2_SHAPE}, "the packaged GGUF file's metadata"
    except (ValueError, ImportError):
        return dict(SMOLLM2_SHAPE), "the numbers written in scripts/row_cost.py"


def contexts_of(count: int, max_length: int) -> list[int]:
    trace = make_trace({**parse_lengths("chat"), **parse_arrivals("all"), "requests": count}, 0, max_length)
    return [request.prompt + request.output // 2 for request in trace.requests]


def filled_rows(config: DecoderConfig, contexts: list[int], room: int) -> tuple[list, list]:
    """Paged rows of one pool and static rows, each holding its context's positions of random keys and values
    (their values do not change what the step costs), with room for `room` more."""
    pool = BlockPool(config, sum(-(-(length + room) // BLOCK_SIZE) for length in contexts), BLOCK_SIZE)
    pool.storage.normal_()
    paged, static = [], []
    for length in contexts:
        row = PagedCache(config, 1, length + room, pool=pool)
        row.reserve(length)
        row.commit(length)
        paged.append(row)
        row = make_cache("static", config, 1, length + room)
        row.reserve(length)
        row.commit(length)
        for layer in range(config.layers):
            row.keys(layer).normal_()
            row.values(layer).normal_()
        static.append(row)
    return paged, static


def step_call(model, rows: list, workspace):
    def call() -> None:
        ids = torch.zeros(len(rows), 1, dtype=torch.long)
        view = batched.BatchedCache(rows, [1] * len(rows), *([workspace] if workspace is not None else []))
        model(ids, view)
    return call


def floor_call(model, config: DecoderConfig, rows: list):
    """The step's matmuls alone on contiguous operands (the static rows' own buffers)."""
    B, C, H, KVH, D = len(rows), config.width, config.heads, config.kv_heads, config.head_dim
    x, h = torch.randn(B, C), torch.randn(B, config.intermediate_size)
    q = torch.randn(B, KVH, H // KVH, D)

    def call() -> None:
        for layer, block in enumerate(model.blocks):
            F.linear(x, block.qkv.weight)
            for b, row in enumerate(rows):  # (1, KVH, T, D) each: the row's own contiguous keys and values
                scores = torch.matmul(q[b], row.keys(layer)[0].transpose(-1, -2))  # (KVH, G, T)
                torch.matmul(scores, row.values(layer)[0])  # (KVH, G, D)
            F.linear(x, block.out.weight)
            F.linear(x, block.gate_up.weight)
            F.linear(h, block.down.weight)
        F.linear(x, model.token.weight if model.head is None else model.head.weight)
    return call


def step_flops(config: DecoderConfig, contexts: list[int]) -> float:
    """Multiply-adds x 2 of the floor's matmuls over these rows."""
    C, I, H, KVH, D = config.width, config.intermediate_size, config.heads, config.kv_heads, config.head_dim
    per_layer = C * (H + 2 * KVH) * D + H * D * C + C * 2 * I + I * C
    per_row = config.layers * per_layer + C * config.vocab_size
    return 2.0 * sum(per_row + config.layers * 2 * H * length * D for length in contexts)


def slope(xs: list[int], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def timed(call) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.thread_time()
    call()
    return time.perf_counter() - wall, time.thread_time() - cpu


def profile_of(call, top: int = 8) -> list[dict]:
    from torch.profiler import profile

    with profile() as recorded:
        call()
    events = sorted(recorded.key_averages(), key=lambda event: event.self_cpu_time_total, reverse=True)
    total = sum(event.self_cpu_time_total for event in events)
    return [{"op": event.key, "self_ms": round(event.self_cpu_time_total / 1e3, 3), "calls": event.count,
             "share": round(event.self_cpu_time_total / total, 4)} for event in events[:top]]


def bootstrap(rounds: list[dict], sizes: list[int], statistic, draws: int = 2000) -> list[float]:
    rng = random.Random("kvbench.row_cost")
    values = []
    for _ in range(draws):
        picked = [rounds[rng.randrange(len(rounds))] for _ in rounds]
        values.append(statistic(picked))
    values.sort()
    return [values[int(0.025 * draws)], values[int(0.975 * draws) - 1]]


def commit_of() -> str | None:
    """The commit of the kvbench measured (the checkout PYTHONPATH points at, not the script's)."""
    try:
        return subprocess.run(["git", "-C", str(Path(batched.__file__).parent), "rev-parse", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def measure(sizes: list[int], rounds: int) -> dict:
    """Every call timed in `rounds` rotated rounds, and the profile at the largest size."""
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    shape, shape_source = model_shape()
    config = DecoderConfig.from_dict({**shape, "max_length": 4096})
    model = build_model(config, seed=0)
    contexts = contexts_of(max(sizes), 2048)
    load_before = os.getloadavg()
    workspace = batched.Workspace() if "workspace" in inspect.signature(batched.BatchedCache).parameters and hasattr(
        batched, "Workspace") else None  # an older checkout has none: the script measures it as it was
    steps = len(sizes) * (rounds + 2)
    with torch.inference_mode():
        paged, static = filled_rows(config, contexts, steps + 2)
        calls = {}
        for B in sizes:
            calls[("paged", B)] = step_call(model, paged[:B], workspace)
            calls[("static", B)] = step_call(model, static[:B], workspace)
            calls[("floor", B)] = floor_call(model, config, static[:B])
        for call in calls.values():  # warm-up: one of each
            call()
        keys, kept = list(calls), []
        for index in range(rounds):
            shift = index % len(keys)
            kept.append({key: timed(calls[key]) for key in keys[shift:] + keys[:shift]})
        profiles = {f"{what}@{max(sizes)}": profile_of(calls[(what, max(sizes))]) for what in ("paged", "static")}
    return {"config": config, "shape": shape, "shape_from": shape_source, "contexts": contexts[: max(sizes)],
            "grow": steps + 1, "keys": keys, "rounds": kept, "profiles": profiles, "workspace": workspace is not None,
            "load": [list(load_before), list(os.getloadavg())]}


def median_of(picked: list[dict], what: str, B: int, clock: int = 0) -> float:
    return statistics.median(entry[(what, B)][clock] for entry in picked)


def summarised(measured: dict, sizes: list[int], argv: list[str]) -> dict:
    rounds, config, contexts = measured["rounds"], measured["config"], measured["contexts"]
    result = {"schema": SCHEMA, "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "commit": commit_of(), "command": ["scripts/row_cost.py", *argv],
              "model": {"shape": measured["shape"], "shape_from": measured["shape_from"], "weights": "random (seed 0)"},
              "threads": torch.get_num_threads(), "torch": torch.__version__, "machine": platform.processor() or None,
              "cpu_count": os.cpu_count(), "load_average_before": measured["load"][0],
              "load_average_after": measured["load"][1], "workspace": measured["workspace"], "block_size": BLOCK_SIZE,
              "rounds": len(rounds), "contexts": contexts, "contexts_grow_by_at_most": measured["grow"],
              "rows": {}, "marginal": {}, "profile_at_most_rows": measured["profiles"],
              "raw": {f"{what}@{B}": [[round(entry[(what, B)][0], 7), round(entry[(what, B)][1], 7)] for entry in rounds]
                      for what, B in measured["keys"]}}
    for B in sizes:
        flops, floor = step_flops(config, contexts[:B]), median_of(rounds, "floor", B)
        result["rows"][str(B)] = {
            **{f"{what}_ms": round(1e3 * median_of(rounds, what, B), 3) for what in ("paged", "static", "floor")},
            **{f"{what}_cpu_ms": round(1e3 * median_of(rounds, what, B, 1), 3) for what in ("paged", "static", "floor")},
            "floor_gflop": round(flops / 1e9, 4), "floor_gflops_per_s": round(flops / floor / 1e9, 2)}
    for clock, suffix in ((0, ""), (1, "_cpu")):
        per_row = lambda picked, what, clock=clock: slope(sizes, [median_of(picked, what, B, clock)  # noqa: E731
                                                                  for B in sizes])
        for what in ("paged", "static", "floor"):
            estimate = lambda picked, what=what: per_row(picked, what)  # noqa: E731
            result["marginal"][f"{what}_ms_per_row{suffix}"] = {
                "estimate": round(1e3 * estimate(rounds), 3),
                "interval": [round(1e3 * v, 3) for v in bootstrap(rounds, sizes, estimate)]}
        for what in ("paged", "static"):
            ratio = lambda picked, what=what: per_row(picked, what) / per_row(picked, "floor")  # noqa: E731
            result["marginal"][f"{what}_over_floor{suffix}"] = {
                "estimate": round(ratio(rounds), 3), "interval": [round(v, 3) for v in bootstrap(rounds, sizes, ratio)]}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,4,8,16")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--output", type=Path, default=Path("results/row-cost/smollm2-135m.json"))
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args()
    sizes = [int(part) for part in args.rows.split(",")]
    result = summarised(measure(sizes, args.rounds), sizes, os.sys.argv[1:])
    write_json_atomic(result, args.output, args.force)
    print(json.dumps({"rows": result["rows"], "marginal": result["marginal"],
                      "load": [result["load_average_before"], result["load_average_after"]]}, indent=1))
    print(f"written: {args.output}")


if __name__ == "__main__":
    main()
