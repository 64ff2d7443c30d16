"""The measurement protocol's settings and its smallest parts: one timed call, mode orders, threads, CPU.

:class:`Protocol` holds every setting of a run and its default, once: the CLI reads its
defaults from here, the asv suites and the scripts build one. Each sample times one whole
decode loop with perf_counter_ns, the collector paused, its noise telemetry read around it.
The rounds that decide how many samples to take are in kvbench.measure.sampling; statistics
belong to kvbench.measure.stats and the report; a loop's per-step profile, which needs a model,
to kvbench.workloads.benchmark. torch is imported where threads are set, so that the command
line reads the protocol's defaults without it.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from itertools import islice
from typing import Callable

from kvbench.config import positive_int, positive_number
from kvbench.measure import stats
from kvbench.measure.clock import CLOCKS, HOST, Clock, clock_for
from kvbench.measure.telemetry import Counters
from kvbench.modes import CONTROL, SPECS

__all__ = ["CLOCK", "CONTROL", "DEFAULT_LENGTHS", "GC_POLICY", "ORDERS", "ORDER_RULES", "Protocol", "Sample",
           "collector_paused", "control_mode", "heap_frozen", "least_busy_cpu", "mode_orders", "pin_cpu", "rotated",
           "rotation_order", "set_threads", "step_durations", "time_call", "time_observed"]

DEFAULT_LENGTHS = (16, 32, 64, 128, 256, 512)
ORDERS = ("random", "rotate")
GC_POLICY = ("collect before each sample, disabled while timing; the heap alive when sampling starts frozen out of "
             "collection")
ORDER_RULES = {
    "rotate": "rotating: rotation r runs modes[r % m:] + modes[:r % m]",
    "random": "random: each rotation runs the modes in an order drawn from a generator seeded by (seed, length, r)",
}
CLOCK = HOST.name  # what a record names as its clock (kvbench.measure.clock)


@dataclass(frozen=True)
class Protocol:
    """How a run measures: the one source of its settings and their defaults.

    With a `precision`, each length runs at least `repeats` rotations, then more until the
    95% interval of every cached mode's speedup is that narrow (relative half-width), or
    `max_repeats` rotations or `max_seconds` of timing are reached. Without one, every
    length runs exactly `repeats` rotations: the source document's fixed protocol.
    """

    repeats: int = 7  # rotations per length: exactly, or at least when a precision is targeted
    precision: float | None = 0.05  # target relative half-width of every speedup's 95% interval
    max_repeats: int = 1001  # rotations per length at most (a short loop may need hundreds: kvbench.measure.sampling)
    max_seconds: float = 75.0  # timing deadline from the first sample, all lengths together; `repeats` always run
    between_run: float = stats.BETWEEN_RUN["speedup"]  # relative SD of a speedup between runs (stats.BETWEEN_RUN)
    order: str = "random"  # mode order within a rotation (ORDER_RULES)
    cpu: str = "none"  # "none", "auto" (the least busy CPU) or a CPU number to pin the process to
    control: str = "auto"  # A/A control: "auto" (the first cached mode), "none", or a cached mode
    warmup: int = 1  # untimed loops per mode and length before timing
    batch: int = 1  # sequences per request
    seed: int = 0  # seeds the weights, the token ids and the random orders
    threads: int = 1  # torch intra- and inter-op threads
    per_step_length: int | None = None  # also profile every step of one loop at this length
    device: str = "cpu"  # where the model, its caches and ids live: a device type with a clock (kvbench.measure.clock)

    def __post_init__(self) -> None:
        counts = {"repeats": 1, "max_repeats": 1, "warmup": 0, "batch": 1, "seed": 0, "threads": 1, "per_step_length": 1}
        for name, lowest in counts.items():  # name -> its lowest value
            value = getattr(self, name)
            if value is None and name == "per_step_length":
                continue
            positive_int(name, value, lowest)
        if self.precision is not None and not (isinstance(self.precision, (int, float))
                                               and 0 < self.precision < 1 and math.isfinite(self.precision)):
            raise ValueError(f"precision must be a relative half-width in (0, 1) or None, got {self.precision!r}")
        positive_number("max_seconds", self.max_seconds)
        if not (isinstance(self.between_run, (int, float)) and 0 <= self.between_run < 0.5):
            raise ValueError(f"between_run must be a relative standard deviation in [0, 0.5), got {self.between_run!r}")
        floor = stats.rerun_floor(self.between_run)
        if self.precision is not None and self.precision <= floor:
            raise ValueError(f"precision {self.precision:g} cannot be reached: a rerun's speedup varies by "
                             f"±{floor:.1%} whatever the sample count, with between-run variation "
                             f"{self.between_run:.1%}; ask for more than {floor:.3f}")
        if self.precision is not None and self.max_repeats < self.repeats:
            raise ValueError(f"max_repeats must be at least repeats ({self.repeats}), got {self.max_repeats}")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {list(ORDERS)}, got {self.order!r}")
        if self.device not in CLOCKS:
            raise ValueError(f"device must be one of {sorted(CLOCKS)}, got {self.device!r}")
        if self.cpu not in ("none", "auto") and not (isinstance(self.cpu, str) and self.cpu.isdigit()):
            raise ValueError(f"cpu must be 'none', 'auto' or a CPU number, got {self.cpu!r}")

    @classmethod
    def fixed(cls, repeats: int = 7, **settings) -> Protocol:
        """The source document's protocol: exactly `repeats` rotations per length."""
        return cls(repeats=repeats, precision=None, **settings)

    def describe(self, in_effect: dict) -> dict:
        """The record's "protocol" section: every setting that shapes the samples, and what took effect."""
        return {**asdict(self), "gc": GC_POLICY, "order_rule": ORDER_RULES[self.order],
                "clock": clock_for(self.device).name, **in_effect}

    def run_section(self, preset: str, lengths: list[int], modes: list[str]) -> dict:
        """The record's "run" section: what was measured, with these settings."""
        return {"preset": preset, "lengths": list(lengths), "modes": list(modes), "batch": self.batch,
                "seed": self.seed, "repeats": self.repeats, "warmup": self.warmup, "threads": self.threads,
                "per_step_length": self.per_step_length}


def control_mode(choice: str, modes: list[str]) -> str | None:
    """The cached mode an A/A control repeats: "auto" picks the first cached mode, "none" none."""
    cached = [mode for mode in modes if SPECS[mode].keeps_state]
    if choice == "none" or not cached:
        return None
    if choice == "auto":
        return cached[0]
    if choice not in cached:
        raise ValueError(f"control must be 'auto', 'none' or one of the cached modes run {cached}, got {choice!r}")
    return choice


@dataclass(frozen=True)
class Sample:
    mode: str
    length: int
    repetition: int  # the rotation at this length, from 0
    order: int  # position of this mode within its rotation, from 0
    seconds: float
    round: int = 0  # the run's round (kvbench.measure.sampling: about the same time for every length still sampling)
    started: float = 0.0  # seconds since the first timed sample of the run
    telemetry: dict | None = None
    detail: dict | None = None  # what the timed call measured inside itself (a request's per-step durations)

    def to_dict(self) -> dict:  # by hand: the sampler's stop rule reads every sample after every round
        return {"mode": self.mode, "length": self.length, "repetition": self.repetition, "order": self.order,
                "seconds": self.seconds, "round": self.round, "started": self.started, **(self.telemetry or {}),
                **(self.detail or {})}


def set_threads(threads: int) -> dict:
    """Pin torch's intra- and inter-op pools; return what is actually in effect.

    The inter-op pool can be sized only before its first use in a process, so a
    late call is recorded as what it is rather than assumed to have worked.
    """
    import torch

    positive_int("threads", threads)
    available = os.cpu_count() or 1
    if threads > available:  # far more threads than CPUs only oversubscribes, and crashes torch's attention
        raise ValueError(f"threads must be at most the {available} logical CPUs of this machine, got {threads}")
    torch.set_num_threads(threads)
    note = None
    if torch.get_num_interop_threads() != threads:
        try:
            torch.set_num_interop_threads(threads)
        except RuntimeError as error:
            note = f"inter-op threads could not be changed: {error}"
    in_effect = {
        "requested": threads,
        "intra_op": torch.get_num_threads(),
        "inter_op": torch.get_num_interop_threads(),
    }
    if note:
        in_effect["note"] = note
    return in_effect


def pin_cpu(choice: str) -> dict:
    """Pin this process to one CPU ("auto": the least busy over a quarter second); say what took effect."""
    if not hasattr(os, "sched_setaffinity"):
        return {"requested": choice, "cpus": None, "note": "CPU affinity cannot be set on this platform"}
    allowed = sorted(os.sched_getaffinity(0))
    if choice == "none":
        return {"requested": choice, "cpus": allowed}
    cpu = least_busy_cpu(allowed) if choice == "auto" else int(choice)
    if cpu not in allowed:
        raise ValueError(f"cpu must be one of the CPUs this process may use {allowed}, got {cpu}")
    os.sched_setaffinity(0, {cpu})
    return {"requested": choice, "cpus": sorted(os.sched_getaffinity(0))}


def least_busy_cpu(allowed: list[int], window: float = 0.25) -> int:
    def busy() -> dict[int, int]:
        out = {}
        try:
            with open("/proc/stat") as stat:
                for line in stat:
                    name, *ticks = line.split()
                    if name.startswith("cpu") and name[3:].isdigit():
                        values = [int(t) for t in ticks]
                        out[int(name[3:])] = sum(values) - values[3] - values[4]  # all but idle and iowait
        except OSError:
            pass
        return out

    before = busy()
    time.sleep(window)
    after = busy()
    return min(allowed, key=lambda cpu: (after.get(cpu, 0) - before.get(cpu, 0), -cpu))


def rotated(modes: list[str], rotation: int) -> list[str]:
    """The modes shifted left by `rotation`: over m rotations each mode leads once."""
    shift = rotation % len(modes)
    return modes[shift:] + modes[:shift]


def mode_orders(modes: list[str], repeats: int) -> list[list[str]]:
    """A rotation per repetition: with m modes and repeats a multiple of m, each
    mode runs in each position equally often (for two modes: alternation)."""
    return [rotated(modes, r) for r in range(repeats)]


def rotation_order(modes: list[str], rotation: int, order: str, seed: int, length: int) -> list[str]:
    """The modes of one rotation, in the protocol's order (seeded: the same run, the same orders)."""
    if order == "rotate":
        return rotated(modes, rotation)
    shuffled = list(modes)
    random.Random(f"kvbench-order:{seed}:{length}:{rotation}").shuffle(shuffled)
    return shuffled


@contextlib.contextmanager
def collector_paused():
    """Collect first, then keep the collector out of the timed region; restore it after."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_open_frozen_sections = 0  # heap_frozen sections open now (a run's and its sampling's, on one thread)


@contextlib.contextmanager
def heap_frozen():
    """Collect once, then keep every object alive now out of later collections (gc.freeze).

    With torch imported a full collection walks nearly 200,000 objects (36 ms on a 2-core VM):
    before every sample it took longer than most of the loops it kept garbage away from, and more
    than half of a run's sampling time. Frozen, the collection before each sample walks only
    what was allocated since: it still keeps one loop's garbage out of the next timed region, in
    microseconds.

    A freeze that was in place before (an outer heap_frozen, or the program's own gc.freeze) is kept:
    gc.unfreeze thaws every frozen object, not only this section's, so only the section that froze
    first thaws. What this section froze then stays frozen with the caller's objects."""
    global _open_frozen_sections
    # gc.get_freeze_count() walks every frozen object (10 ms for torch's): only an outermost section asks it
    thaw = _open_frozen_sections == 0 and gc.get_freeze_count() == 0
    gc.collect()
    gc.freeze()
    _open_frozen_sections += 1
    try:
        yield
    finally:
        _open_frozen_sections -= 1
        if thaw:
            gc.unfreeze()


def time_call(run: Callable[[], object], clock: Clock = HOST) -> float:
    """Seconds for one call on `clock`, with the collector out of the timed region."""
    with collector_paused():
        start = clock.mark()
        run()
        end = clock.mark()
        clock.synchronize()
    return clock.elapsed_ns(start, end) / 1e9


def step_durations(stepping: Iterator, count: int | None = None, clock: Clock = HOST) -> list[float]:
    """The per-step timer: seconds of each of the next `count` steps of an iterator (every step left, by default),
    on `clock`. The clock is read once between two steps, so a step's time runs from the end of the one before it
    to its own result (a request's steps, a context's, a loop's per-step profile). A device clock marks each step
    with an event and waits for the device once, after the last: its steps are the device's, not the launches'."""
    mark = clock.mark  # bound once: read at every step
    marks = [mark()]
    for _ in islice(stepping, count):
        marks.append(mark())
    clock.synchronize()
    elapsed = clock.elapsed_ns
    return [elapsed(marks[i - 1], marks[i]) / 1e9 for i in range(1, len(marks))]


def time_observed(run: Callable[[], object], counters: Counters, clock: Clock = HOST) -> tuple[float, dict]:
    """Seconds for one call on `clock` and what the telemetry saw during it (read outside the timed region)."""
    with collector_paused():
        before = counters.read(machine_wide=False, opening=True)  # the last sample's end stands for the costly counters
        start = clock.mark()
        run()
        end = clock.mark()
        clock.synchronize()  # the sample ends when the device is done
        after = counters.read()
    seen = counters.difference(before, after)
    if clock.host_beside:  # the host's time beside the device's: a launch-bound sample shows as host >> device
        seen["host_seconds"] = clock.host_elapsed_ns(start, end) / 1e9
    return clock.elapsed_ns(start, end) / 1e9, seen

