"""The measurement protocol. Returns raw samples; statistics belong to the report.

Fixed seed, batch, model dimensions, dtype and thread count; one warmup per mode;
N repetitions whose mode order rotates so that every mode runs in every position
equally often; each sample times one whole decode loop with perf_counter_ns.
:class:`Protocol` holds every setting and its default, once.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Callable

import torch
from torch import Tensor

from kvbench.decode import check_modes, decode, decode_full, decode_steps, run_gate, timeable, token_ids
from kvbench.memory import memory_profile
from kvbench.model import Decoder

DEFAULT_LENGTHS = (16, 32, 64, 128, 256, 512)
GC_POLICY = "collect before each sample, disabled while timing"
ORDER_RULE = "rotating: repetition r runs modes[r % m:] + modes[:r % m]"
CLOCK = "time.perf_counter_ns"


@dataclass(frozen=True)
class Protocol:
    """How a run measures: the one source of its settings and their defaults."""

    repeats: int = 7  # timed repetitions per mode and length
    warmup: int = 1  # untimed loops per mode and length before timing
    batch: int = 1  # sequences per request
    seed: int = 0  # seeds the weights and the token ids
    threads: int = 1  # torch intra- and inter-op threads
    per_step_length: int | None = None  # also profile every step of one loop at this length

    def __post_init__(self) -> None:
        for item in fields(self):
            value, lowest = getattr(self, item.name), 0 if item.name in ("warmup", "seed") else 1
            if value is None and item.name == "per_step_length":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
                raise ValueError(f"{item.name} must be an integer >= {lowest}, got {value!r}")

    def describe(self, threads_in_effect: dict) -> dict:
        """The record's "protocol" section: the settings that shape the samples, and what took effect."""
        return {"repeats": self.repeats, "warmup": self.warmup, "threads": self.threads, "gc": GC_POLICY,
                "order": ORDER_RULE, "clock": CLOCK, "threads_in_effect": threads_in_effect}

    def run_section(self, preset: str, lengths: list[int], modes: list[str]) -> dict:
        """The record's "run" section: what was measured, with these settings."""
        return {"preset": preset, "lengths": list(lengths), "modes": list(modes), "batch": self.batch,
                "seed": self.seed, "repeats": self.repeats, "warmup": self.warmup, "threads": self.threads,
                "per_step_length": self.per_step_length}


@dataclass(frozen=True)
class Sample:
    mode: str
    length: int
    repetition: int
    order: int  # position of this mode within its repetition, from 0
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def set_threads(threads: int) -> dict:
    """Pin torch's intra- and inter-op pools; return what is actually in effect.

    The inter-op pool can be sized only before its first use in a process, so a
    late call is recorded as what it is rather than assumed to have worked.
    """
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
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


def mode_orders(modes: list[str], repeats: int) -> list[list[str]]:
    """A rotation per repetition: with m modes and repeats a multiple of m, each
    mode runs in each position equally often (for two modes: alternation)."""
    m = len(modes)
    return [modes[r % m :] + modes[: r % m] for r in range(repeats)]


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


def time_call(run: Callable[[], object]) -> float:
    """Seconds for one call, with the collector out of the timed region."""
    with collector_paused():
        start = time.perf_counter_ns()
        run()
        elapsed = time.perf_counter_ns() - start
    return elapsed / 1e9


def measure(model: Decoder, ids_by_length: dict[int, Tensor], modes: list[str],
            protocol: Protocol = Protocol(), on_sample: Callable[[Sample], None] | None = None) -> list[Sample]:
    """Time every mode at every length; returns every repetition in the order run."""
    modes = check_modes(modes)
    loops = {
        length: {mode: (lambda ids=ids, mode=mode: decode(model, ids, mode)) for mode in modes}
        for length, ids in ids_by_length.items()
    }
    return measure_loops(loops, protocol, on_sample)


def measure_loops(loops: dict[int, dict[str, Callable[[], object]]], protocol: Protocol = Protocol(),
                  on_sample: Callable[[Sample], None] | None = None) -> list[Sample]:
    """The protocol itself, for any named loops: per length, `warmup` untimed calls per
    mode, then `repeats` repetitions in rotating mode order."""
    samples = []
    for length, by_mode in loops.items():
        modes = list(by_mode)
        for mode in modes:
            for _ in range(protocol.warmup):
                by_mode[mode]()
        for repetition, order in enumerate(mode_orders(modes, protocol.repeats)):
            for position, mode in enumerate(order):
                sample = Sample(mode, length, repetition, position, time_call(by_mode[mode]))
                samples.append(sample)
                if on_sample is not None:
                    on_sample(sample)
    return samples


def per_step_seconds(model: Decoder, ids: Tensor, mode: str, warmup: int = 1) -> list[float]:
    """Duration of every decode step of one loop (step t = position t)."""
    for _ in range(warmup):
        decode(model, ids, mode)
    durations = []
    with collector_paused(), torch.inference_mode():
        steps = decode_steps(model, ids, mode)
        while True:
            start = time.perf_counter_ns()
            if next(steps, None) is None:
                break
            durations.append((time.perf_counter_ns() - start) / 1e9)
    return durations


@dataclass
class RunOutcome:
    """Everything one benchmark run produced, as plain data for the record.

    ``interrupted`` says that a KeyboardInterrupt (Ctrl-C, or a signal the caller turned
    into one) ended the run early: everything completed before it is kept.
    """

    checks: list[dict] = field(default_factory=list)
    repetitions: list[dict] = field(default_factory=list)
    memory: list[dict] = field(default_factory=list)
    per_step: list[dict] | None = None
    interrupted: bool = False


def run_benchmark(model: Decoder, lengths: list[int], modes: list[str], protocol: Protocol = Protocol(),
                  on_progress: Callable[[str, int, int], None] | None = None) -> RunOutcome:
    """The gate first, then bytes and peak memory, then the timed repetitions, then the profile.

    An interrupt at any stage ends the run with everything completed so far kept and the
    outcome marked interrupted; nothing after it is run.
    """
    modes = check_modes(modes)
    progress = on_progress or (lambda stage, done, total: None)
    outcome = RunOutcome()
    try:
        longest = token_ids(model.config, protocol.batch, max(lengths), protocol.seed)
        progress("reference", 0, 1)
        reference = decode_full(model, longest, keep_logits=True)
        gate: dict[tuple[str, int], dict] = {}
        for length in lengths:  # one length at a time, so an interrupt keeps the lengths already checked
            gate.update(run_gate(model, longest, [length], modes, reference=reference))
            for mode in modes:
                outcome.checks.append(gate[(mode, length)])
                if timeable(gate[(mode, length)]):
                    outcome.memory.append({"mode": mode, "length": length,
                                           **memory_profile(model, longest[:, :length], mode)})
                progress("check", len(outcome.checks), len(lengths) * len(modes))
        _time_every_length(model, longest, lengths, modes, gate, protocol, outcome, progress)
        if protocol.per_step_length is not None:
            outcome.per_step = _profile_steps(model, modes, lengths, gate, protocol)
    except KeyboardInterrupt:
        outcome.interrupted = True
    return outcome


def _time_every_length(model, longest, lengths, modes, gate, protocol, outcome, progress) -> None:
    total = len(lengths) * len(modes) * protocol.repeats

    def keep(sample: Sample) -> None:
        outcome.repetitions.append(sample.to_dict())
        progress("time", len(outcome.repetitions), total)

    for length in lengths:
        timed = [mode for mode in modes if timeable(gate[(mode, length)])]
        measure(model, {length: longest[:, :length]}, timed, protocol, on_sample=keep)


def _profile_steps(model, modes, lengths, gate, protocol) -> list[dict]:
    ids = token_ids(model.config, protocol.batch, protocol.per_step_length, protocol.seed)
    return [{"mode": mode, "length": protocol.per_step_length,
             "seconds": per_step_seconds(model, ids, mode, protocol.warmup)}
            for mode in modes if all(timeable(gate[(mode, length)]) for length in lengths)]
