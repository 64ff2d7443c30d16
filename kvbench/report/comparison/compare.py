"""Compare two records, cell by cell, with verdicts that survive a rerun.

Two runs are two samples of machine state. A cell's seconds move with the machine (a slow
patch, another CPU model), so a comparison of raw times is judged against what both runs
could detect; a cached mode's cost relative to the full-prefix path, measured in the same
rotations, moves much less, and is what decides a cached cell's verdict. For each cell
both records measured:

  time      NEW / OLD median seconds, with the interval of that ratio from both runs'
            intervals (each run's own uncertainty, between-run drift included: see
            docs/statistics.md);
  vs full   (cached modes) NEW / OLD of the cost relative to full, i.e. OLD speedup / NEW
            speedup, from the two records' speedup intervals;
  MDE       the minimum detectable effect of each: the smallest true change these two
            records would show beyond their noise with 80% power at the chosen level.

A change smaller than its MDE is "within noise", never "faster" or "slower"; one beyond
its MDE but within --factor is "unchanged" (real, but below what matters); beyond both,
"slower" or "faster". The environment and settings that differ come first (differences).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

from kvbench.measure import latency, stats
from kvbench.record import RecordView
from kvbench.report.comparison.differences import RANKS, Difference, config_diff, environment_diff, work_differences, work_text
from kvbench.report.format import check_text, ms
from kvbench.report.comparison.probe import MachineChange, machine_change, machine_identity_differences, machine_notes
from kvbench.report.comparison.verdicts import (
    ALPHA,
    FACTOR,
    FASTER,
    NOT_COMPARABLE,
    POWER,
    SLOWER,
    UNCHANGED,
    VERDICTS,
    WITHIN_NOISE,
    Change,
    change,
    judged_change,
    relative_to,
)

__all__ = ["ALPHA", "FACTOR", "FASTER", "POWER", "RANKS", "NOT_COMPARABLE", "SLOWER", "UNCHANGED", "VERDICTS", "WITHIN_NOISE", "CellChange", "Change", "Comparison", "Difference",
           "LatencyChange", "MachineChange", "change", "compare_records", "config_diff", "environment_diff", "judged_change",
           "machine_change", "relative_to"]


NOT_JUDGED = "not judged"  # judged_by of every cell of two runs that are not comparable (two CPUs, different work)


@dataclass(frozen=True)
class CellChange:
    mode: str
    length: int
    old_mode: str  # the cell of OLD compared with this one (differs under a mode mapping)
    old_samples: int
    new_samples: int
    old_median: float
    new_median: float
    time: Change
    relative: Change | None  # cost relative to full: OLD speedup / NEW speedup
    old_check: dict | None
    new_check: dict | None
    notes: tuple[str, ...]
    judged_by: str = "time"  # "vs full", "vs machine", "on CPU time", "time" (which change decides the verdict) or NOT_JUDGED
    adjusted: Change | None = None  # (full) its time held against the machine probe's, or its CPU time's change
    cpu_time: Change | None = None  # the change of the thread's CPU time, when either run was contended here

    @property
    def judged(self) -> Change:
        if self.judged_by == "vs full" and self.relative is not None:
            return self.relative
        if self.judged_by in ("vs machine", "on CPU time") and self.adjusted is not None:
            return self.adjusted
        return self.time

    @property
    def verdict(self) -> str:
        return NOT_COMPARABLE if self.judged_by == NOT_JUDGED else self.judged.verdict

    @property
    def label(self) -> str:
        return self.mode


@dataclass(frozen=True)
class LatencyChange:
    """NEW / OLD of one mode's TTFT or TPOT in two request runs, and of its ratio to full's (judged like a cell)."""

    mode: str
    figure: str  # "ttft" or "tpot" (kvbench.measure.latency.RATIOS)
    old_median: float
    new_median: float
    time: Change
    relative: Change | None  # the figure relative to full's: OLD ratio / NEW ratio
    length: int = 0  # the request's positions, as its cell is keyed
    judged_by: str = "time"

    @property
    def judged(self) -> Change:
        return self.relative if self.judged_by == "vs full" and self.relative is not None else self.time

    @property
    def verdict(self) -> str:
        return NOT_COMPARABLE if self.judged_by == NOT_JUDGED else self.judged.verdict

    @property
    def label(self) -> str:
        return f"{self.figure.upper()} of {self.mode}"


@dataclass
class Comparison:
    old_source: str
    new_source: str
    old_status: str
    new_status: str
    environment: list[Difference]
    config: list[Difference]
    cells: list[CellChange]
    skipped: list[str]
    factor: float
    alpha: float
    notes: list[str] = field(default_factory=list)
    machine: MachineChange | None = None  # None unless both records carry a machine probe
    latency: list[LatencyChange] = field(default_factory=list)  # two request runs of the same shape
    not_comparable: str | None = None  # why no cell has a verdict (two machines, different work), in words
    instead: str = ""  # what to run instead, when not comparable

    @property
    def regressions(self) -> list:
        return [c for c in [*self.cells, *self.latency] if c.verdict == SLOWER]

    def count(self, verdict: str) -> int:
        return sum(cell.verdict == verdict for cell in self.cells)


def median_estimate(view: RecordView, mode: str, length: int) -> stats.RatioEstimate:
    """A cell's median seconds with its confidence interval, widened by how much a median moves between runs."""
    return stats.median_estimate(view.seconds(mode, length), view.between_run["seconds"])


def speedup_estimate(view: RecordView, mode: str, length: int) -> stats.RatioEstimate | None:
    """A cell's speedup with its confidence interval, on the clock and estimator its record chose for the length."""
    base = view.speedup_samples(view.baseline, length)
    if not base or mode == view.baseline:
        return None
    return stats.speedup(base, view.speedup_samples(mode, length), estimator=view.estimation(length)["estimator"],
                         interval="confidence", between_run=view.between_run["speedup"], key=(mode, length))


def _notes(old_check: dict | None, new_check: dict | None, old_mode: str, mode: str) -> tuple[str, ...]:
    notes = []
    if old_mode != mode:
        notes.append(f"NEW's {mode} against OLD's {old_mode}")
    if old_check is not None and new_check is not None and old_check["passed"] and not new_check["passed"]:
        notes.append("equivalence now FAILS")
    elif old_check is not None and new_check is not None and not old_check["passed"] and new_check["passed"]:
        notes.append("equivalence fixed")
    elif new_check is not None and not new_check["passed"]:
        notes.append("equivalence fails in both")
    return tuple(notes)


def compare_cell(old: RecordView, new: RecordView, old_mode: str, mode: str, length: int, factor: float,
                 alpha: float) -> CellChange:
    options = {"factor": factor, "alpha": alpha}
    time = change(median_estimate(old, old_mode, length), median_estimate(new, mode, length), **options)
    old_speedup, new_speedup = speedup_estimate(old, old_mode, length), speedup_estimate(new, mode, length)
    relative = change(old_speedup, new_speedup, invert=True, **options) if old_speedup and new_speedup else None
    old_check, new_check = old.check(old_mode, length), new.check(mode, length)
    notes = _notes(old_check, new_check, old_mode, mode)
    clocks = old.estimation(length)["clock"], new.estimation(length)["clock"]
    if relative is not None and clocks[0] != clocks[1]:
        notes += (f"vs full: OLD's speedup on {CLOCK_NAMES[clocks[0]]}, NEW's on {CLOCK_NAMES[clocks[1]]}",)
    cpu_time = None
    if "cpu" in clocks:  # either run waited for a CPU here: how the thread's own time changed
        cpu_time = change(stats.median_estimate(list(old.samples_on("cpu", old_mode, length).values()),
                                                old.between_run["seconds"]),
                          stats.median_estimate(list(new.samples_on("cpu", mode, length).values()),
                                                new.between_run["seconds"]), **options)
    return CellChange(mode, length, old_mode, len(old.seconds(old_mode, length)), len(new.seconds(mode, length)),
                      statistics.median(old.seconds(old_mode, length)), statistics.median(new.seconds(mode, length)),
                      time, relative, old_check, new_check, notes, cpu_time=cpu_time)



CLOCK_NAMES = {"wall": "wall time", "cpu": "CPU time"}


def compare_records(old: RecordView, new: RecordView, *, factor: float = FACTOR, alpha: float = ALPHA,
                    mapping: dict[str, str] | None = None) -> Comparison:
    """Every cell both records measured. `mapping` {NEW mode: OLD mode} compares differently named cells."""
    if not factor > 1:
        raise ValueError(f"factor must be greater than 1, got {factor:g}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie strictly between 0 and 1, got {alpha:g}")
    mapping = mapping or {}
    old_cells = set(old.cells())
    pairs = [((mapping.get(mode, mode), length), (mode, length)) for mode, length in new.cells()
             if (mapping.get(mode, mode), length) in old_cells]
    if not pairs:
        raise ValueError(f"no cell measured in both records: {old.source} has {_grid_text(old)}; "
                         f"{new.source} has {_grid_text(new)}")
    compared_old = {old_cell for old_cell, _ in pairs}
    skipped = [f"{m}@{n} only in OLD" for m, n in old.cells() if (m, n) not in compared_old]
    skipped += [f"{m}@{n} only in NEW" for m, n in new.cells() if (mapping.get(m, m), n) not in old_cells]
    cells = [compare_cell(old, new, old_mode, mode, length, factor, alpha) for (old_mode, _), (mode, length) in pairs]
    machine = machine_change(old, new, factor=factor, alpha=alpha)
    reason = not_comparable_reason(old, new)
    cells = not_comparable(cells) if reason else judge(cells, new.baseline, machine, factor=factor, alpha=alpha)
    comparison = Comparison(
        old_source=old.source, new_source=new.source, old_status=old.status, new_status=new.status,
        environment=environment_diff(old.environment, new.environment), config=config_diff(old, new), cells=cells,
        skipped=skipped, factor=factor, alpha=alpha, machine=machine,
    )
    for label, view in (("OLD", old), ("NEW", new)):
        if not view.complete:
            comparison.notes.append(f"{label} is INCOMPLETE (interrupted run): only its completed repetitions are compared")
    if any(d.key in ("run.seed", "run.threads") for d in comparison.config):
        comparison.notes.append("the records ran with another seed or thread count: the same work, but their times "
                                "may differ for that reason too")
    comparison.latency = latency_changes(old, new, mapping, factor=factor, alpha=alpha)
    if reason:
        comparison.not_comparable, comparison.instead, note = reason
        comparison.notes.append(note)
        comparison.latency = not_comparable(comparison.latency)
    across = bool(machine_identity_differences(old, new))
    if across or not reason:  # different work on one machine: what the probe says explains no verdict
        comparison.notes.extend(machine_notes(machine, cells, new.baseline, across))
    return comparison


def not_comparable_reason(old: RecordView, new: RecordView) -> tuple[str, str, str] | None:
    """(why, what to run instead, the note) when no verdict between the two records means anything: they ran
    on different CPUs, or timed different work (what `kvbench compare` refuses unless --force)."""
    across = machine_identity_differences(old, new)
    if across:
        why = f"OLD and NEW ran on different machines ({'; '.join(across)})"
        instead = "`kvbench compare --across-machines OLD NEW` lines up each run's speedups with their rerun intervals"
        return why, instead, (f"{why}: raw seconds measure the machines, and a speedup's size legitimately differs "
                              f"between CPUs, so every verdict is '{NOT_COMPARABLE}'; {instead}")
    work = work_differences(old, new)
    if work:
        why = f"OLD and NEW timed different work ({work_text(work)})"
        return why, "compare records of the same model, workload and batch", (
            f"{why}: their cells are lined up, but every verdict is '{NOT_COMPARABLE}'")
    return None


def latency_changes(old: RecordView, new: RecordView, mapping: dict[str, str], *, factor: float,
                    alpha: float) -> list[LatencyChange]:
    """Two request runs of the same prompt and length: each mode's TTFT and TPOT, NEW / OLD, judged by its
    ratio to full's unless full's own figure changed beyond its noise."""
    shapes = [view.workload for view in (old, new)]
    if not shapes[0].is_request or shapes[0] != shapes[1]:
        return []
    length, options = new.lengths[0], {"factor": factor, "alpha": alpha}

    def estimate(view: RecordView, mode: str, figure: str) -> stats.RatioEstimate:
        values = list(latency.figure_by_rotation(view.repetitions(mode, length), figure).values())
        return stats.median_estimate(values, view.between_run["seconds"])

    def ratio(view: RecordView, mode: str, figure: str) -> stats.RatioEstimate | None:
        return latency.ratio_to_baseline(view.repetitions(view.baseline, length), view.repetitions(mode, length),
                                         figure, view.between_run["speedup"], key=(mode, length), interval="confidence")

    found = []
    for mode in [m for m in new.modes if (mapping.get(m, m), length) in old.cells()]:
        for figure in latency.RATIOS:
            first, second = estimate(old, mapping.get(mode, mode), figure), estimate(new, mode, figure)
            before, after = ratio(old, mapping.get(mode, mode), figure), ratio(new, mode, figure)
            relative = change(before, after, invert=True, **options) if mode != new.baseline and before and after \
                else None
            found.append(LatencyChange(mode, figure, first.ratio, second.ratio, change(first, second, **options), relative,
                                       length))
    moved = {c.figure for c in found if c.mode == new.baseline and c.time.verdict != WITHIN_NOISE}
    return [replace(c, judged_by="vs full") if c.relative is not None and c.figure not in moved else c for c in found]


def not_comparable(cells: list) -> list:
    """Every cell of two runs that are not comparable (two machines, or different work): its ratios stay visible,
    its verdict is NOT_COMPARABLE. Between two CPUs not even a speedup is judged: the cache's gain depends on the
    CPU (its caches, its vector units), so a different size there is no regression of the code."""
    return [replace(cell, judged_by=NOT_JUDGED) for cell in cells]


def judge(cells: list[CellChange], baseline: str, machine: MachineChange | None = None, *,
          factor: float = FACTOR, alpha: float = ALPHA) -> list[CellChange]:
    """A cached mode is judged by its cost relative to full (machine drift cancels in it) when full
    did not change beyond its noise at that length, or changed only as much as the machine probe
    did (full is then judged by its time against the probe's), or, where either run waited for a CPU
    (its telemetry chose CPU time), did not change on CPU time (full is then judged by its CPU time:
    the neighbour took wall time, not the code); otherwise, and for full, by its time."""
    explained: dict[int, tuple[str, Change]] = {}  # length -> (how, the change) where that explains full
    for cell in cells:
        if cell.mode != baseline or cell.time.verdict == WITHIN_NOISE:
            continue
        if machine is not None and machine.moved:  # its wall time, else (a run waited for a CPU) its CPU time
            for measured in (cell.time, cell.cpu_time):
                adjusted = relative_to(measured, machine.overall, factor=factor, alpha=alpha) if measured else None
                if adjusted is not None and adjusted.verdict in (WITHIN_NOISE, UNCHANGED):
                    explained[cell.length] = ("vs machine" if measured is cell.time else "vs machine, CPU time",
                                              adjusted)
                    break
            if cell.length in explained:
                continue
        if cell.cpu_time is not None and cell.cpu_time.verdict in (WITHIN_NOISE, UNCHANGED):
            explained[cell.length] = ("on CPU time", cell.cpu_time)
    changed = {cell.length: cell.time.verdict != WITHIN_NOISE and cell.length not in explained
               for cell in cells if cell.mode == baseline}
    judged = []
    for cell in cells:
        if cell.mode == baseline and cell.length in explained:
            how, adjusted = explained[cell.length]
            note = {"vs machine": "moved with the machine probe",
                    "vs machine, CPU time": "its CPU time moved with the machine probe (its wall time also waited for "
                                            "a CPU)",
                    "on CPU time": "its wall time moved with the waits for a CPU; its CPU time did not change"}[how]
            judged.append(replace(cell, judged_by="on CPU time" if how == "on CPU time" else "vs machine",
                                  adjusted=adjusted, notes=(*cell.notes, note)))
        elif cell.relative is not None and not changed.get(cell.length, True):
            judged.append(replace(cell, judged_by="vs full"))
        elif cell.relative is not None:
            judged.append(replace(cell, notes=(*cell.notes, f"{baseline} changed at this length: judged by time")))
        else:
            judged.append(cell)
    return judged


def _grid_text(view: RecordView) -> str:
    return ", ".join(f"{m}@{n}" for m, n in view.cells()) or "nothing"


def _change_texts(value: Change | None) -> list[str]:
    if value is None:
        return ["", ""]
    return [f"{value.ratio:.3f} [{value.low:.3f}, {value.high:.3f}]", f"±{value.mde:.1%}"]


def cell_texts(cell: CellChange) -> list[str]:
    """The plain texts of one compared cell, in the order of COMPARE_HEADER (notes last)."""
    return [str(cell.length), cell.mode, f"{cell.old_samples}/{cell.new_samples}", ms(cell.old_median),
            ms(cell.new_median), *_change_texts(cell.time), *_change_texts(cell.relative),
            # the verdict names the quantity it judged (the column it read): "slower (time)", "faster (vs full)"
            f"{cell.verdict} ({cell.judged_by})" if cell.judged_by != NOT_JUDGED else cell.verdict,
            f"{check_text(cell.old_check)} → {check_text(cell.new_check)}", "; ".join(cell.notes)]


LATENCY_HEADER = ("mode", "figure", "old ms", "new ms", "new/old [95% CI]", "MDE", "vs full new/old [95% CI]", "MDE",
                  "verdict")


def latency_texts(c: LatencyChange) -> list[str]:
    """The plain texts of one compared TTFT or TPOT, in the order of LATENCY_HEADER."""
    verdict = f"{c.verdict} ({c.judged_by})" if c.judged_by != NOT_JUDGED else c.verdict  # names what it judged
    return [c.mode, c.figure.upper(), ms(c.old_median), ms(c.new_median), *_change_texts(c.time),
            *_change_texts(c.relative), verdict]


COMPARE_HEADER = ("length", "mode", "n old/new", "old ms", "new ms", "time new/old [95% CI]", "MDE",
                  "vs full new/old [95% CI]", "MDE", "verdict", "max |Δ| old → new", "notes")
VERDICT_COLUMN = COMPARE_HEADER.index("verdict")
CHECK_COLUMN = COMPARE_HEADER.index("max |Δ| old → new")


def summary_line(c: Comparison) -> str:
    if c.not_comparable:
        return f"{len(c.cells)} cells lined up, none judged: {c.not_comparable}."
    counts = ", ".join(f"{c.count(v)} {v}" for v in VERDICTS + ((NOT_COMPARABLE,) if c.count(NOT_COMPARABLE) else ()))
    return (f"{len(c.cells)} cells compared: {counts}. A cached mode is judged by its cost relative to full "
            f"(unless full itself changed more than the machine did), full by its time (against the machine "
            f"probe's when the machine moved); slower/faster = beyond both the MDE and {c.factor:g}x.")
