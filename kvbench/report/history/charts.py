"""The history model: asv's results across commits, per machine, judged by kvbench's rules.

`build_history(results_dir)` reads every result file under ``<results_dir>/<machine>/`` as kvbench reads
records (kvbench.report.history.asvfile: regular files of bounded size, every field checked) and the kvbench capture
beside each (kvbench.asvtools), and
returns one `Chart` per benchmark and parameter combination: one series per machine, a point per
commit with its 95% confidence interval, and a `Step` between consecutive commits of a machine
judged by kvbench compare's `change` (minimum detectable effect, within noise, the factor), never
by medians alone. Intervals come from what asv kept:

  time_*         the order-statistic interval of the median of asv's samples (`--record-samples`),
                 widened by the between-run allowance for seconds, as `kvbench compare` judges times;
  track_speedup  the interval the benchmark wrote into the capture, a rerun interval turned back into
                 the confidence interval it was widened from; a drop in speedup is "slower";
  anything else  a value without an interval: plotted, not judged.

An `EnvironmentMark` is placed where the captured environment of one machine differs between two
consecutive commits beyond the informational facts (report.differences ranks them).
"""

from __future__ import annotations

import ast
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.measure import stats
from kvbench.asvtools import ASV_METADATA_FILES, AsvToolError, capture_path_for_result, load_capture
from kvbench.report.history.asvfile import AsvResult, Checker, benchmark_metadata, load_result
from kvbench.report.comparison.compare import ALPHA, FACTOR, Change, change
from kvbench.report.comparison.differences import INFORMATIONAL, Difference, environment_diff
from kvbench.measure.stats import RatioEstimate

SPEEDUP_BENCHMARK = "track_speedup"


@dataclass(frozen=True)
class Commit:
    hash: str
    date: int | None  # asv's commit date, ms since the epoch


@dataclass(frozen=True)
class Point:
    machine: str
    commit: str
    value: float | None  # None: the benchmark failed or was skipped at this commit
    estimate: RatioEstimate | None  # the value with its 95% confidence interval; None without one
    samples: int = 0
    note: str = ""


NOT_JUDGED = "not judged"


@dataclass(frozen=True)
class Step:
    machine: str
    old: str
    new: str
    judged: Change | None  # None: one side has no interval
    reason: str = ""  # why it was not judged
    # What `judged` divides, named wherever its ratio is shown: a time's NEW / OLD, or a speedup's OLD / NEW (both
    # above 1 when NEW is slower, so a fall in speedup from 1.6 to 0.665 reads 2.41, not 0.42)
    quantity: str = "time new/old"
    values: tuple[float, float] | None = None  # the two points' values, old and new

    @property
    def verdict(self) -> str:
        return self.judged.verdict if self.judged else NOT_JUDGED


@dataclass(frozen=True)
class EnvironmentMark:
    machine: str
    old: str
    new: str
    differences: tuple[Difference, ...]


@dataclass
class Chart:
    benchmark: str
    label: str  # the parameter combination, e.g. "mode='static', length=64"
    unit: str
    higher_is_better: bool
    series: dict[str, list[Point]]  # machine -> points in commit order
    steps: list[Step] = field(default_factory=list)
    quantity: str | None = None  # what a step's ratio divides (Step.quantity); None: asv's time or track_speedup

    @property
    def title(self) -> str:
        return f"{self.benchmark} ({self.label})" if self.label else self.benchmark


@dataclass
class History:
    results_dir: str
    machines: list[str]
    commits: list[Commit]
    charts: list[Chart]
    marks: list[EnvironmentMark]
    factor: float
    alpha: float
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Run:
    """One asv result file with the capture beside it."""

    machine: str
    path: Path
    results: AsvResult
    capture: dict | None

    @property
    def commit(self) -> str:
        return self.results.commit_hash


def read_runs(results_dir: Path) -> tuple[list[Run], list[str]]:
    """Every result file of every machine folder (one holding machine.json), and notes on what is missing."""
    if not results_dir.is_dir():
        raise ValueError(f"{results_dir}: not a directory; expected asv's results directory (e.g. results/asv)")
    machines = asv_machines(results_dir)
    runs, notes = [], []
    for machine in machines:
        for path in sorted(machine.glob("*.json")):
            if path.name in ASV_METADATA_FILES:
                continue
            results = load_result(path)
            try:
                capture = load_capture(capture_path_for_result(path))
                check_speedup_section(capture, capture_path_for_result(path))
            except AsvToolError as error:
                capture = None
                notes.append(f"no environment capture for {machine.name}/{path.name}: {error}")
            runs.append(Run(machine.name, path, results, capture))
    if not runs:
        raise ValueError(f"{results_dir}: no asv result files; expected {results_dir}/<machine>/machine.json "
                         "beside <commit>-<environment>.json files")
    return runs, notes


def asv_machines(results_dir: Path) -> list[Path]:
    """asv's machine folders of a results directory (each holds machine.json); none in a folder of records."""
    if not results_dir.is_dir():
        return []
    return sorted(d for d in results_dir.iterdir() if d.is_dir() and (d / "machine.json").is_file())


def check_speedup_section(capture: dict, path: Path) -> None:
    """The intervals track_speedup wrote into a capture ("<model>@<kind>@<length>" -> speedup, low, high, ...):
    positive numbers in order, so that turning them back into a confidence interval is defined."""
    check = Checker(path)
    section = check.mapping(capture.get(SPEEDUP_BENCHMARK) or {}, SPEEDUP_BENCHMARK)
    for key, entry in section.items():
        where = f"{SPEEDUP_BENCHMARK}/{key}"
        entry = check.mapping(entry, where)
        speedup, low, high = (check.number(entry.get(name), f"{where}/{name}") for name in ("speedup", "low", "high"))
        if not 0 < low <= speedup <= high:
            raise AsvToolError(f"{path}: {where}: expected 0 < low <= speedup <= high, got {low!r}, {speedup!r}, "
                               f"{high!r}")
        check.number(entry.get("rotations"), f"{where}/rotations", optional=True, low=0)
        for name in ("estimator", "interval"):
            check.text(entry.get(name), f"{where}/{name}", optional=True)


def commit_order(runs: list[Run]) -> list[Commit]:
    """Commits by asv's commit date; commits of the same second by when they were first benchmarked."""
    dates: dict[str, int | None] = {}
    benchmarked: dict[str, float] = {}
    for run in runs:
        dates.setdefault(run.commit, run.results.date)
        started = min((b.started_at for b in run.results.benchmarks.values() if b.started_at is not None),
                      default=math.inf)
        benchmarked[run.commit] = min(benchmarked.get(run.commit, math.inf), started)
    order = sorted(dates, key=lambda h: (dates[h] is None, dates[h] or 0, benchmarked[h], h))
    return [Commit(h, dates[h]) for h in order]


def parameter_label(names: list[str], combination: tuple) -> str:
    return ", ".join(f"{name}={value}" for name, value in zip(names, combination))


def speedup_estimate(run: Run, combination: tuple) -> RatioEstimate | None:
    """track_speedup's interval from the capture (its parameters joined by "@": "<model>@<kind>@<length>", or
    "<kind>@<length>" before the model parameter), as a confidence interval."""
    section = (run.capture or {}).get(SPEEDUP_BENCHMARK) or {}
    try:
        key = "@".join(str(ast.literal_eval(value)) for value in combination)
    except (ValueError, SyntaxError, MemoryError, RecursionError):  # Python's parser gives up on "-" * 100_000 + "1"
        return None
    entry = section.get(key)  # checked by check_speedup_section
    if entry is None:
        return None
    estimate = RatioEstimate(entry["speedup"], entry["low"], entry["high"], int(entry.get("rotations") or 0),
                             str(entry.get("estimator")), str(entry.get("interval")))
    return stats.confidence_from_rerun(estimate) if estimate.interval.startswith("rerun") else estimate


def point_of(run: Run, name: str, kind: str, combination: tuple, value, samples) -> Point:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return Point(run.machine, run.commit, None, None, note="failed" if value is None else "skipped")
    value = float(value)
    if name.endswith(SPEEDUP_BENCHMARK):
        estimate = speedup_estimate(run, combination)
        return Point(run.machine, run.commit, value, estimate, estimate.pairs if estimate else 0,
                     "" if estimate else "no interval in the capture")
    kept = [s for s in samples or [] if s is not None]
    if kind == "time" and any(s <= 0 for s in kept):
        raise AsvToolError(f"{run.path}: results/{name}/samples: expected positive seconds, got {min(kept)!r}")
    if kind == "time" and kept:
        return Point(run.machine, run.commit, value, stats.median_estimate(kept, stats.BETWEEN_RUN["seconds"]),
                     len(kept))
    return Point(run.machine, run.commit, value, None,
                 note="asv kept no samples (run with --record-samples)" if kind == "time" else "a value without interval")


def judge_steps(chart: Chart, factor: float, alpha: float) -> None:
    for machine, points in chart.series.items():
        measured = [p for p in points if p.value is not None]
        for old, new in zip(measured, measured[1:]):
            if old.estimate is None or new.estimate is None:
                chart.steps.append(Step(machine, old.commit, new.commit, None, old.note or new.note))
                continue
            judged = change(old.estimate, new.estimate, factor=factor, alpha=alpha, invert=chart.higher_is_better)
            quantity = chart.quantity or ("speedup old/new" if chart.higher_is_better else "time new/old")
            chart.steps.append(Step(machine, old.commit, new.commit, judged, quantity=quantity,
                                    values=(old.value, new.value)))


def build_charts(runs: list[Run], commits: list[Commit], meta: dict, factor: float, alpha: float) -> list[Chart]:
    order = {commit.hash: i for i, commit in enumerate(commits)}
    charts: dict[tuple[str, tuple], Chart] = {}
    for run in sorted(runs, key=lambda r: (r.machine, order[r.commit])):
        for name, benchmark in sorted(run.results.benchmarks.items()):
            info = meta.get(name, {})
            names = info.get("param_names") or [f"param{i}" for i in range(len(benchmark.params))]
            for combo, value, sample in zip(benchmark.combinations, benchmark.values, benchmark.samples):
                key = (name, combo)
                if key not in charts:
                    charts[key] = Chart(name, parameter_label(names, combo), info.get("unit", ""),
                                        name.endswith(SPEEDUP_BENCHMARK), {})
                point = point_of(run, name, info.get("type", "time"), combo, value, sample)
                charts[key].series.setdefault(run.machine, []).append(point)
    measured = [charts[key] for key in sorted(charts)
                if any(p.value is not None for points in charts[key].series.values() for p in points)]
    for chart in measured:
        judge_steps(chart, factor, alpha)
    return measured


def environment_marks(runs: list[Run], commits: list[Commit]) -> list[EnvironmentMark]:
    """Per machine, consecutive commits whose captures differ in a fact ranked above informational. A run is
    anything with a machine, a commit and a capture holding the environment: asv's, or a kvbench record's
    (kvbench.export.history)."""
    order = {commit.hash: i for i, commit in enumerate(commits)}
    marks = []
    for machine, group in itertools.groupby(sorted(runs, key=lambda r: (r.machine, order[r.commit])),
                                            key=lambda r: r.machine):
        captured = [run for run in group if run.capture is not None]
        for old, new in zip(captured, captured[1:]):
            differences = [d for d in environment_diff(old.capture["environment"], new.capture["environment"])
                           if d.rank != INFORMATIONAL]
            if differences:
                marks.append(EnvironmentMark(machine, old.commit, new.commit, tuple(differences)))
    return marks


def build_history(results_dir: Path | str, *, factor: float = FACTOR, alpha: float = ALPHA) -> History:
    results_dir = Path(results_dir)
    runs, notes = read_runs(results_dir)
    commits = commit_order(runs)
    charts = build_charts(runs, commits, benchmark_metadata(results_dir), factor, alpha)
    return History(str(results_dir), sorted({run.machine for run in runs}), commits, charts,
                   environment_marks(runs, commits), factor, alpha, notes)
