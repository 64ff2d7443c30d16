"""Bencher Metric Format (BMF): benchmark name -> measure -> {value, lower_value, upper_value}.

One benchmark per cell, `kvbench/<workload>/<mode>/<length>`, with two measures:

  latency   Bencher's built-in measure (nanoseconds): the median seconds of one whole decode loop,
            lower_value/upper_value its 95% rerun interval;
  speedup   a custom measure (x): baseline / mode with the record's 95% rerun interval, for cached
            modes whose check and the baseline's passed.

BMF has no field for samples, machines or commits: Bencher takes the testbed from `bencher run
--testbed` and the commit from `--hash`, so one file holds one machine's records.
"""

from __future__ import annotations

from kvbench.export.common import Source, finite, one_machine

LATENCY = "latency"  # Bencher's built-in measure, in nanoseconds
SPEEDUP = "speedup"
NANOSECONDS = 1e9


def metric(value: float, low: float, high: float, scale: float = 1.0) -> dict:
    return {"value": finite(value * scale), "lower_value": finite(low * scale), "upper_value": finite(high * scale)}


def document(sources: list[Source], options: dict) -> object:
    one_machine(sources, "BMF", "Bencher takes the testbed from `bencher run --testbed`, not from the file")
    out: dict[str, dict] = {}
    for source in sources:
        for cell in source.cells:
            measures = {LATENCY: metric(cell.median.ratio, cell.median.low, cell.median.high, NANOSECONDS)}
            if cell.speedup is not None and cell.speedup_valid:
                measures[SPEEDUP] = metric(cell.speedup.ratio, cell.speedup.low, cell.speedup.high)
            out[f"kvbench/{cell.key}"] = measures
    return out
