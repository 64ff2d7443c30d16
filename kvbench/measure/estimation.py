"""Which clock a length's speedups are estimated on, chosen from what its samples' telemetry saw.

On a quiet machine a sample's wall time is the loop's own time, and the median over rotations
of the paired ratio of wall times is the estimator that held best in the A/A study
(docs/noise-study.md). When another process shares the timed thread's CPU, the thread spends
part of each sample waiting for it: the wall time then carries the neighbour's work, in
amounts that differ from one sample to the next, and the thread's own CPU time (which
excludes those waits) measures the loop instead (docs/contention-study.md). So a length
whose samples waited for a CPU often enough is estimated on CPU time, and the record says
so and why. CPU time is the thread's alone, so this needs one torch thread; a guest's CPU
time still includes what the hypervisor stole, which no clock inside the guest can remove.

The choice depends only on a length's recorded samples, so recomputing a record's summary
gives the same choice, and the sampler's stop rule watches the intervals that will be reported.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvbench.measure import stats
from kvbench.measure.telemetry import DISTURBED_RUNQUEUE

RULE = "telemetry/1"  # the rule below; a record names the rule its summary was computed with
CLOCKS = {"wall": "seconds", "cpu": "cpu_seconds"}  # clock -> the repetition field it reads
CONTENDED = 0.25  # a length is contended when at least this share of its samples waited for a CPU


@dataclass(frozen=True)
class Estimation:
    """How one length's speedups were estimated, and why."""

    length: int
    clock: str  # a key of CLOCKS
    estimator: str  # a key of kvbench.measure.stats.ESTIMATORS
    samples: int
    waited: int  # samples that waited for a CPU more than DISTURBED_RUNQUEUE of their time
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


def waited_for_cpu(repetition: dict) -> bool:
    return (repetition.get("runqueue_seconds") or 0) > DISTURBED_RUNQUEUE * repetition["seconds"]


def choose(length: int, repetitions: list[dict], threads: int, estimator: str = stats.DEFAULT_ESTIMATOR) -> Estimation:
    """The clock for one length, from that length's repetitions (every label)."""
    count = len(repetitions)
    waited = sum(waited_for_cpu(rep) for rep in repetitions)
    has_cpu_time = count > 0 and all(rep.get("cpu_seconds") for rep in repetitions)
    share = f"{waited} of {count} samples waited for a CPU"
    if count == 0 or waited < CONTENDED * count:
        return Estimation(length, "wall", estimator, count, waited, f"{share}: wall time")
    if all("host_seconds" in rep for rep in repetitions):  # timed on a device's clock (kvbench.measure.clock)
        return Estimation(length, "wall", estimator, count, waited, f"{share}, but timed on a device's clock, which "
                          "the host's waits do not reach: the device's time")
    if threads != 1:
        return Estimation(length, "wall", estimator, count, waited,
                          f"{share}, but {threads} threads: one thread's CPU time would miss the others' work; wall time")
    if not has_cpu_time:
        return Estimation(length, "wall", estimator, count, waited, f"{share}, but no thread CPU time was recorded; "
                          "wall time")
    return Estimation(length, "cpu", estimator, count, waited,
                      f"{share} (another process shared its CPU): the thread's CPU time, which leaves the waits out")


def fixed(length: int, estimator: str | None) -> Estimation:
    """A record summarized before the rule: wall time everywhere, its own estimator."""
    return Estimation(length, "wall", estimator or "ratio-of-medians", 0, 0, "recorded before telemetry chose a clock")


def by_length(repetitions: list[dict], threads: int, estimator: str = stats.DEFAULT_ESTIMATOR) -> dict[int, Estimation]:
    grouped: dict[int, list[dict]] = {}
    for rep in repetitions:
        grouped.setdefault(rep["length"], []).append(rep)
    return {length: choose(length, reps, threads, estimator) for length, reps in grouped.items()}


def series(repetitions: list[dict], clock: str) -> dict[tuple[str, int], dict[int, float]]:
    """{(mode, length): {repetition: seconds on `clock`}} (wall time where a sample has no CPU time)."""
    field = CLOCKS[clock]
    cells: dict[tuple[str, int], dict[int, float]] = {}
    for rep in repetitions:
        cells.setdefault((rep["mode"], rep["length"]), {})[rep["repetition"]] = rep.get(field) or rep["seconds"]
    return cells
