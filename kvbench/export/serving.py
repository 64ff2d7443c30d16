"""A serving record (`kvbench run --trace`: a record whose workload is "serving") as the exporters see it, through
its RecordView: one Source whose
cells are its kinds, on the measures `kvbench compare` lines up (kvbench.report.comparison.serving.MEASURES).

Per kind, one cell `<case>/<kind>/<requests>`: the case names the preset, the model fields changed from it and
the serving work (trace lengths, arrivals, KV budget, reservation policy, prefix sharing), the length is the
trace's request count. Its samples are each rotation's replay seconds (the whole trace, first arrival to last
token); its speedup the output throughput ratio to the record's first kind, paired by rotation with the rerun
interval `kvbench report` prints. Its figures are the TTFT, TPOT, ITL and E2E percentiles of each replay, in
seconds: the median over rotations with the order-statistic interval of a median, and the per-rotation values.
Its quantities are what is not seconds: output tokens/s and requests/s, the KV waste fraction and preemptions.
"""

from __future__ import annotations

from kvbench.measure import stats
from kvbench.export.common import Cell, Quantity, Source, changed_fields, source_of
from kvbench.export.figures import Figure
from kvbench.record import RecordView
from kvbench.report.record.serving import summarise
from kvbench.report.comparison.serving import MEASURES, median_low_high, per_rotation, replayed

SAMPLE = "one whole trace replay: every request, from the first arrival to the last token"
THROUGHPUT_RATIO = "median over rotations of output tokens/s, this kind / the first kind, paired by rotation"


def serving_case(view: RecordView) -> str:
    """The preset, its changed fields and the serving work: two records of one case replayed the same work."""
    trace, budget, preset = view.serving.trace, view.serving.budget, view.run["preset"]
    spec = trace.get("spec") or {}
    parts = [preset, *changed_fields(preset, view.record["config"]),
             f"serving={spec.get('lengths', 'saved-trace')}", f"arrivals={trace.get('arrivals')}",
             f"budget={budget['bytes']}"]
    if budget.get("reserve"):
        parts.append(f"reserve={budget['reserve']}")
    if any(setting.get("share_prefix") for setting in view.serving.settings.values()):
        parts.append("share-prefix")
    return ",".join(parts)


def speedup_of(summary: dict, kind: str) -> stats.RatioEstimate | None:
    found = summary["ratios"].get(kind, {}).get("throughput")
    if not found:
        return None
    return stats.RatioEstimate(found["ratio"], found["low"], found["high"], found["pairs"], THROUGHPUT_RATIO,
                               "rerun")


def kind_cell(view: RecordView, kind: str, measured: dict[str, dict[int, float]], summary: dict) -> Cell:
    seconds = [kept["seconds"] for kept in view.serving.replays if kept["mode"] == kind]
    figures, series, quantities = [], {}, []
    for measure in MEASURES:
        if measure.name not in measured:
            continue
        values = list(measured[measure.name].values())
        median, low, high = median_low_high(values)
        if measure.unit == "s":
            figures.append(Figure(measure.name, measure.name, median, low, high,
                                  f"{measure.meaning}; median over rotations"))
            series[measure.name] = values
        else:
            quantities.append(Quantity(measure.name, measure.unit, median, low, high, values,
                                       measure.higher_is_better, f"{measure.meaning}; median over rotations"))
    baseline, checks = view.modes[0], view.serving.checks
    passed = bool(checks.get(kind, {}).get("passed"))
    median = stats.rerun_interval(stats.median_estimate(seconds, stats.BETWEEN_RUN["seconds"]))
    return Cell(serving_case(view), kind, len(view.serving.trace["requests"]), seconds, median,
                speedup_of(summary, kind), passed and bool(checks.get(baseline, {}).get("passed")), passed,
                baseline, SAMPLE, figures, series, quantities)


def serving_source(view: RecordView) -> Source:
    """The record's kinds as cells (kvbench.report.comparison.serving.replayed: it kept a replay)."""
    summary, measured = summarise(view), per_rotation(view)
    cells = [kind_cell(view, kind, measured[kind], summary) for kind in view.modes if kind in measured]
    return Source(view.source, view.environment.get("timestamp_utc", ""), view.status, view.environment,
                  view.protocol, cells)


def record_source(view: RecordView) -> Source:
    """Any record as the exporters and the record history read it: a serving record's kinds as its cells (ValueError
    when it kept no replay), every other workload's timed cells."""
    return source_of(view) if view.serving is None else serving_source(replayed(view))
