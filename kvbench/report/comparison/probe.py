"""The machine in a comparison: the machine probe of two records (kvbench.measure.machine's fixed
calls, timed at each run's ends) compared, what it says about the comparison in words, and
which facts of a capture name a machine. kvbench.report.comparison.compare judges `full` against it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from kvbench.measure import stats
from kvbench.record import RecordView
from kvbench.report.comparison.verdicts import WITHIN_NOISE, Change, change, judged_change


@dataclass(frozen=True)
class MachineChange:
    """NEW / OLD of the machine probe's fixed calls (kvbench.measure.machine), each and together.

    `overall` is the geometric mean of the calls' ratios: how much slower the machine
    itself was in NEW, what `full` is held against when it moved too."""

    calls: dict[str, Change]
    overall: Change

    @property
    def moved(self) -> bool:
        return self.overall.verdict != WITHIN_NOISE

    def sentence(self) -> str:
        parts = ", ".join(f"{name} {percent(c.ratio)}" for name, c in self.calls.items())
        direction = "slower" if self.overall.ratio > 1 else "faster"
        if not self.moved:
            return (f"the machine probe did not move beyond its noise ({percent(self.overall.ratio)}, MDE "
                    f"±{self.overall.mde:.1%}; {parts})")
        return (f"the machine was {abs(self.overall.ratio - 1):.0%} {direction} in NEW (machine probe "
                f"{self.overall.ratio:.3f} [{self.overall.low:.3f}, {self.overall.high:.3f}]: {parts})")


def percent(ratio: float) -> str:
    return f"{ratio - 1:+.1%}"


def machine_change(old: RecordView, new: RecordView, *, factor: float, alpha: float) -> MachineChange | None:
    """The two records' machine probes compared; None unless both ran the same calls."""
    if old.machine_probe is None or new.machine_probe is None:
        return None
    names = [name for name in new.machine_probe["workloads"] if name in old.machine_probe["workloads"]
             and old.probe_seconds(name) and new.probe_seconds(name)]
    if not names:
        return None
    calls = {name: change(stats.median_estimate(old.probe_seconds(name), old.between_run["seconds"]),
                              stats.median_estimate(new.probe_seconds(name), new.between_run["seconds"]),
                              factor=factor, alpha=alpha) for name in names}
    ratio = math.exp(statistics.fmean(math.log(c.ratio) for c in calls.values()))
    error = math.hypot(*(c.log_error for c in calls.values())) / len(calls)
    return MachineChange(calls, judged_change(ratio, error, factor=factor, alpha=alpha))


def machine_notes(machine: MachineChange | None, cells: list, baseline: str,
                  across: bool = False) -> list[str]:
    """What the machine probe says about the comparison, in words."""
    if machine is None:
        return []
    if across:
        direction = "slower" if machine.overall.ratio > 1 else "faster"
        return [f"on the machine probe NEW's machine is {abs(machine.overall.ratio - 1):.0%} {direction} than OLD's "
                f"({', '.join(f'{name} {percent(c.ratio)}' for name, c in machine.calls.items())})"]
    moved_alone = sorted(cell.length for cell in cells if cell.mode == baseline and cell.judged_by == "time"
                         and cell.time.verdict != WITHIN_NOISE)
    notes = []
    explained = [cell.length for cell in cells if cell.judged_by == "vs machine"]
    waited = [cell.length for cell in cells if cell.judged_by == "on CPU time"]
    if machine.moved and explained:
        notes.append(f"{machine.sentence()}; {baseline} moved with it at length(s) "
                     f"{', '.join(map(str, explained))}, so every cell there moved with the machine: cached modes "
                     f"are judged by their cost relative to {baseline}, {baseline} by its time against the probe's "
                     f"(its CPU time where a run waited for a CPU)")
    else:
        notes.append(machine.sentence())
    if waited:
        notes.append(f"at length(s) {', '.join(map(str, waited))} a run waited for a CPU (another process shared it) "
                     f"and {baseline}'s wall time moved with the waits while its CPU time did not: the machine was "
                     f"contended, every cell there moved with it; cached modes are judged by their cost relative to "
                     f"{baseline}, {baseline} by its CPU time")
    if moved_alone:
        cause = "more than the machine probe did" if machine.moved else "while the machine probe did not"
        notes.append(f"{baseline} changed at length(s) {', '.join(map(str, moved_alone))} {cause}: a change in the "
                     f"path every mode shares, judged by time")
    return notes


# The facts that make two machines for a comparison: the CPU. Not the hostname: two containers or CI runners
# of one type have different names and the same CPU, and their runs compare.
IDENTITY = (("cpu", "brand"), ("cpu", "arch"), ("system", "logical_cores"))


def machine_identity_differences(old: RecordView, new: RecordView) -> list[str]:
    """'key a -> b' for every fact naming the machine that differs between two records' captures."""
    out = []
    for section, key in IDENTITY:
        before, after = (old.environment.get(section) or {}).get(key), (new.environment.get(section) or {}).get(key)
        if before is not None and after is not None and before != after:
            out.append(f"{section}.{key} {before} -> {after}")
    return out
