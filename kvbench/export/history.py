"""kvbench records across commits, as the history page's charts: `kvbench history DIR` when DIR holds records.

Every record under DIR, whatever its workload (a loop, a request, contexts, a serving run), is read as the
exporters read it: its RecordView made a `Source` (kvbench.export.common; a serving record's kinds are its
cells, kvbench.export.serving), so one code path charts them all. Per cell (`Cell.key`: the case, the mode, the
length or a serving run's request count) a chart per measure: a sample's median seconds and the speedup, each
figure (TTFT, TPOT, a context's steps); for a serving kind the measures `kvbench compare` judges it by (its
replays' percentiles, tokens/s, waste). Every point has the 95% confidence interval its record gives (a rerun
interval turned back into the confidence interval it was widened from). Each step between consecutive commits
of one machine is judged by compare's rules: a loop's, a request's or a contexts cell's by `change` on the two
intervals (as asv's history is, kvbench.report.history.charts); a serving kind's by `kvbench compare` of the two
records, its A/A floor and Holm's correction over the measures included (kvbench.report.comparison.serving).
The machine is the hostname a record captured, the commit its kvbench commit ("+dirty" for an uncommitted tree),
the order that of the records' creation. Where several records of one commit on one machine measured one cell,
the newest stands for it; the page notes the others.
"""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import dataclass
from pathlib import Path

from kvbench.export.common import Cell, Source
from kvbench.export.serving import record_source
from kvbench.measure.stats import RatioEstimate, confidence_from_rerun
from kvbench.record import RecordView
from kvbench.report.comparison.compare import ALPHA, FACTOR
from kvbench.report.comparison.serving import compare_serving, same_trace_problem
from kvbench.report.comparison.verdicts import FASTER, SLOWER
from kvbench.report.history.charts import Chart, Commit, History, Point, Step, environment_marks, judge_steps

NO_COMMIT = "no-commit"  # a record captured outside a git checkout


@dataclass(frozen=True)
class Captured:
    """A record as environment_marks reads a run: its machine, its commit and its captured environment."""

    machine: str
    commit: str
    capture: dict


@dataclass(frozen=True)
class Series:
    """What one chart plots: its benchmark and label, unit, direction and how its steps' ratio is named."""

    benchmark: str
    label: str
    unit: str
    higher_is_better: bool
    quantity: str


def commit_of(source: Source) -> str:
    return (source.commit or NO_COMMIT) + ("+dirty" if source.dirty else "")


def created_ms(source: Source) -> int | None:
    try:
        moment = datetime.datetime.fromisoformat(source.created_utc)
    except (TypeError, ValueError):
        return None
    return round(moment.replace(tzinfo=moment.tzinfo or datetime.timezone.utc).timestamp() * 1000)


def read_sources(directory: Path) -> tuple[list[tuple[Source, RecordView]], list[str]]:
    """Every record under `directory` as a Source beside its view, oldest first, and a note for each file that is
    not one."""
    if not directory.is_dir():
        raise ValueError(f"{directory}: not a directory; expected asv's results directory or a folder of kvbench "
                         "records")
    sources, notes = [], []
    for path in sorted(p for p in directory.rglob("*.json") if p.is_file()):
        try:
            view = RecordView.load(path)
            sources.append((record_source(view), view))
        except (ValueError, OSError) as error:
            notes.append(f"not a kvbench record with a timed cell, left out: {error}")
    if not sources:
        raise ValueError(f"{directory}: no asv result files and no kvbench record; expected "
                         f"{directory}/<machine>/machine.json beside asv's results, or records (*.json)")
    oldest_first = lambda pair: (created_ms(pair[0]) is None, created_ms(pair[0]) or 0, pair[0].path)  # noqa: E731
    return sorted(sources, key=oldest_first), notes


def measured(cell: Cell, serving: bool = False) -> list[tuple[Series, float, RatioEstimate | None, int]]:
    """Every measure of a cell as a chart's point: (series, value, its confidence interval or None, samples). A
    serving kind's are the measures `kvbench compare` judges it by (its figures and quantities)."""
    samples = len(cell.seconds)
    out = [] if serving else [(Series("median seconds", cell.key, "seconds", False, "time new/old"), cell.median.ratio,
                                      confidence_from_rerun(cell.median), samples)]
    if cell.speedup is not None and cell.speedup_valid and not serving:
        out.append((Series(f"speedup over {cell.baseline}", cell.key, "x", True, "speedup old/new"),
                    cell.speedup.ratio, confidence_from_rerun(cell.speedup), cell.speedup.pairs))
    for figure in cell.figures:
        estimate = None if figure.low is None else RatioEstimate(figure.seconds, figure.low, figure.high, samples,
                                                                 "median", "order statistics")
        out.append((Series(figure.name, cell.key, "seconds", False, "time new/old"), figure.seconds, estimate, samples))
    for quantity in cell.quantities:
        judged = 0 < quantity.low <= quantity.value <= quantity.high  # a count of 0 has no ratio to judge
        estimate = RatioEstimate(quantity.value, quantity.low, quantity.high, len(quantity.values), "median",
                                 "order statistics") if judged else None
        direction = "old/new" if quantity.higher_is_better else "new/old"
        out.append((Series(quantity.name, cell.key, quantity.unit, quantity.higher_is_better,
                           f"{quantity.name} {direction}"), quantity.value, estimate, len(quantity.values)))
    return out


@dataclass(frozen=True)
class Stood:
    """The record a chart's point comes from, and the cell's mode in it."""

    source: Source
    view: RecordView
    mode: str


def serving_step(machine: str, old: Point, new: Point, stood: tuple[Stood, Stood], measure: str, factor: float,
                 alpha: float, comparisons: dict) -> Step:
    """A serving measure's step as `kvbench compare` judges the two records: its change held to the larger A/A
    floor of the two and to Holm's correction over every measure they share (kvbench.report.comparison.serving)."""
    before, after = stood
    problem = same_trace_problem(before.view, after.view)
    if problem:
        return Step(machine, old.commit, new.commit, None, f"not the same work: {problem}")
    pair = (before.view.source, after.view.source)
    if pair not in comparisons:
        comparisons[pair] = compare_serving(before.view, after.view, factor=factor, alpha=alpha)
    found = next((c for c in comparisons[pair].changes if c.kind == after.mode and c.measure.name == measure), None)
    if found is None or found.change is None:
        return Step(machine, old.commit, new.commit, None, "no ratio: a side is zero or missing")
    verdict = {"worse": SLOWER, "better": FASTER}.get(found.verdict, found.verdict)  # a step's words are the page's
    return Step(machine, old.commit, new.commit, dataclasses.replace(found.change, verdict=verdict),
                quantity=f"{measure} new/old", values=(old.value, new.value))


def build_record_history(directory: Path | str, *, factor: float = FACTOR, alpha: float = ALPHA) -> History:
    directory = Path(directory)
    sources, notes = read_sources(directory)
    commits: dict[str, Commit] = {}
    for source, _ in sources:  # oldest first: a commit's date is its first record's
        commits.setdefault(commit_of(source), Commit(commit_of(source), created_ms(source)))
    order = {commit: index for index, commit in enumerate(commits)}
    charts: dict[tuple[str, str], Chart] = {}
    points: dict[tuple[str, str], dict[str, dict[str, Point]]] = {}  # chart -> machine -> commit -> point
    stood_for: dict[tuple[str, str, str], Stood] = {}  # (machine, commit, cell) -> the record its points come from
    serving: set[tuple[str, str]] = set()  # the charts of serving kinds
    superseded: dict[tuple[str, str], int] = {}  # (older record, newer record) -> cells the newer stands for
    for source, view in sources:  # oldest first: of one commit's records on one machine, the newest cell stands
        commit = commit_of(source)
        for cell in source.cells:
            where = (source.machine, commit, cell.key)
            if where in stood_for:
                pair = (stood_for[where].source.path, source.path)
                superseded[pair] = superseded.get(pair, 0) + 1
            stood_for[where] = Stood(source, view, cell.mode)
            for series, value, estimate, samples in measured(cell, serving=view.serving is not None):
                key = (series.label, series.benchmark)
                charts.setdefault(key, Chart(series.benchmark, series.label, series.unit, series.higher_is_better,
                                             {}, quantity=series.quantity))
                if view.serving is not None:
                    serving.add(key)
                note = "" if estimate is not None else "no interval to judge it by"
                points.setdefault(key, {}).setdefault(source.machine, {})[commit] = Point(
                    source.machine, commit, value, estimate, samples, note)
    comparisons: dict = {}
    for key, chart in sorted(charts.items()):
        for machine, by_commit in sorted(points[key].items()):
            chart.series[machine] = [by_commit[commit] for commit in sorted(by_commit, key=order.__getitem__)]
        if key not in serving:
            judge_steps(chart, factor, alpha)  # compare's change on the two intervals, as asv's history judges
            continue
        for machine, series in chart.series.items():
            chart.steps += [serving_step(machine, old, new, (stood_for[(machine, old.commit, chart.label)],
                                                             stood_for[(machine, new.commit, chart.label)]),
                                         chart.benchmark, factor, alpha, comparisons)
                            for old, new in zip(series, series[1:])]
    notes += [f"{old}: {count} cell(s) measured again at the same commit on the same machine by {new}, which "
              "stands for them" for (old, new), count in superseded.items()]
    captured = [Captured(source.machine, commit_of(source), {"environment": source.environment})
                for source, _ in sources]
    return History(str(directory), sorted({source.machine for source, _ in sources}), list(commits.values()),
                   [charts[key] for key in sorted(charts)], environment_marks(captured, list(commits.values())),
                   factor, alpha, notes)
