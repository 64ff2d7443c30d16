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
from kvbench.config import PlainConfig
from kvbench.kinds import expected_cache_bytes
from kvbench.modes import changes_representation
from kvbench.record import RecordView
from kvbench.report.quality import model_sentence, quality_note, quality_rows
from kvbench.report.latency import (
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
    step_medians,
    timer_sentence,
)
from kvbench.stats import NOISY_SPREAD, PowerFit, RatioEstimate
from kvbench.telemetry import disturbances, tally

MARKS = {  # name -> (symbol, meaning); every layout prints the legend for the marks it uses
    "failed": ("✗", "equivalence check failed: timed, but not a valid speedup"),
    "noisy": ("~", f"IQR/median above {NOISY_SPREAD:.0%}: spread too wide to trust the median"),
    "partial": ("†", "fewer repetitions than planned (interrupted run)"),
    "trend": ("↗", f"its samples trend over the run (Kendall p < {stats.TREND_P}, change of "
                   f"{stats.TREND_SIZE:.0%} or more): warm-up not over, or the machine changed"),
    "disturbed": ("⚡", "its speedup without the disturbed samples differs by more than half its interval"),
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
    undisturbed: RatioEstimate | None = None  # the speedup from the pairs neither side of which was disturbed

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


@dataclass(frozen=True)
class LengthRow:
    """How one length was sampled: rotations, why it stopped, how precise, and its A/A noise floor."""

    length: int
    rotations: int
    stop: str | None
    half_width: float | None
    control: RatioEstimate | None  # mode / control: 1 but for noise
    clock: str = "wall"  # what its speedups were estimated on (kvbench.estimation.CLOCKS)
    clock_reason: str = ""


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
    """One kind at one length: what it keeps, how far it drifts, what it costs per token."""

    mode: str
    length: int
    nbytes: int
    full_precision_bytes: int  # the exact float formula at this length: what the kind is saving against
    check: dict | None
    per_token: float
    speedup: RatioEstimate | None

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
    interval: str = "percentile bootstrap"
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
    step_latency: dict[str, list[float]] = field(default_factory=dict)  # a request's median step, per position
    context_steps: list[ContextRow] = field(default_factory=list)  # a contexts run's steady and first steps
    context_note: str | None = None
    tradeoffs: list[Tradeoff] = field(default_factory=list)
    quality: list = field(default_factory=list)  # QualityRow: what each mode did to a real model's text
    quality_note: str | None = None
    model_note: str | None = None  # a real model's weights and text

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
    run, precision = view.run, view.protocol.get("precision")
    if view.estimator is not None and precision is not None:
        sampled = f"rotations until ±{precision:.0%} (at least {run['repeats']})"
    else:
        sampled = f"{run['repeats']} repetitions"
    return f"kvbench {run['preset']}: batch {run['batch']}, {view.config['dtype']}, {run['threads']} thread(s), {sampled}"


def build_rows(view: RecordView, seed: int = stats.SEED, resamples: int = stats.RESAMPLES) -> list[Row]:
    """One row per measured cell, in the run's grid order."""
    baseline, rows = view.baseline, []
    for mode, length in view.cells():
        cell, samples = view.summary(mode, length), view.samples(mode, length)
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
            if repetitions and "started" in repetitions[0] else None
        marks = [name for name, present in (
            ("failed", not view.passed(mode, length)),
            ("noisy", stats.spread(cell["q1"], cell["q3"], cell["median"]) > NOISY_SPREAD),
            ("partial", len(samples) < view.planned(length)),
            ("trend", trend is not None and trend.drifting),
            ("disturbed", speedup is not None and undisturbed is not None
             and abs(undisturbed.ratio / speedup.ratio - 1) > speedup.half_width / 2),
        ) if present]
        rows.append(Row(
            length=length, mode=mode, samples=len(samples), planned=view.planned(length),
            median=cell["median"], q1=cell["q1"], q3=cell["q3"], is_baseline=mode == baseline,
            speedup=speedup, speedup_valid=view.passed(mode, length) and view.passed(baseline, length),
            check=view.check(mode, length), memory=view.memory(mode, length), marks=tuple(marks),
            undisturbed=undisturbed,
        ))
    return rows


def row_speedup(view: RecordView, mode: str, length: int, seed: int, resamples: int) -> RatioEstimate | None:
    """The record's own speedup and interval (schema 2), or the ratio of medians with a paired
    bootstrap interval for schema-1 records, as they were always reported."""
    if view.estimator is None:
        return stats.paired_speedup(view.samples(view.baseline, length), view.samples(mode, length), seed=seed,
                                    key=(mode, length), resamples=resamples)
    entry = view.speedup(mode, length)
    return RatioEstimate(entry["speedup"], entry["low"], entry["high"], entry["pairs"], view.estimator, view.interval)


def undisturbed_pairs(view: RecordView, mode: str, length: int) -> set[int] | None:
    """Repetitions where neither the mode's sample nor the baseline's was disturbed; None without telemetry."""
    mine, base = view.repetitions(mode, length), view.repetitions(view.baseline, length)
    if not mine or "cpu_seconds" not in mine[0]:
        return None
    clean_base = {r["repetition"] for r in base if not disturbances(r["seconds"], r)}
    return {r["repetition"] for r in mine if not disturbances(r["seconds"], r)} & clean_base


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
    if view.estimator == "median-of-ratios" and any(r.speedup is not None and r.speedup.pairs < 6 for r in rows):
        report.notes.append("some speedups rest on fewer than 6 rotations: their interval is the range of the "
                            "per-rotation ratios, which covers less than 95% (50% with 2, 94% with 5)")
    if view.estimator is not None:
        report.estimator, report.interval, report.between_run = view.estimator, view.interval, view.recorded_between_run
        report.sampling, report.control, report.noise = sampling_rows(view), view.control, noise_summary(view)
        if clock_note(report.sampling):
            report.notes.append(clock_note(report.sampling))
    report.tradeoffs = tradeoffs(view, rows)
    report.latency, report.workload = latency_rows(view), dict(view.run.get("workload") or {"kind": "loop"})
    report.limits, report.step_latency = limit_rows(view), step_medians(view)
    report.limits_note = limit_sentence(view) if report.limits else None
    report.peers = peer_rows(view)
    report.context_steps = context_rows(view)
    report.context_note = context_sentence(view) if report.context_steps else None
    report.quality, report.quality_note, report.model_note = quality_rows(view), quality_note(view), model_sentence(view)
    report.latency_note = latency_sentence(report.latency, view.baseline, timer_sentence(view)) if report.latency else None
    return report


CONTENDED_TIME = 0.05  # the counters explain a run's noise when this much of its timed time was taken


def contention_sentence(view: RecordView, report: Report) -> str | None:
    """When sampling ran out of time or rotations short of its precision, why, in words: what the
    telemetry saw take the machine's time, and what to do about it (None when every length was precise)."""
    target = view.protocol.get("precision")
    loose = [row for row in report.sampling if row.stop in ("budget", "cap") and row.half_width is not None
             and (target is None or row.half_width > target)]
    if not loose:
        return None
    repetitions = view.record["repetitions"]
    wall = sum(rep["seconds"] for rep in repetitions) or 1.0
    cpus = (view.environment.get("system") or {}).get("logical_cores") or 1  # steal is counted over every CPU
    shares = [("of the machine's CPU time stolen by the hypervisor", sum(rep.get("steal_seconds") or 0.0
                                                                          for rep in repetitions) / (wall * cpus)),
              ("of the timed time spent waiting for a CPU", sum(rep.get("runqueue_seconds") or 0.0
                                                                for rep in repetitions) / wall),
              ("of the timed time throttled", sum(rep.get("throttled_seconds") or 0.0 for rep in repetitions) / wall)]
    seen = ", ".join(f"{share:.0%} {name}" for name, share in shares if share >= 0.005)
    if sum(share for _, share in shares) >= CONTENDED_TIME:
        what = f"this machine was contended: {seen}"
    else:  # e.g. a busy host that steals cycles the guest's counters never see
        counted = seen or "no steal, waits or throttling"
        what = (f"the samples disagreed more than this machine's counters explain ({counted}: noise from outside "
                "the VM, or a neighbour on the shared cache)")
    widest = max(loose, key=lambda row: row.half_width)
    stop = "--max-seconds" if any(row.stop == "budget" for row in loose) else "--max-repeats"
    lengths = ", ".join(str(row.length) for row in loose)
    return (f"{what}; intervals up to ±{widest.half_width:.0%} (length {widest.length}; {len(loose)} length(s) "
            f"stopped short of ±{target:.0%}: {lengths}); rerun on a quieter machine or raise {stop}"
            if target is not None else f"{what}; intervals up to ±{widest.half_width:.0%}")


def clock_note(sampling: list[LengthRow]) -> str | None:
    """Which lengths' speedups were estimated on CPU time, and why, when any was (None otherwise)."""
    lengths = [row for row in sampling if row.clock != "wall"]
    if not lengths:
        return None
    return (f"speedups at length {', '.join(str(row.length) for row in lengths)} are on the thread's CPU time, "
            f"not wall time: {lengths[0].clock_reason} (docs/statistics.md, \"Contention\")")


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
                            expected_cache_bytes(config, view.run["batch"], row.length), row.check, row.per_token,
                            row.speedup if row.speedup_valid else None))
    return out


def sampling_rows(view: RecordView) -> list[LengthRow]:
    controls = {entry["length"]: entry for entry in view.controls}
    rows = []
    for length in view.lengths:
        entry, control = view.length_sampling(length), controls.get(length)
        if entry is None:
            continue
        floor = RatioEstimate(control["ratio"], control["low"], control["high"], control["pairs"], view.estimator,
                              view.interval) if control else None
        chosen = view.estimation(length)
        rows.append(LengthRow(length, entry["rotations"], entry["stop"], entry.get("half_width"), floor,
                              chosen["clock"], chosen["reason"]))
    return rows


def noise_summary(view: RecordView) -> Noise | None:
    repetitions = view.record["repetitions"]
    if not repetitions or "cpu_seconds" not in repetitions[0]:
        return None
    disturbed, reasons = tally((rep["seconds"], rep) for rep in repetitions)
    telemetry = view.sampling.get("telemetry", {})
    return Noise(len(repetitions), disturbed, reasons,
                 telemetry.get("per_sample_seconds"), min(rep["seconds"] for rep in repetitions),
                 telemetry.get("unavailable", {}))
