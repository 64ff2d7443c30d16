"""The report model: one pass over a record, computing everything a layout shows.

`build_report` turns a :class:`~kvbench.record.RecordView` into a `Report`: one `Row`
per measured (length, mode) cell with its spread, its speedup over the baseline with a
bootstrap interval, its bytes, check and marks; a scaling fit per mode; the per-step
profile. `kvbench run`'s table, `kvbench show` and `kvbench report` all lay out these
rows; statistics come from kvbench.stats.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvbench import stats
from kvbench.capture import summarize_environment
from kvbench.record import RecordView
from kvbench.stats import NOISY_SPREAD, PowerFit, RatioEstimate

MARKS = {  # name -> (symbol, meaning); every layout prints the legend for the marks it uses
    "failed": ("✗", "equivalence check failed: timed, but not a valid speedup"),
    "noisy": ("~", f"IQR/median above {NOISY_SPREAD:.0%}: spread too wide to trust the median"),
    "partial": ("†", "fewer repetitions than planned (interrupted run)"),
}


@dataclass(frozen=True)
class Row:
    """One (length, mode) cell: its spread, its speedup over the baseline, bytes and check."""

    length: int
    mode: str
    samples: int
    planned: int
    median: float
    q1: float
    q3: float
    is_baseline: bool
    speedup: RatioEstimate | None
    speedup_valid: bool
    check: dict | None
    memory: dict | None
    marks: tuple[str, ...]

    @property
    def spread(self) -> float:
        return stats.spread(self.q1, self.q3, self.median)

    @property
    def per_token(self) -> float:
        return self.median / self.length

    @property
    def failed(self) -> bool:
        return self.check is not None and not self.check["passed"]

    @property
    def invalid_speedup(self) -> bool:
        return self.speedup is not None and not self.speedup_valid


@dataclass(frozen=True)
class Profile:
    """Per-step durations of one loop at one length, smoothed, with crossovers vs the baseline."""

    length: int
    seconds: dict[str, list[float]]
    smoothed: dict[str, list[float]]
    crossovers: dict[str, int | None]  # cached mode -> first step from which it stays faster
    final_speedups: dict[str, float]  # cached mode -> smoothed baseline / cached at the last step
    window: int


@dataclass
class Report:
    title: str
    source: str
    status: str
    created_utc: str
    command: list[str]
    baseline: str
    environment: dict  # short name -> value (capture.summarize_environment plus the commit)
    rows: list[Row]
    fits: dict[str, PowerFit | None]
    profile: Profile | None
    missing: list[tuple[str, int]]  # cells of the planned grid without any repetition
    notes: list[str] = field(default_factory=list)
    confidence: float = stats.CONFIDENCE

    @property
    def complete(self) -> bool:
        return self.status == "complete"

    @property
    def modes(self) -> list[str]:
        return list(dict.fromkeys(row.mode for row in self.rows))

    def rows_of(self, mode: str) -> list[Row]:
        return [row for row in self.rows if row.mode == mode]

    def marks_used(self) -> list[str]:
        return [name for name in MARKS if any(name in row.marks for row in self.rows)]


def environment_facts(environment: dict) -> dict:
    facts = summarize_environment(environment)
    section = environment.get("kvbench")
    if isinstance(section, dict) and section.get("git_commit"):
        facts["kvbench_commit"] = section["git_commit"][:12] + (" (dirty)" if section.get("git_dirty") else "")
    else:
        facts["kvbench_commit"] = None
    return facts


def environment_line(facts: dict) -> str:
    parts = []
    if facts.get("python_version"):
        parts.append(f"Python {facts['python_version']}")
    if facts.get("torch_version"):
        parts.append(f"torch {facts['torch_version']}")
    if facts.get("cpu_brand"):
        parts.append(facts["cpu_brand"] + (f" ({facts['cpu_capability']})" if facts.get("cpu_capability") else ""))
    if facts.get("intra_op_threads") is not None:
        parts.append(f"{facts['intra_op_threads']}/{facts.get('inter_op_threads')} intra/inter-op threads")
    if facts.get("logical_cores"):
        parts.append(f"{facts['logical_cores']} logical cores")
    if facts.get("kvbench_commit"):
        parts.append(f"kvbench {facts['kvbench_commit']}")
    return " · ".join(parts) if parts else "environment not captured"


def title_of(view: RecordView) -> str:
    run = view.run
    return (f"kvbench {run['preset']}: batch {run['batch']}, {view.config['dtype']}, "
            f"{run['threads']} thread(s), {run['repeats']} repetitions")


def build_rows(view: RecordView, seed: int = stats.SEED, resamples: int = stats.RESAMPLES) -> list[Row]:
    """One row per measured cell, in the run's grid order."""
    baseline = view.baseline
    rows = []
    for mode, length in view.cells():
        cell, samples = view.summary(mode, length), view.samples(mode, length)
        marks = []
        if not view.passed(mode, length):
            marks.append("failed")
        if stats.spread(cell["q1"], cell["q3"], cell["median"]) > NOISY_SPREAD:
            marks.append("noisy")
        if len(samples) < view.planned_repeats:
            marks.append("partial")
        speedup = None
        base = view.samples(baseline, length)
        if mode != baseline and base:
            speedup = stats.paired_speedup(base, samples, seed=seed, key=(mode, length), resamples=resamples)
        rows.append(Row(
            length=length, mode=mode, samples=len(samples), planned=view.planned_repeats,
            median=cell["median"], q1=cell["q1"], q3=cell["q3"], is_baseline=mode == baseline,
            speedup=speedup, speedup_valid=view.passed(mode, length) and view.passed(baseline, length),
            check=view.check(mode, length), memory=view.memory(mode, length), marks=tuple(marks),
        ))
    return rows


def build_profile(view: RecordView, window: int = stats.RUNNING_WINDOW) -> Profile | None:
    entries = view.per_step
    if not entries:
        return None
    length, baseline = entries[0]["length"], view.baseline
    seconds = {e["mode"]: list(e["seconds"]) for e in entries if e["length"] == length}
    smoothed = {mode: stats.running_median(values, window) for mode, values in seconds.items()}
    crossovers, finals = {}, {}
    if baseline in seconds:
        for mode, values in seconds.items():
            if mode != baseline:
                crossovers[mode] = stats.crossover_step(seconds[baseline], values, window)
                finals[mode] = smoothed[baseline][-1] / smoothed[mode][-1]
    return Profile(length, seconds, smoothed, crossovers, finals, window)


def build_report(view: RecordView, seed: int = stats.SEED, resamples: int = stats.RESAMPLES) -> Report:
    """Everything a layout needs, computed once from a validated record."""
    rows = build_rows(view, seed, resamples)
    fits = {}
    for mode in view.modes:
        mine = [row for row in rows if row.mode == mode]
        if mine:
            fits[mode] = stats.fit_power_law([r.length for r in mine], [r.median for r in mine])
    measured = set(view.cells())
    report = Report(
        title=title_of(view), source=view.source, status=view.status, created_utc=view.created_utc,
        command=view.command, baseline=view.baseline, environment=environment_facts(view.environment),
        rows=rows, fits=fits, profile=build_profile(view), missing=[c for c in view.grid() if c not in measured],
    )
    if not report.complete:
        report.notes.append("INCOMPLETE record: the run was interrupted; only completed repetitions are shown.")
    if report.missing:
        report.notes.append("not measured: " + ", ".join(f"{m} at {n}" for m, n in report.missing))
    if view.baseline not in view.modes:
        report.notes.append(f"no {view.baseline!r} baseline in this record: no speedups")
    if any(r.speedup is not None and r.speedup.pairs < min(r.samples, len(view.samples(view.baseline, r.length)))
           for r in rows):
        report.notes.append("some speedups use only the repetitions both modes completed")
    return report
