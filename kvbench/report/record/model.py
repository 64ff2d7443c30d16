"""The report model: one pass over a record, computing everything a layout shows.

`build_report` turns a :class:`~kvbench.record.RecordView` into a `Report`: one `Row`
per measured (length, mode) cell with its spread, its speedup over the baseline with the
interval the record's run used (named by `interval_name`), its bytes, check and marks, its
times on the clock of its speedup; a scaling fit per mode (three lengths or more); the per-step
profile. kvbench.report.record.sections arranges it for `kvbench run`'s table, `kvbench show`
and `kvbench report`; statistics come from kvbench.measure.stats.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from kvbench.measure import stats
from kvbench.measure.capture import summarize_environment
from kvbench.config import PlainConfig
from kvbench.kinds import QUANTIZED_SHARE_FLOOR, expected_cache_bytes
from kvbench.modes import changes_representation
from kvbench.record import RecordView, cell_statistics
from kvbench.report.format import interval_name
from kvbench.report.record import precision
from kvbench.report.record.precision import LengthRow, clock_note, sampling_rows, title_of, undisturbed_pairs
from kvbench.report.record.needle import needle_summary
from kvbench.report.record.quality import model_sentence, quality_note, quality_rows
from kvbench.report.record.latency import (
    ContextRow,
    context_rows,
    context_sentence,
    LatencyRow,
    LimitRow,
    latency_rows,
    latency_sentence,
    limit_rows,
    limit_sentence,
    peer_rows,
    step_quartiles,
    timer_sentence,
)
from kvbench.measure.stats import NOISY_SPREAD, PowerFit, RatioEstimate
from kvbench.measure.telemetry import tally

MARKS = {  # name -> (symbol, meaning); every layout prints the legend for the marks it uses
    "failed": ("✗", "equivalence check failed: timed, but not a valid speedup"),
    "noisy": ("~", f"IQR/median above {NOISY_SPREAD:.0%}: spread too wide to trust the median"),
    "partial": ("†", "fewer repetitions than planned (interrupted run)"),
    "trend": ("↗", f"its samples trend over the run (Kendall p < {stats.TREND_P}, change of "
                   f"{stats.TREND_SIZE:.0%} or more): warm-up not over, or the machine changed"),
    "disturbed": ("⚡", "its speedup without the disturbed samples differs by more than half its interval"),
    "unquantized": ("∅", f"a quantized kind that held under {QUANTIZED_SHARE_FLOOR:.0%} of its positions quantized at "
                         "the end (the rest in its float residual): its bytes and drift there are mostly float's"),
}


@dataclass(frozen=True)
class Timing:
    """A cell's median and quartiles on one clock (seconds per sample)."""

    median: float
    q1: float
    q3: float

    @property
    def spread(self) -> float:
        return stats.spread(self.q1, self.q3, self.median)


@dataclass(frozen=True)
class Row:
    """One (length, mode) cell: its spread, its speedup over the baseline, bytes and check.

    median, q1 and q3 are wall time (the record's summary); `timed` holds the same on `clock`, the
    clock its speedup was estimated on, which is what the tables show beside that speedup."""

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
    undisturbed: RatioEstimate | None = None  # the speedup from the pairs neither side of which was disturbed
    clock: str = "wall"  # kvbench.measure.estimation.CLOCKS: the clock of its speedup and of `timed`
    clocked: Timing | None = None  # median and quartiles on `clock` when it is not wall time
    per_sample: int = 0  # tokens (a loop) or steps (a contexts run) one sample covers; 0: the length
    quantized: int | None = None  # a quantized kind's positions held quantized at the end (of `length`)

    @property
    def spread(self) -> float:
        return stats.spread(self.q1, self.q3, self.median)

    @property
    def timed(self) -> Timing:
        return self.clocked or Timing(self.median, self.q1, self.q3)

    @property
    def unit_seconds(self) -> float:
        """The per-workload figure on the row's clock: seconds per token of a loop, per step of a contexts run."""
        return self.timed.median / (self.per_sample or self.length)

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


@dataclass(frozen=True)
class Noise:
    """What the telemetry saw over the whole run."""

    samples: int
    disturbed: int
    reasons: dict[str, int]  # reason -> samples
    telemetry_seconds: float | None  # per sample, outside its timed region
    shortest_sample: float
    unavailable: dict[str, str]


@dataclass(frozen=True)
class Tradeoff:
    """One kind at one length: what it keeps, how far it drifts, what it costs per token (per step at a context)
    on the clock of its speedup, as the timing table shows it."""

    mode: str
    length: int
    nbytes: int
    full_precision_bytes: int  # the exact float formula at this length: what the kind is saving against
    check: dict | None
    unit_seconds: float  # Row.unit_seconds: on `clock`
    speedup: RatioEstimate | None
    quantized: int | None = None  # a quantized kind's positions held quantized, of `length`
    clock: str = "wall"

    @property
    def bytes_ratio(self) -> float:
        return self.nbytes / self.full_precision_bytes if self.full_precision_bytes else float("nan")


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
    estimator: str = "ratio-of-medians"  # schema-1 records: the ratio of medians with a paired bootstrap
    interval: str = "percentile bootstrap"  # the speedups' interval: kvbench.measure.stats.INTERVALS, or schema 1's
    control_interval: str = "percentile bootstrap"  # the A/A control's (kvbench.record.summary.control_interval)
    between_run: float = 0.0  # the speedup intervals' allowance for variation between runs
    sampling: list[LengthRow] = field(default_factory=list)
    control: str | None = None
    noise: Noise | None = None
    latency: list[LatencyRow] = field(default_factory=list)  # a request run's TTFT, TPOT, ITL (report.latency)
    workload: dict = field(default_factory=lambda: {"kind": "loop"})
    limits: list[LimitRow] = field(default_factory=list)  # each step against the machine's limits
    limits_note: str | None = None
    peers: list = field(default_factory=list)  # PeerRow: kvbench's fastest exact kind against transformers' caches
    latency_note: str | None = None
    step_latency: dict[str, list[tuple]] = field(default_factory=dict)  # a request's step quartiles, per position
    context_steps: list[ContextRow] = field(default_factory=list)  # a contexts run's steady and first steps
    context_note: str | None = None
    tradeoffs: list[Tradeoff] = field(default_factory=list)
    verdict: str | None = None  # the run's verdict line (kvbench.report.record.precision.verdict)
    quality: list = field(default_factory=list)  # QualityRow: what each mode did to a real model's text
    quality_note: str | None = None
    model_note: str | None = None  # a real model's weights and text
    needle: object = None  # kvbench.report.record.needle.Needle: retrieval of a needle, when the record has it

    @property
    def complete(self) -> bool:
        return self.status == "complete"

    @property
    def kind(self) -> str:
        """The workload: "loop", "request" or "contexts"."""
        return self.workload.get("kind", "loop")

    def clocks(self) -> list[str]:
        """The clocks of the rows' times and speedups, in the order of the lengths: one table each (the timing
        table's and the trade-off's), and the clock each plot of them names."""
        return list(dict.fromkeys(row.clock for row in self.rows))

    @property
    def modes(self) -> list[str]:
        return list(dict.fromkeys(row.mode for row in self.rows))

    def rows_of(self, mode: str) -> list[Row]:
        return [row for row in self.rows if row.mode == mode]

    @property
    def interval_name(self) -> str:
        """The speedups' interval as the record names it: "95% rerun interval"."""
        return interval_name(self.interval, self.confidence)

    def marks_used(self) -> list[str]:
        return [name for name in MARKS if any(name in row.marks for row in self.rows)]


MIN_FIT_LENGTHS = 3  # a power law through two points has no error to report: no fit below three lengths


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


def build_rows(view: RecordView, seed: int = stats.SEED, resamples: int = stats.RESAMPLES) -> list[Row]:
    """One row per measured cell, in the run's grid order."""
    baseline, rows, per_sample = view.baseline, [], samples_per_figure(view)
    for mode, length in view.cells():
        cell, samples = view.summary(mode, length), view.samples(mode, length)
        clock = view.estimation(length)["clock"]
        clocked = None
        if clock != "wall":
            on_clock = cell_statistics(list(view.samples_on(clock, mode, length).values()))
            clocked = Timing(on_clock["median"], on_clock["q1"], on_clock["q3"])
        shown = clocked or Timing(cell["median"], cell["q1"], cell["q3"])
        speedup = undisturbed = None
        base = view.speedup_samples(baseline, length)
        if mode != baseline and base:
            speedup = row_speedup(view, mode, length, seed, resamples)
            clean, mine = undisturbed_pairs(view, mode, length), view.speedup_samples(mode, length)
            if clean is not None and len(clean) < len(samples):
                undisturbed = stats.speedup({r: base[r] for r in clean}, {r: mine[r] for r in clean},
                                            estimator=view.estimator, interval=view.interval,
                                            between_run=view.recorded_between_run, key=(mode, length))
        repetitions = view.repetitions(mode, length)
        trend = stats.trend([r["started"] for r in repetitions], [r["seconds"] for r in repetitions]) \
            if repetitions and repetitions[0]["started"] is not None else None  # schema 1: no start times
        quantized = view.quantized_positions(mode, length)
        marks = [name for name, present in (
            ("failed", not view.passed(mode, length)),
            ("noisy", shown.spread > NOISY_SPREAD),  # the spread of the times shown beside the speedup
            ("partial", len(samples) < view.planned(length)),
            ("trend", trend is not None and trend.drifting),
            ("disturbed", speedup is not None and undisturbed is not None
             and abs(undisturbed.ratio / speedup.ratio - 1) > speedup.half_width / 2),
            ("unquantized", quantized is not None and quantized < QUANTIZED_SHARE_FLOOR * length),
        ) if present]
        rows.append(Row(
            length=length, mode=mode, samples=len(samples), planned=view.planned(length),
            median=cell["median"], q1=cell["q1"], q3=cell["q3"], is_baseline=mode == baseline,
            speedup=speedup, speedup_valid=view.passed(mode, length) and view.passed(baseline, length),
            check=view.check(mode, length), memory=view.memory(mode, length), marks=tuple(marks),
            undisturbed=undisturbed, clock=clock, clocked=clocked, per_sample=per_sample, quantized=quantized,
        ))
    return rows


def samples_per_figure(view: RecordView) -> int:
    """What one sample's seconds divide by for the per-workload figure: a contexts run's timed steps (one step
    in records from before the timed window); 0 for a loop, whose figure is per token (the length)."""
    return (view.workload.timed_steps or 1) if view.workload.kind == "contexts" else 0


def row_speedup(view: RecordView, mode: str, length: int, seed: int, resamples: int) -> RatioEstimate | None:
    """The record's own speedup and interval (schema 2), or the ratio of medians with a paired
    bootstrap interval for schema-1 records, as they were always reported."""
    if view.estimator is None:
        return stats.paired_speedup(view.samples(view.baseline, length), view.samples(mode, length), seed=seed,
                                    key=(mode, length), resamples=resamples)
    entry = view.speedup(mode, length)
    return RatioEstimate(entry["speedup"], entry["low"], entry["high"], entry["pairs"], view.estimator, view.interval)


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
        if len(mine) >= MIN_FIT_LENGTHS and not view.workload.is_request:
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
    if view.estimator == "median-of-ratios" and any(r.speedup is not None and r.speedup.pairs < 6 for r in rows):
        report.notes.append("some speedups rest on fewer than 6 rotations: their interval is the range of the "
                            "per-rotation ratios, which covers less than 95% (50% with 2, 94% with 5)")
    if view.estimator is not None:
        report.estimator, report.interval, report.between_run = view.estimator, view.interval, view.recorded_between_run
        report.control_interval = view.control_interval
        noisy = {row.length for row in rows if "noisy" in row.marks}
        report.sampling, report.control, report.noise = sampling_rows(view, noisy), view.control, noise_summary(view)
        report.verdict = precision.verdict(view, report.sampling)
        if clock_note(report.sampling) and not view.workload.is_request:
            report.notes.append(clock_note(report.sampling))  # a request's table is wall time: TTFT, TPOT, ITL
    report.notes += [note for note in [precision.device_note(view)] if note]  # which clock, on a device
    report.tradeoffs = tradeoffs(view, rows)
    marks = {row.mode: row.marks for row in rows}  # a request has one length: its cells' marks are its modes'
    report.latency = [dataclasses.replace(row, marks=marks.get(row.mode, ())) for row in latency_rows(view)]
    report.workload = view.workload.to_dict()
    report.limits, report.step_latency = limit_rows(view), step_quartiles(view)
    report.limits_note = limit_sentence(view) if report.limits else None
    report.peers = peer_rows(view)
    cell_marks = {(row.mode, row.length): row.marks for row in rows}
    report.context_steps = [dataclasses.replace(row, marks=cell_marks.get((row.mode, row.context), ()))
                            for row in context_rows(view)]
    report.context_note = context_sentence(view) if report.context_steps else None
    report.quality, report.quality_note, report.model_note = quality_rows(view), quality_note(view), model_sentence(view)
    report.needle = needle_summary(view)
    report.latency_note = latency_sentence(report.latency, view.baseline, timer_sentence(view)) if report.latency else None
    return report


def contention_sentence(view: RecordView, report: Report) -> str | None:
    """Why the run fell short of its precision, in words (kvbench.report.record.precision); None when it did not."""
    return precision.contention_sentence(view, report.sampling)


def tradeoffs(view: RecordView, rows: list[Row]) -> list[Tradeoff]:
    """Every cached mode at every length, when the run holds a kind that changes the representation
    (lossy, or a window that keeps fewer positions): bytes, drift and time side by side."""
    changes = any(row.check and changes_representation(row.mode, row.check) for row in rows)
    if not changes:
        return []
    config = PlainConfig.from_dict(view.config)
    out = []
    for row in rows:
        if row.is_baseline or row.memory is None:
            continue
        out.append(Tradeoff(row.mode, row.length, row.memory["measured_bytes"],
                            expected_cache_bytes(config, view.batch, row.length), row.check, row.unit_seconds,
                            row.speedup if row.speedup_valid else None, row.quantized, row.clock))
    return out


def noise_summary(view: RecordView) -> Noise | None:
    repetitions = view.every_repetition()
    if not repetitions:
        return None
    disturbed, reasons = tally((rep.seconds, rep.telemetry) for rep in repetitions)
    telemetry = view.sampling["telemetry"]
    return Noise(len(repetitions), disturbed, reasons,
                 telemetry.get("per_sample_seconds"), min(rep.seconds for rep in repetitions),
                 telemetry.get("unavailable", {}))
