"""Steady decode steps of the compiled modes against kvbench's eager static step, paired in the same rotations.

At each context c, every mode prefills c tokens once; then each rotation (modes in a seeded random order)
times, per mode, `--warmup` untimed steps and a window of `--steps` timed steps at positions c..c+steps-1
(the cache rewound to c before each window, so every window is the same work), on the wall clock and on the
thread's CPU time (which leaves out the waits of a shared machine). A rotation's ratio is one mode's median
step over the baseline's in that rotation; the record keeps every step, and prints the median ratio with
its 95% order-statistic interval. Compile happens before the first rotation and is recorded apart.

    python scripts/compiled_steps.py --preset llama-mini --contexts 256 1024 --rotations 30
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

import torch

from kvbench.models import compiled, hf
from kvbench.cache import StaticCache
from kvbench.config import preset_config
from kvbench.workloads.decode import token_ids
from kvbench.measure.latency import median_with_interval
from kvbench.model import build_model
from kvbench.measure.timing import set_threads

from study import parse_study, save_study, study_parser

OUTPUT = Path("results/limit/compiled-steps.json")
MODES = ("static", "static-compiled", "hf-static-compiled")


class Stepper:
    """One mode's cache after a prefill of `context` tokens; `window(n)` steps n tokens from the context on."""

    def __init__(self, model, ids, mode: str, context: int, steps: int) -> None:
        self.model, self.ids, self.mode, self.context = model, ids, mode, context
        T = context + steps
        if mode == "hf-static-compiled":
            self.hf = hf.model_for(model)
            self.cache = hf.make_hf_cache(mode, self.hf, T)
            self.keyword = hf.cache_keyword(self.hf)
            self.forward = compiled.compiled_forward(self.hf)
            self.hf(input_ids=ids[:, :context], use_cache=True, **{self.keyword: self.cache})
        else:
            capacity = compiled.capacity_for(T, model.config) if mode == "static-compiled" else T
            self.cache = StaticCache(model.config, 1, capacity, spare=1 if mode == "static-compiled" else 0)
            model(ids[:, :context], self.cache)
            self.step = compiled.compiled_step(model)
            self.buffers = [self.cache.buffers(layer) for layer in range(model.config.layers)]
            self.position = torch.zeros(1, dtype=torch.long)

    def rewind(self) -> None:
        if self.mode == "hf-static-compiled":
            for layer in self.cache.layers:
                layer.cumulative_length.fill_(self.context)
        else:
            self.cache.length = self.context

    def one(self, t: int) -> None:
        token = self.ids[:, t : t + 1]
        if self.mode == "static":
            self.model(token, self.cache)
        elif self.mode == "static-compiled":
            self.position.fill_(t)
            S = compiled.span(t, self.cache.capacity)
            self.step(self.model, token, self.position, [k.narrow(2, 0, S) for k, _ in self.buffers],
                      [v.narrow(2, 0, S) for _, v in self.buffers])
            self.cache.length += 1
        else:
            self.forward(input_ids=token, use_cache=True, **{self.keyword: self.cache})

    def window(self, warmup: int, steps: int) -> dict:
        self.rewind()
        for t in range(self.context, self.context + warmup):
            self.one(t)
        self.rewind()
        wall, cpu = [], []
        for t in range(self.context, self.context + steps):
            w, c = time.perf_counter_ns(), time.thread_time_ns()
            self.one(t)
            cpu.append((time.thread_time_ns() - c) / 1e9)
            wall.append((time.perf_counter_ns() - w) / 1e9)
        return {"wall": wall, "cpu": cpu}


def ratios(rotations: list[dict], mode: str, baseline: str, clock: str) -> dict:
    values = [statistics.median(r[mode][clock]) / statistics.median(r[baseline][clock]) for r in rotations]
    return {**median_with_interval(values), "n": len(values)}


def measure(model, context: int, args) -> dict:
    ids = token_ids(model.config, 1, context + args.steps)
    with torch.inference_mode():
        steppers = {mode: Stepper(model, ids, mode, context, args.steps) for mode in args.modes}
        for stepper in steppers.values():  # compiles once per process (timed into compiled.compile_seconds)
            stepper.window(args.warmup, args.steps)
        rotations, order = [], list(args.modes)
        shuffle = random.Random(context)
        for _ in range(args.rotations):
            shuffle.shuffle(order)
            rotations.append({mode: steppers[mode].window(args.warmup, args.steps) for mode in order})
    found = {"context": context, "rotations": rotations, "ratios": {}}
    for mode in args.modes:
        for baseline in args.modes:
            if mode != baseline:
                found["ratios"][f"{mode}/{baseline}"] = {clock: ratios(rotations, mode, baseline, clock)
                                                        for clock in ("wall", "cpu")}
    found["median_step_ms"] = {mode: {clock: 1e3 * statistics.median([s for r in rotations for s in r[mode][clock]])
                                      for clock in ("wall", "cpu")} for mode in args.modes}
    return found


def main(argv: list[str] | None = None) -> int:
    parser = study_parser(__doc__, OUTPUT)
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--modes", nargs="+", default=list(MODES))
    parser.add_argument("--rotations", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--steps", type=int, default=16)
    args = parse_study(parser, argv)
    threads = set_threads(1)
    model = build_model(preset_config(args.preset), seed=0)
    results = [measure(model, context, args) for context in args.contexts]
    for result in results:
        for name, by_clock in result["ratios"].items():
            if name.endswith("/static") or name == "static-compiled/hf-static-compiled":
                cpu = by_clock["cpu"]
                print(f"c={result['context']} {name}: {cpu['median']:.3f} [{cpu['low']:.3f}, {cpu['high']:.3f}] "
                      f"(CPU time; wall {by_clock['wall']['median']:.3f})")
        print(f"c={result['context']} median step ms (cpu): "
              + ", ".join(f"{m} {v['cpu']:.3f}" for m, v in result["median_step_ms"].items()))
    save_study("compiled-steps", args, threads, steps=args.steps, warmup=args.warmup,
               compile_seconds=compiled.compile_seconds, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
