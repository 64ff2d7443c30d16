"""One benchmark run, end to end: the gate, bytes and peak memory, the sampled rotations, the profile.

`run_benchmark(model, lengths, modes, protocol)` is what `kvbench run` calls; it returns
plain data for the record. An interrupt at any stage ends the run with everything
completed so far kept and the outcome marked interrupted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from kvbench.measure import machine
from kvbench.measure.device import device_of
from kvbench.measure.clock import HOST, Clock, clock_for
from kvbench.measure.sampling import Sample, Sampling, finished, prepared, sample
from kvbench.measure.timing import Protocol, collector_paused, control_mode, heap_frozen, step_durations
from kvbench.model import Decoder
from kvbench.modes import CONTROL, FULL, spec
from kvbench.workloads.decode import check_modes, decode, failed_check, steps, timeable, token_ids
from kvbench.workloads.workload import Loop, matmul_shapes, weights_read_per_step

if TYPE_CHECKING:
    from torch import Tensor


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
    control: str | None = None  # the cached mode timed a second time under the label "control"
    sampling: Sampling = field(default_factory=Sampling)
    machine_probe: dict | None = None  # the fixed workloads of kvbench.measure.machine, at the start and the end
    limits: dict | None = None  # what the machine can stream and multiply, for a request or a contexts run
    compile_seconds: dict | None = None  # compiled mode -> first calls of its compiled functions, compile included
    attention: dict | None = None  # on a device that can tell: mode -> the attention kernels one sample launched


@dataclass(frozen=True)
class Progress:
    """Where a run is, for a progress display: `done` of `total` in one stage (counted, or seconds when `unit` is
    "s"), and `estimate`, the seconds the stage should take, when a measurement made before it says so."""

    stage: str
    done: float
    total: float
    unit: str = ""
    estimate: float | None = None


def run_benchmark(model: Decoder, lengths: list[int], modes: list[str], protocol: Protocol = Protocol(),
                  on_progress: Callable[[Progress], None] | None = None,
                  options: dict | None = None, workload=None, ids=None, clock: Clock | None = None) -> RunOutcome:
    """The machine probe, the gate, bytes and peak memory, the timed rotations, the profile, the probe again.

    `options` maps a kind to the keyword arguments its caches are made with; `workload` (kvbench.workloads)
    says what one sample times: a whole loop per length (default), one request, or one step at a context.
    `on_progress` hears where the run is, with estimates of the long stages: the gate's full-prefix reference
    (from two forwards timed before it) and the timed rotations (from the gate's own timings).
    `ids` (B, >= every length's positions): the token ids to consume (a real model's text) instead of
    random ones drawn from the protocol's seed. `clock` (kvbench.measure.clock; default: the model's device's)
    times the samples, the profile and the gate's estimates.
    """
    modes = check_modes(modes)
    clock = clock_for(model.device) if clock is None else clock
    workload = workload or Loop()
    progress = on_progress or (lambda event: None)
    outcome = RunOutcome(control=control_mode(protocol.control, modes))
    try:
        # one collection of the whole heap per run: the later ones (before each timed call, the memory profile's)
        # walk only what the run allocated since (kvbench.measure.timing.heap_frozen)
        with heap_frozen():
            progress(Progress("machine probe", 0, 1))
            calls = machine.probe_calls()
            outcome.machine_probe = {"workloads": dict(machine.PROBE_CALLS), "repeats": machine.REPEATS,
                                     "start": machine.probe_phase(calls)}
            progress(Progress("machine probe", 1, 1))
            if workload.name != "loop":  # a step's distance to the machine's limit needs the limit
                progress(Progress("machine limits", 0, 1))
                outcome.limits = machine_limits(model, workload, lengths, protocol)
            longest = given_ids(ids, model, protocol, max(workload.positions(n) for n in lengths))
            gate, rotations = gate_and_measure(workload, model, longest, lengths, modes, options, outcome, progress,
                                               clock)
            loops = timed_loops(workload, model, longest, lengths, modes, gate, outcome.control, options)
            outcome.attention = attention_kernels(model, loops[min(lengths)])
            planned = protocol.repeats * sum(len(by_mode) for by_mode in loops.values())
            keep = timed_progress(protocol, planned, protocol.repeats * sum(rotations.values()), outcome, progress)
            if hasattr(workload, "timer_seconds"):  # what timing every step on its own costs each step
                outcome.sampling.step_timer_seconds = workload.timer_seconds()
            sample(loops, protocol, on_sample=keep, state=outcome.sampling, watch=workload.watch(protocol, FULL),
                   limits=round_limits(outcome.limits, protocol), clock=clock)
            if outcome.limits is not None:
                outcome.limits["rounds"] = outcome.sampling.limits
            if protocol.per_step_length is not None:
                profiled = given_ids(ids, model, protocol, protocol.per_step_length)
                outcome.per_step = [
                    {"mode": mode, "length": protocol.per_step_length,
                     "seconds": per_step_seconds(model, profiled, mode, protocol.warmup, options, clock)}
                    for mode in modes if all(timeable(gate[(mode, length)]) for length in lengths)
                ]
            progress(Progress("machine probe", 0, 1))
            outcome.machine_probe["end"] = machine.probe_phase(calls)
            progress(Progress("machine probe", 1, 1))
    except KeyboardInterrupt:
        outcome.interrupted = True
    if any(spec(mode).compiled for mode in modes):
        from kvbench.models.compiled import compile_seconds

        outcome.compile_seconds = {mode: list(compile_seconds[mode]) for mode in modes if mode in compile_seconds}
    return outcome


def timed_progress(protocol: Protocol, planned: int, least: float, outcome: RunOutcome,
                   progress: Callable[[Progress], None]) -> Callable[[Sample], None]:
    """Say the timing has begun, with `least`, the seconds its minimum rotations should take (warm-up aside);
    return what keeps each sample and moves the bar: a count of samples under a fixed count of rotations; until
    precise, the budget's seconds (the most the rotations can take, or the minimum beyond it)."""
    budget = None if protocol.precision is None else max(protocol.max_seconds, least)
    progress(Progress("time", 0, planned, estimate=least) if budget is None else Progress("time", 0, budget, "s", least))

    def keep(kept: Sample) -> None:
        outcome.repetitions.append(kept.to_dict())
        if budget is None:
            progress(Progress("time", len(outcome.repetitions), planned, estimate=least))
        else:
            progress(Progress("time", min(kept.started + kept.seconds, budget), budget, "s", least))

    return keep


def gate_and_measure(workload, model: Decoder, longest, lengths: list[int], modes: list[str], options: dict | None,
                     outcome: RunOutcome, progress: Callable[[Progress], None],
                     clock: Clock = HOST) -> tuple[dict, dict[int, float]]:
    """Every mode's check and memory entry, kept in `outcome` one length at a time (an interrupt keeps the lengths
    already checked); returns the checks by (mode, length) and the seconds one rotation should take per length,
    from the gate's timings: each check ran its mode's work once, as one sample will."""
    forward = forward_seconds(model, longest, clock)
    spans = workload.reference_spans(lengths)
    progress(Progress("reference", 0, 1, estimate=sum(span_seconds(forward, *span) for span in spans)))
    full_loops: dict[int, float] = {}  # the loop's full at each length: its reference ran once, at the longest
    if hasattr(workload, "compute_reference"):
        begun = clock.now_ns()
        workload.compute_reference(model, longest)
        clock.synchronize()
        scale = (clock.now_ns() - begun) / 1e9 / max(span_seconds(forward, *spans[0]), 1e-12)
        full_loops = {n: scale * span_seconds(forward, 1, n) for n in lengths if FULL in modes}
        progress(Progress("reference", 1, 1))
    gate: dict[tuple[str, int], dict] = {}
    rotations: dict[int, float] = {}
    for length in lengths:
        begun = clock.now_ns()
        gate.update(checked(workload, model, longest, length, modes, options))
        clock.synchronize()
        checked_modes = [mode for mode in modes if timeable(gate[(mode, length)])]
        rotations[length] = rotation_seconds((clock.now_ns() - begun) / 1e9, full_loops.get(length, 0.0),
                                             len(checked_modes), outcome.control in checked_modes)
        for mode in modes:
            outcome.checks.append(gate[(mode, length)])
            if timeable(gate[(mode, length)]):  # the device's peaks (none on the CPU) reset for each mode
                found: dict = {}
                peaks = device_of(model.device).memory(
                    lambda: found.update(workload.memory(model, longest, length, mode, options)))
                outcome.memory.append({"mode": mode, "length": length, **found, **peaks})
            progress(Progress("check", len(outcome.checks), len(lengths) * len(modes)))
    progress(Progress("reference", 1, 1))  # a request's or a context's reference runs within each length's gate
    return gate, rotations


def per_step_seconds(model: Decoder, ids: Tensor, mode: str, warmup: int = 1,
                     options: dict | None = None, clock: Clock | None = None) -> list[float]:
    """Duration of every decode step of one loop (step t = position t): the run's per-step profile."""
    import torch

    for _ in range(warmup):
        decode(model, ids, mode, options=options)
    with collector_paused(), torch.inference_mode():
        return step_durations(steps(model, ids, mode, options=options), clock=clock or clock_for(model.device))


def forward_seconds(model: Decoder, ids, clock: Clock = HOST) -> tuple[float, float, int]:
    """(seconds of a full-prefix forward of 1 token, of all T positions of `ids`, T): the ends of the line that
    estimates how long the full-prefix path runs (span_seconds)."""
    import torch

    found = []
    with torch.inference_mode():
        for end in (1, 1, ids.shape[1]):  # the first call pays first-use costs: timed again
            begun = clock.now_ns()
            model(ids[:, :end])
            clock.synchronize()
            found.append((clock.now_ns() - begun) / 1e9)
    return found[1], found[2], ids.shape[1]


def span_seconds(forward: tuple[float, float, int], first: int, last: int) -> float:
    """Seconds of the full-prefix forwards of every prefix from `first` to `last` tokens, a forward's cost taken
    on the line through the two that forward_seconds measured (attention's quadratic share bends the true
    cost below that line between them: an estimate on the long side)."""
    one, whole, positions = forward
    per_token = max(whole - one, 0.0) / max(positions - 1, 1)
    count = last - first + 1
    return count * one + per_token * (count * (first + last) / 2 - count)


def rotation_seconds(gate: float, full_loop: float, checked_modes: int, with_control: bool) -> float:
    """One rotation's seconds at a length from its gate: every checked mode ran its work once (a loop's full did
    not: `full_loop` adds it), and the A/A control runs one more mode's, counted as an average one's."""
    return (gate + full_loop) * (1 + with_control / max(checked_modes, 1))


def given_ids(ids, model: Decoder, protocol: Protocol, positions: int):
    """The first `positions` of the given ids, or random ids from the protocol's seed when none were given, on the
    model's device (a text's ids are read on the host)."""
    if ids is None:
        return token_ids(model.config, protocol.batch, positions, protocol.seed, device=model.device)
    if ids.shape[0] != protocol.batch or ids.shape[1] < positions:
        raise ValueError(f"expected token ids of shape ({protocol.batch}, >= {positions}), got {tuple(ids.shape)}")
    return ids[:, :positions].to(model.device)


def machine_limits(model: Decoder, workload, lengths: list[int], protocol: Protocol) -> dict:
    """Memory bandwidth on one thread and all, matmul throughput at the model's shapes (a decode step's rows
    and the longest prefill's), and the weight bytes a decode step reads; on a device other than the CPU its own
    bandwidth (one entry, "1") and its matmuls in the model's dtype, marked with the device's name."""
    import os

    prefill = workload.prompt if workload.name == "request" else max(lengths)
    everything = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    device = device_of(model.device)
    shapes = matmul_shapes(model, [protocol.batch, protocol.batch * prefill])
    if device.threaded:
        found = machine.limits(shapes, sorted({1, everything}))
    else:
        found = {**machine.limits(shapes, [1], device.name, model.config.dtype, device.cache_bytes()),
                 "device": device.name, "dtype": str(model.config.dtype).removeprefix("torch.")}
    return {**found, "weight_bytes_per_step": weights_read_per_step(model),
            "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}


def round_limits(limits: dict | None, protocol: Protocol) -> machine.RoundLimits | None:
    """The run's limits measured again at the start of every round, beside the samples (a run that measures
    limits: request and contexts): the same buffers' size, the step's own matmul shapes."""
    if limits is None:
        return None
    shapes = [tuple(entry["shape"]) for entry in limits["matmul"] if entry["shape"][0] == protocol.batch]
    if "device" not in limits:
        return machine.RoundLimits(shapes, limits["buffer_bytes"])
    import torch

    return machine.RoundLimits(shapes, limits["buffer_bytes"], limits["device"], getattr(torch, limits["dtype"]))


def attention_kernels(model: Decoder, calls: dict[str, Callable[[], object]]) -> dict | None:
    """mode -> the attention kernels one sample of it launched (one untimed call at the shortest length), on a
    device whose profiler can tell (Device.kernels); None on the CPU."""
    device = device_of(model.device)
    if device.kernels is None:
        return None
    found = {}
    for mode, call in calls.items():
        if mode != CONTROL:  # the control is its mode again
            found[mode] = device.kernels(prepared(call))
            finished(call)
    return found


def checked(workload, model: Decoder, ids, length: int, modes: list[str], options: dict | None) -> dict:
    """{(mode, length): check} from the workload's gate; a mode that raises is a failed check carrying
    the error, so one broken kind cannot cost the others (the loops' gate does the same per mode)."""
    try:
        return {(mode, length): check for mode, check in workload.gate(model, ids, length, modes, options).items()}
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception:  # noqa: BLE001 - find which mode it was, one at a time
        found = {}
        for mode in modes:
            try:
                found[(mode, length)] = workload.gate(model, ids, length, [mode], options)[mode]
            except (KeyboardInterrupt, MemoryError):
                raise
            except Exception as error:  # noqa: BLE001 - any failure of the kind under test is its result
                found[(mode, length)] = failed_check(mode, length, model.config.dtype, error)
        return found


def timed_loops(workload, model: Decoder, longest, lengths: list[int], modes: list[str], gate: dict,
                control: str | None, options: dict | None = None) -> dict[int, dict[str, Callable[[], object]]]:
    """length -> label -> the call to time: every mode that can be timed, and the A/A control (its own call
    object, so that a call's preparation and detail stay its own)."""
    loops = {}
    for length in lengths:
        loops[length] = {mode: workload.call(model, longest, length, mode, options)
                         for mode in modes if timeable(gate[(mode, length)])}
        if control is not None and control in loops[length]:
            loops[length][CONTROL] = workload.call(model, longest, length, control, options)
    return loops
