"""How precise a run got, said one way in every view: its title, each length's stop and the run's verdict.

"Precise" means one thing everywhere: the length's speedup intervals reached the run's target
*and* none of its cells is marked ~ (a spread too wide to trust its median). A length whose
intervals were narrow but whose samples scattered is said to have reached the target, never
to be precise. `kvbench run` ends on the verdict; `show`, `report` and its markdown and HTML
print the same sentence, computed from the record.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from kvbench.measure.stats import RatioEstimate
from kvbench.record import RecordView
from kvbench.measure.telemetry import disturbances

CLOCK_TEXTS = {"wall": "wall", "cpu": "CPU time"}
STOP_TEXTS = {"fixed": "fixed protocol", "precise": "precise", "cap": "at --max-repeats", "budget": "at --max-seconds",
              "interrupted": "interrupted", None: "-"}
TOO_WIDE = "~ spread too wide"  # a length that reached its target but not a median worth trusting
CONTENDED_TIME = 0.05  # the counters explain a run's noise when this much of its timed time was taken


@dataclass(frozen=True)
class LengthRow:
    """How one length was sampled: rotations, why it stopped, how precise, and its A/A noise floor."""

    length: int
    rotations: int
    stop: str | None
    half_width: float | None
    control: RatioEstimate | None  # mode / control: 1 but for noise
    clock: str = "wall"  # what its speedups were estimated on (kvbench.measure.estimation.CLOCKS)
    clock_reason: str = ""
    noisy: bool = False  # a cell at this length is marked ~: its spread is too wide to trust its median

    @property
    def precise(self) -> bool:
        return self.stop == "precise" and not self.noisy


def percent(share: float) -> str:
    """A relative half-width as the views print it: one decimal below 10%, none above."""
    if share >= 0.1:
        return f"{share:.0%}"
    return f"{share * 100:.1f}".rstrip("0").rstrip(".") + "%"


def length_label(workload: dict, length: int) -> str:
    """How a length is named: a request by its prompt and generation, not by the positions it fills."""
    if workload.get("kind") == "request":
        return f"request {workload['prompt']}+{workload['generate']}"
    return f"context {length}" if workload.get("kind") == "contexts" else str(length)


def stop_text(row: LengthRow) -> str:
    """Why a length stopped, in words; a target reached with a spread too wide is not "precise"."""
    if row.stop == "precise" and row.noisy:
        return f"target reached, {TOO_WIDE}"
    return STOP_TEXTS.get(row.stop, row.stop)


def sampling_rows(view: RecordView, noisy_lengths: set[int]) -> list[LengthRow]:
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
                              chosen["clock"], chosen["reason"], length in noisy_lengths))
    return rows


def widest(view: RecordView) -> float | None:
    widths = [entry["half_width"] for entry in view.sampling["lengths"] if entry.get("half_width") is not None]
    return max(widths) if widths else None


def title_of(view: RecordView) -> str:
    """What the run reached (its widest interval), beside its target: not only what it aimed at."""
    run, target, reached = view.run, view.protocol.get("precision"), widest(view)
    if view.estimator is None:
        sampled = f"{run['repeats']} repetitions"
    elif reached is None:
        sampled = f"rotations until ±{percent(target)}" if target is not None else f"{run['repeats']} repetitions"
    elif target is None:
        sampled = f"{run['repeats']} repetitions, ±{percent(reached)} reached"
    else:
        sampled = f"±{percent(reached)} reached, target ±{percent(target)}"
    return (f"kvbench {run['preset']}: batch {run['batch']}, {view.config['dtype']}, {run['threads']} thread(s), "
            f"{sampled}")


def verdict(view: RecordView, sampling: list[LengthRow]) -> str | None:
    """The run's verdict line: why it fell short of its precision (contention_sentence), or that every length
    reached it, naming the lengths whose spread was too wide to be called precise. None without a target."""
    target = view.protocol.get("precision")
    short = contention_sentence(view, sampling)
    if short is not None or target is None or not sampling:
        return short
    reached = [row for row in sampling if row.stop == "precise"]
    noisy = [str(row.length) for row in sampling if row.noisy]
    line = f"{len(reached)} of {len(sampling)} length(s) reached ±{percent(target)}"
    if noisy:
        line += (f"; at length {', '.join(noisy)} the samples spread too wide to trust their medians ({TOO_WIDE}): "
                 "not precise; rerun on a quieter machine")
    elif len(reached) == len(sampling):
        line += ": precise"
    return line


def contention_sentence(view: RecordView, sampling: list[LengthRow]) -> str | None:
    """When sampling ran out of time or rotations short of its precision, why, in words: what the
    telemetry saw take the machine's time, and what to do about it (None when every length was precise)."""
    target = view.protocol.get("precision")
    loose = [row for row in sampling if row.stop in ("budget", "cap") and row.half_width is not None
             and (target is None or row.half_width > target)]
    if not loose:
        return None
    repetitions = view.every_repetition()
    wall = sum(rep.seconds for rep in repetitions) or 1.0
    cpus = (view.environment.get("system") or {}).get("logical_cores") or 1  # steal is counted over every CPU
    counted = lambda name: sum(rep.telemetry[name] or 0.0 for rep in repetitions)  # noqa: E731  None: unavailable
    shares = [("of the machine's CPU time stolen by the hypervisor", counted("steal_seconds") / (wall * cpus)),
              ("of the timed time spent waiting for a CPU", counted("runqueue_seconds") / wall),
              ("of the timed time throttled", counted("throttled_seconds") / wall)]
    seen = ", ".join(f"{share:.0%} {name}" for name, share in shares if share >= 0.005)
    if sum(share for _, share in shares) >= CONTENDED_TIME:
        what = f"this machine was contended: {seen}"
    else:  # e.g. a busy host that steals cycles the guest's counters never see
        counted = seen or "no steal, waits or throttling"
        what = (f"the samples disagreed more than this machine's counters explain ({counted}: noise from outside "
                "the VM, or a neighbour on the shared cache)")
    wide = max(loose, key=lambda row: row.half_width)
    stop = "--max-seconds" if any(row.stop == "budget" for row in loose) else "--max-repeats"
    if view.workload.is_request:  # one length: the request's
        return (f"{what}; intervals up to ±{wide.half_width:.0%}, short of ±{target:.0%}; rerun on a quieter machine "
                f"or raise {stop}" if target is not None else f"{what}; intervals up to ±{wide.half_width:.0%}")
    lengths = ", ".join(str(row.length) for row in loose)
    return (f"{what}; intervals up to ±{wide.half_width:.0%} (length {wide.length}; {len(loose)} length(s) "
            f"stopped short of ±{target:.0%}: {lengths}); rerun on a quieter machine or raise {stop}"
            if target is not None else f"{what}; intervals up to ±{wide.half_width:.0%}")


def clock_note(sampling: list[LengthRow]) -> str | None:
    """Which lengths' speedups were estimated on CPU time, and why, when any was (None otherwise)."""
    lengths = [row for row in sampling if row.clock != "wall"]
    if not lengths:
        return None
    return (f"speedups at length {', '.join(str(row.length) for row in lengths)} are on the thread's CPU time, "
            f"not wall time, and so are the times beside them: {lengths[0].clock_reason} "
            "(docs/statistics.md, \"Contention\")")


def undisturbed_pairs(view: RecordView, mode: str, length: int) -> set[int] | None:
    """Repetitions where neither the mode's sample nor the baseline's was disturbed; None without telemetry."""
    mine, base = view.repetitions(mode, length), view.repetitions(view.baseline, length)
    if not mine or "cpu_seconds" not in mine[0]:
        return None
    clean_base = {r["repetition"] for r in base if not disturbances(r["seconds"], r)}
    return {r["repetition"] for r in mine if not disturbances(r["seconds"], r)} & clean_base


def device_note(view: RecordView) -> str | None:
    """On a device other than the CPU: the clock its times are on, and the host's time beside the device's, per
    mode (median over its samples of host / device seconds: far above 1, the host issued the work slower than the
    device ran it, launch-bound). None on the CPU, whose times are the host's."""
    device = view.protocol.get("device", "cpu")
    if device == "cpu":
        return None
    ratios = {}
    for mode in view.modes:
        pairs = [r["host_seconds"] / r["seconds"] for n in view.lengths for r in view.repetitions(mode, n)
                 if r.get("host_seconds") and r["seconds"] > 0]
        if pairs:
            ratios[mode] = statistics.median(pairs)
    beside = ", ".join(f"{mode} {ratio:.2f}" for mode, ratio in ratios.items())
    return (f"on {device}: every time is on {view.protocol.get('clock')} (the device's time between events around "
            f"each sample and step), the host's beside it"
            + (f"; median host / device time: {beside}" if beside else ""))

