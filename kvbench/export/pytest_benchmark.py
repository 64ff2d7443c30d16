"""pytest-benchmark's JSON (`pytest --benchmark-json`), which `pytest-benchmark compare`, Bencher's
`python_pytest` adapter and github-action-benchmark's `pytest` tool read.

One benchmark per cell: group `<case>, length <length>` (so `compare` lines the modes up at
one length), name `decode[<mode>-<length>]`, `stats` computed from the raw seconds as
pytest-benchmark computes them (its quartile rule included; hd15iqr the highest datum within
Q3 + 1.5 IQR, as 5.3 corrected it) with `data` the samples and
`iterations` 1 (one sample is one whole decode loop, request, or a context's timed steps);
`extra_info` what a sample covers, the median's 95% rerun interval and the speedup with its interval,
for pytest-benchmark has one unit, seconds. A request or contexts cell adds one benchmark per series
its figures summarize, `<series>[<mode>-<length>]` in group `<case> <series>, length <length>`:
`ttft`, `tpot` (each request's), `itl` (every step, pooled; its p50/p90/p99 in `extra_info`),
`step`, `first_step` (each sample's), with the report's figures and their intervals in `extra_info`.
One file holds one `machine_info` and one `commit_info`: one machine per file.
"""

from __future__ import annotations

import statistics
from bisect import bisect_left, bisect_right

from kvbench.export.common import Cell, Source, cell_facts

FORMAT_VERSION = "5.2.3"  # the pytest-benchmark release whose JSON layout this follows


def quartiles(data: list[float]) -> tuple[float, float]:
    """pytest-benchmark's q1 and q3 (Wikipedia's method 3 for odd counts, method 2 for even)."""
    ordered, n = sorted(data), len(data)
    if n == 1:
        return ordered[0], ordered[0]
    if n % 2 == 0:
        return statistics.median(ordered[: n // 2]), statistics.median(ordered[n // 2 :])
    k, rest = n // 4, n % 4
    if rest == 1:
        return 0.25 * ordered[k - 1] + 0.75 * ordered[k], 0.75 * ordered[3 * k] + 0.25 * ordered[3 * k + 1]
    return 0.75 * ordered[k] + 0.25 * ordered[k + 1], 0.25 * ordered[3 * k + 1] + 0.75 * ordered[3 * k + 2]


def sample_stats(data: list[float]) -> dict:
    """Every field of pytest_benchmark.stats.Stats.as_dict, then data and iterations."""
    ordered, n = sorted(data), len(data)
    mean = statistics.mean(data)
    stddev = statistics.stdev(data) if n > 1 else 0
    q1, q3 = quartiles(data)
    iqr = q3 - q1
    low_fence, high_fence = q1 - 1.5 * iqr, q3 + 1.5 * iqr
    stddev_outliers = sum(value < mean - stddev or value > mean + stddev for value in data)
    iqr_outliers = sum(value < low_fence or value > high_fence for value in data)
    total = sum(data)
    return {
        "min": ordered[0], "max": ordered[-1], "mean": mean, "stddev": stddev, "rounds": n,
        "median": statistics.median(data), "iqr": iqr, "q1": q1, "q3": q3, "iqr_outliers": iqr_outliers,
        "stddev_outliers": stddev_outliers, "outliers": f"{stddev_outliers};{iqr_outliers}",
        "ld15iqr": ordered[0] if n == 1 else ordered[bisect_left(ordered, low_fence)],
        "hd15iqr": ordered[0] if n == 1 else ordered[bisect_right(ordered, high_fence) - 1],
        "ops": n / total if total else 0, "total": total, "data": list(data), "iterations": 1,
    }


def machine_info(source: Source) -> dict:
    build = source.fact("python", "build")
    return {
        "node": source.machine, "processor": source.fact("os", "machine") or "",
        "machine": source.fact("os", "machine") or "", "python_compiler": source.fact("python", "compiler") or "",
        "python_implementation": source.fact("python", "implementation") or "",
        "python_implementation_version": source.fact("python", "version") or "",
        "python_version": source.fact("python", "version") or "",
        "python_build": list(build) if isinstance(build, list) else [],
        "release": source.fact("os", "release") or "", "system": source.fact("os", "system") or "",
        "cpu": {"vendor_id": source.fact("cpu", "vendor") or "", "brand": source.fact("cpu", "brand") or "",
                "brand_raw": source.fact("cpu", "brand") or "", "arch": source.fact("cpu", "arch") or "",
                "count": source.fact("cpu", "count")},
        "torch_version": source.fact("torch", "version"),
        "torch_threads": f"{source.fact('torch', 'intra_op_threads')}/{source.fact('torch', 'inter_op_threads')}",
    }


def commit_info(source: Source) -> dict:
    return {"id": source.commit or "unversioned", "time": None, "author_time": None, "dirty": source.dirty,
            "project": "kvbench", "branch": source.branch or "(unknown)"}


def benchmark(cell: Cell, source: Source, options: dict, series: str | None = None) -> dict:
    """The cell's samples as `decode[...]`, or with `series` one series of its figures' per-sample values."""
    param, test = f"{cell.mode}-{cell.length}", series or "decode"
    group = f"{cell.case}{'' if series is None else ' ' + series}, length {cell.length}"
    return {
        "group": group, "name": f"{test}[{param}]",
        "fullname": f"kvbench/{cell.case}::{test}[{param}]", "params": {"mode": cell.mode, "length": cell.length},
        "param": param, "extra_info": {key: value for key, value in cell_facts(cell, source).items() if value is not None},
        "options": options, "stats": sample_stats(cell.seconds if series is None else cell.series[series]),
    }


def document(sources: list[Source], options: dict) -> object:
    if len(sources) > 1:
        raise ValueError(f"pytest-benchmark JSON holds one run (one machine_info, commit_info and datetime); got "
                         f"{len(sources)} records: export each to its own file")
    (source,) = sources
    protocol = source.protocol
    run_options = {"disable_gc": True, "timer": protocol.get("clock", "time.perf_counter_ns"),
                   "min_rounds": protocol.get("repeats"), "max_time": protocol.get("max_seconds"), "min_time": None,
                   "warmup": bool(protocol.get("warmup"))}
    return {"machine_info": machine_info(source), "commit_info": commit_info(source),
            "benchmarks": [benchmark(cell, source, run_options, series) for cell in source.cells
                           for series in (None, *cell.series)],
            "datetime": source.created_utc.replace("Z", "+00:00"), "version": FORMAT_VERSION}
