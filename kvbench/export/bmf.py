"""Bencher Metric Format (BMF): benchmark name -> measure -> {value, lower_value, upper_value}.

One benchmark per cell, `kvbench/<case>/<mode>/<length>`, with two measures:

  latency   Bencher's built-in measure (nanoseconds): the median seconds of one sample (a whole
            decode loop, a whole request, or a context's timed steps: Cell.sample),
            lower_value/upper_value its 95% rerun interval;
  speedup   a custom measure (x): baseline / mode with the record's 95% rerun interval, for cached
            modes whose check and the baseline's passed.

and one benchmark per figure of a request or contexts cell, `kvbench/<case>/<mode>/<length>/<figure>`
(ttft, tpot, itl_p50, itl_p90, itl_p99; step, first_step), each in the built-in `latency` measure so
that Bencher knows its unit (nanoseconds): the report's median with its 95% interval of a median, or
an ITL percentile alone (no interval).

A serving record's cell (kvbench.export.serving) adds its figures (ttft_p50 ... e2e_p99) the same way, and
its quantities as custom measures of the cell's benchmark, named by their unit: `output-tokens-per-second`,
`requests-per-second`, `waste-fraction` (KV memory reserved but unused, 0 to 1), `preemptions-count`, each
the median over rotations with its 95% interval of a median.

BMF has no field for samples, machines or commits: Bencher takes the testbed from `bencher run
--testbed` and the commit from `--hash`, so one file holds one machine's records.
"""

from __future__ import annotations

from kvbench.export.common import Source, finite, one_machine

LATENCY = "latency"  # Bencher's built-in measure, in nanoseconds
SPEEDUP = "speedup"
NANOSECONDS = 1e9


def metric(value: float, low: float | None, high: float | None, scale: float = 1.0) -> dict:
    if low is None:
        return {"value": finite(value * scale)}
    return {"value": finite(value * scale), "lower_value": finite(low * scale), "upper_value": finite(high * scale)}


def measure_name(name: str, unit: str) -> str:
    """A quantity's measure slug, naming its unit: "output-tokens-per-second", "waste-fraction"."""
    slug = name.replace("_", "-")
    return slug if unit.endswith("/s") else f"{slug}-{unit}"


def document(sources: list[Source], options: dict) -> object:
    one_machine(sources, "BMF", "Bencher takes the testbed from `bencher run --testbed`, not from the file")
    out: dict[str, dict] = {}
    for source in sources:
        for cell in source.cells:
            measures = {LATENCY: metric(cell.median.ratio, cell.median.low, cell.median.high, NANOSECONDS)}
            if cell.speedup is not None and cell.speedup_valid:
                measures[SPEEDUP] = metric(cell.speedup.ratio, cell.speedup.low, cell.speedup.high)
            measures.update({measure_name(q.name, q.unit): metric(q.value, q.low, q.high) for q in cell.quantities})
            out[f"kvbench/{cell.key}"] = measures
            for figure in cell.figures:
                out[f"kvbench/{cell.key}/{figure.name}"] = {
                    LATENCY: metric(figure.seconds, figure.low, figure.high, NANOSECONDS)}
    return out
