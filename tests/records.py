"""The one builder of synthetic records for tests: known numbers, a canned environment.

Plain functions (not fixtures) so that each test states the numbers it needs; the
`make_record` fixture in conftest.py is this module's `synthetic_record`.
"""

from __future__ import annotations

import copy

import numpy as np
from machine_stubs import ENVIRONMENT  # the canned environment, where a test's child process can import it

from kvbench.cache import KINDS, expected_bytes, expected_cache_bytes
from kvbench.config import DecoderConfig
from kvbench.measure.timing import mode_orders
from kvbench.record import RecordView, build_record

NO_TELEMETRY = {"cpu_seconds": None, "voluntary_switches": None, "involuntary_switches": None,
                "runqueue_seconds": None, "steal_seconds": None, "throttled_seconds": None, "cpu_start": None,
                "cpu_end": None}
PASSED_DIFF = 1e-7  # max_abs_diff of a passed check
FAILED_DIFF = 0.5  # max_abs_diff of a failed check
FAILED_POSITION = 2  # first_divergent_position of a failed check


def noisy(center: float, count: int, spread: float = 0.01, seed: int = 0) -> list[float]:
    """`count` samples around `center` with relative uniform noise of +-spread, seeded."""
    rng = np.random.default_rng(seed)
    return [float(center * (1 + spread * x)) for x in rng.uniform(-1, 1, count)]


def check(mode: str, length: int, passed: bool = True) -> dict:
    return {"mode": mode, "length": length, "passed": passed,
            "max_abs_diff": PASSED_DIFF if passed else FAILED_DIFF, "max_rel_diff": 1e-6,
            "first_divergent_position": None if passed else FAILED_POSITION, "non_finite": 0,
            "atol": 1e-5, "rtol": 1e-5, "dtype": "float32"}


def machine_probe(slower: float = 1.0, repeats: int = 5, spread: float = 0.01, seed: int = 0) -> dict:
    """A machine probe of kvbench.measure.machine's workloads, every one `slower` times its base time, with noise."""
    from kvbench.measure.machine import PROBE_CALLS

    base = {"python": 0.02, "dispatch": 0.012, "matmul": 0.008, "copy": 0.006}
    return {"workloads": dict(PROBE_CALLS), "repeats": repeats,
            **{phase: {name: noisy(base[name] * slower, repeats, spread, seed + 17 * i + 101 * p)
                       for i, name in enumerate(PROBE_CALLS)} for p, phase in enumerate(("start", "end"))}}


def synthetic_record(seconds: dict[tuple[str, int], list[float]], *, failed=(), status="complete", repeats=None,
                     environment=None, per_step=None, lengths=None, config=None, checks=None,
                     probe: dict | None = None, preset: str = "seed", steps: dict | None = None,
                     workload: dict | None = None, limits: dict | None = None) -> dict:
    """A valid record with these raw seconds per (mode, length), in the protocol's rotating order.

    A request record: `workload` {"kind": "request", "prompt", "generate"} and `steps` {(mode, length):
    [(ttft, [step seconds]) per repetition]}; each repetition's seconds are then its TTFT and steps' sum."""
    modes = list(dict.fromkeys(mode for mode, _ in seconds))
    lengths = lengths or sorted({length for _, length in seconds})
    repeats = repeats or max(len(v) for v in seconds.values())
    orders = mode_orders(modes, max(repeats, *(len(v) for v in seconds.values())))
    repetitions = [
        {"mode": mode, "length": length, "repetition": r, "order": orders[r].index(mode), "seconds": s,
         "round": r, "started": round(r + orders[r].index(mode) / 100, 6), **NO_TELEMETRY}
        for (mode, length), values in seconds.items() for r, s in enumerate(values)
    ]
    for rep in repetitions:
        if steps and (rep["mode"], rep["length"]) in steps:
            ttft, durations = steps[(rep["mode"], rep["length"])][rep["repetition"]]
            rep.update(seconds=ttft + sum(durations), ttft_seconds=ttft, step_seconds=list(durations))
    config = config or DecoderConfig().to_dict()
    if checks is None:  # each compares logits in the config's dtype
        checks = [{**check(mode, length, (mode, length) not in failed), "dtype": config["dtype"]}
                  for mode, length in seconds]
    model = DecoderConfig.from_dict(config)
    per_position = expected_cache_bytes(model, 1, 1)  # 256 bytes for the seed's lab

    def formula(mode: str, length: int) -> int:  # each kind's own (the float formula for full)
        return expected_bytes(mode, model, 1, length) if mode in KINDS else per_position * length

    memory = [{"mode": mode, "length": length, "expected_bytes": formula(mode, length),
               "measured_bytes": formula(mode, length), "reserved_bytes": 2 * per_position * length}
              for mode, length in seconds]
    run = {"preset": preset, "lengths": lengths, "modes": modes, "batch": 1, "seed": 0, "repeats": repeats,
           "warmup": 1, "threads": 1, "per_step_length": per_step and per_step[0]["length"],
           "workload": workload or {"kind": "loop"}}
    return build_record(
        command=["kvbench", "run"], config=config, run=run,
        protocol={"repeats": repeats, "warmup": 1, "threads": 1},
        environment=copy.deepcopy(ENVIRONMENT if environment is None else environment),
        checks=checks, repetitions=repetitions, memory=memory, status=status, per_step=per_step,
        machine_probe=probe, limits=limits,
    )


def view(record: dict, source: str = "rec.json") -> RecordView:
    return RecordView(record, source)


def scaling_seconds(modes=("full", "concat"), lengths=(16, 32, 64, 128), repeats=7, slow=None, seed=0):
    """full ~ T^2, cached ~ T, with 1 % noise; `slow` maps (mode, length) -> factor applied."""
    out = {}
    for i, length in enumerate(lengths):
        for j, mode in enumerate(modes):
            center = 1e-6 * length ** 2 if mode == "full" else 2e-5 * length
            center *= (slow or {}).get((mode, length), 1.0)
            out[(mode, length)] = noisy(center, repeats, seed=seed * 1000 + i * 10 + j)
    return out


def request_record(prompt: int = 16, generate: int = 9, repeats: int = 15, seed: int = 0,
                   slow: dict | None = None) -> dict:
    """A request run of full, static and paged: TTFT 2 ms for all; TPOT 1 ms for full, 0.25 ms for the caches,
    with 1% noise; `slow` maps (mode, "ttft" | "tpot") -> a factor applied."""
    rng = np.random.default_rng(seed)
    length, slow = prompt + generate - 1, slow or {}
    steps = {}
    for mode, step in (("full", 1e-3), ("static", 2.5e-4), ("paged", 2.5e-4)):
        steps[(mode, length)] = [
            (2e-3 * slow.get((mode, "ttft"), 1.0) * (1 + 0.01 * rng.uniform(-1, 1)),
             [step * slow.get((mode, "tpot"), 1.0) * (1 + 0.01 * rng.uniform(-1, 1)) for _ in range(generate - 1)])
            for _ in range(repeats)]
    seconds = {cell: [ttft + sum(durations) for ttft, durations in values] for cell, values in steps.items()}
    return synthetic_record(seconds, steps=steps,
                            workload={"kind": "request", "prompt": prompt, "generate": generate})


def rate(value: float) -> dict:
    return {"median": value, "min": value * 0.95, "max": value * 1.05, "samples": [value * 0.95, value, value * 1.05]}


LIMITS = {"last_level_cache_bytes": 32 << 20, "buffer_bytes": 128 << 20, "streams": {"copy": 2, "triad": 3},
          "memory_bandwidth": {"copy": {"1": rate(12e9), "2": rate(18e9)}, "triad": {"1": rate(10e9), "2": rate(16e9)}},
          "matmul": [{"shape": [1, 32, 96], "flops_per_second": rate(2e9)},
                     {"shape": [64, 32, 96], "flops_per_second": rate(40e9)}],
          "weight_bytes_per_step": 67968, "parameter_bytes": 346496}


def paths(value: object, prefix: tuple = ()) -> list[tuple]:
    """Every place in a record, containers included; of each list only its first and last items (the rest
    are the same fields again)."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index in sorted({0, len(value) - 1}) if value else ():
            found += paths(value[index], (*prefix, index))
    return found


def mutated(record: dict, path: tuple, how: str, value: object) -> dict:
    """A copy of `record` with the field at `path` replaced by `value`, deleted, or with "junk" beside it."""
    record = copy.deepcopy(record)
    parent = record
    for part in path[:-1]:
        parent = parent[part]
    if how == "replace":
        parent[path[-1]] = value
    elif how == "delete":
        del parent[path[-1]]
    else:  # "junk": a key kvbench never writes, beside the field (or inside it, for an object)
        target = parent[path[-1]] if isinstance(parent[path[-1]], dict) else parent
        if isinstance(target, dict):
            target["junk"] = value
        else:
            target.append(value)
    return record
