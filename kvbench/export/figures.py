"""What a request or contexts cell exports beside its samples: the figures `kvbench report` shows for it.

A request run's TTFT and TPOT (medians over its requests, each with the order-statistic interval
of a median) and its ITL percentiles (pooled over every step of every request, no interval); a
contexts run's steady-state step and its first step after the prefill (medians over samples, with
the same interval). Nothing is computed here: the numbers are kvbench.report.record.latency's rows, which
read kvbench.measure.latency, and each figure's per-sample values come from kvbench.measure.latency's per-sample
functions, so an exported TTFT is the report's TTFT.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.measure import latency
from kvbench.record import RecordView
from kvbench.report.record.latency import context_rows, latency_rows

MEDIAN_INTERVAL = ("95% order-statistic interval of the median over the samples (kvbench.stats.median_interval), "
                   "as `kvbench report` prints it")
MEANINGS = {
    "ttft": "time to first token: the prefill, up to the first token's logits; median over requests",
    "tpot": "time per output token after the first, (E2E - TTFT) / (N - 1) as vLLM defines it; median over requests",
    "itl": "inter-token latency: the {level}th percentile of every step of every request, pooled as vLLM pools them; "
           "no interval",
    "step": "steady-state decode step at this context: the mean of the run's timed steps after its warm-up steps; "
            "median over samples",
    "first_step": "the first decode step after the context's prefill, paid once per prompt; median over samples",
}


@dataclass(frozen=True)
class Figure:
    """One figure of a cell, in seconds, as the report shows it."""

    name: str  # "ttft", "tpot", "itl_p50", "itl_p90", "itl_p99", "step" or "first_step"
    series: str  # the name of the per-sample values it summarizes (Cell.series): "ttft", "tpot", "itl", ...
    seconds: float
    low: float | None  # its 95% interval (MEDIAN_INTERVAL); None for an ITL percentile
    high: float | None
    meaning: str

    @property
    def interval(self) -> str | None:
        return None if self.low is None else MEDIAN_INTERVAL


def sample_meaning(view: RecordView) -> str:
    """What the seconds of one sample of this record cover."""
    workload = view.workload
    if workload.is_request:
        return "one whole request, end to end: its prefill and every step"
    if workload.timed_window:
        return (f"the {workload.timed_steps} timed steps after the context's prefill and "
                f"{workload.warmup_steps} warm-up steps")
    if workload.kind == "contexts":
        return ("one decode step after the context's prefill, its cache's release timed with it (a record from "
                "before the timed window)")
    return "one whole decode loop"


def median_figure(name: str, entry: dict, series: str | None = None) -> Figure:
    return Figure(name, series or name, entry["median"], entry["low"], entry["high"], MEANINGS[name])


def request_figures(view: RecordView) -> dict[str, tuple[list[Figure], dict[str, list[float]]]]:
    """mode -> (its figures, their per-sample values) for a request run; empty for any other run."""
    out = {}
    for row in latency_rows(view):
        figures = [median_figure(name, row.figures[name]) for name in ("ttft", "tpot") if name in row.figures]
        figures += [Figure(f"itl_p{level}", "itl", row.figures[f"itl_p{level}"], None, None,
                           MEANINGS["itl"].format(level=level))
                    for level in latency.ITL_PERCENTILES if f"itl_p{level}" in row.figures]
        repetitions = view.repetitions(row.mode, view.lengths[0])
        per_request = [latency.request_figures(rep, view.batch) for rep in repetitions]
        series = {name: [f[name] for f in per_request if f[name] is not None] for name in ("ttft", "tpot")}
        series["itl"] = [step for rep in repetitions for step in rep["step_seconds"]]
        out[row.mode] = (figures, {name: values for name, values in series.items() if values})
    return out


def context_figures(view: RecordView) -> dict[tuple[str, int], tuple[list[Figure], dict[str, list[float]]]]:
    """(mode, context) -> (its figures, their per-sample values) for a contexts run with a timed window."""
    out = {}
    for row in context_rows(view):
        warmup = view.workload.warmup_steps
        per_sample = [latency.context_figures(rep, warmup) for rep in view.repetitions(row.mode, row.context)]
        out[(row.mode, row.context)] = ([median_figure(name, row.figures[name]) for name in ("step", "first_step")],
                                        {name: [f[name] for f in per_sample] for name in ("step", "first_step")})
    return out


def figures_by_cell(view: RecordView) -> dict[tuple[str, int], tuple[list[Figure], dict[str, list[float]]]]:
    """(mode, length) -> the figures the report shows for that cell and their per-sample values."""
    by_mode = request_figures(view)
    return {**{(mode, view.lengths[0]): value for mode, value in by_mode.items()}, **context_figures(view)}


def figure_facts(figures: list[Figure]) -> dict:
    """The flat facts of a cell's figures, for the formats' free-form fields: seconds, interval, meaning."""
    facts = {}
    for figure in figures:
        facts[f"{figure.name}_s"] = figure.seconds
        if figure.low is not None:
            facts.update({f"{figure.name}_low_s": figure.low, f"{figure.name}_high_s": figure.high})
        facts[f"{figure.name}_meaning"] = figure.meaning
    if any(figure.interval for figure in figures):
        facts["figure_interval"] = MEDIAN_INTERVAL
    return facts
