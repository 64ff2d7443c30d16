"""How many samples to take: whole rotations in rounds, until the speedups are as precise as asked.

A round gives every length still sampling whole rotations (every mode once, in the protocol's
order), so each length's samples are spread over the whole run instead of one stretch of it:
a slow patch of machine time touches every length a little rather than one length a lot. Past
its first `repeats` rotations (one per round), a length runs as many rotations in a round as
fit in the time the slowest length takes for one: every length gets about the same time, and
a length whose loop is short gets the many rotations its noisy samples need.
After each round, a length stops when its rule is met: exactly `repeats` rotations for the
fixed protocol; otherwise at least `repeats`, then the first of
  precise -- every watched ratio's 95% interval is within the target relative half-width,
  cap     -- `max_repeats` rotations,
  budget  -- `max_seconds` of timing since the first sample, all lengths together (the recorded
             name of this stop; everywhere else "budget" means a KV budget, docs/architecture.md).
The rule stops on interval width, never on a p-value, so stopping cannot manufacture a
difference. What stopped each length, and how precise it got, is kept for the record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from kvbench.measure import estimation, stats
from kvbench.measure.clock import HOST, Clock
from kvbench.measure.telemetry import Counters, sample_cost
from kvbench.measure.timing import Protocol, Sample, heap_frozen, rotation_order, time_observed
from kvbench.modes import FULL

Watch = Callable[[list[Sample], int], dict[str, float]]  # (samples, length) -> relative half-widths
STOPS = ("fixed", "precise", "cap", "budget", "interrupted")  # why a length stopped: every stop_reason, and a cut


@dataclass
class LengthSampling:
    """Where one length's sampling ended, and why."""

    length: int
    rotations: int = 0
    stop: str | None = None
    half_width: float | None = None  # the widest watched interval when it stopped (relative)
    half_widths: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"length": self.length, "rotations": self.rotations, "stop": self.stop,
                "half_width": self.half_width, "half_widths": dict(self.half_widths)}


@dataclass
class Sampling:
    """Every sample of a run, and per length where and why its sampling stopped."""

    samples: list[Sample] = field(default_factory=list)
    lengths: dict[int, LengthSampling] = field(default_factory=dict)
    telemetry_unavailable: dict[str, str] = field(default_factory=dict)
    telemetry_seconds: float | None = None  # what a sample's telemetry costs (outside its timed region)
    step_timer_seconds: float | None = None  # a request run: what reading the clock between steps costs a step
    elapsed: float = 0.0  # seconds from the first timed sample to the last
    limits: list[dict] = field(default_factory=list)  # the machine's limits at the start of each round, if asked


def watched_half_widths(samples: list[Sample], length: int, baseline: str,
                        between_run: float = stats.BETWEEN_RUN["speedup"], threads: int = 1) -> dict[str, float]:
    """Relative half-width of every speedup's interval at one length, on the clock its telemetry chooses
    (kvbench.measure.estimation), as the record will report it; of every mode's median time when the baseline
    was not measured there."""
    repetitions = [sample.to_dict() for sample in samples if sample.length == length]
    chosen = estimation.choose(length, repetitions, threads)
    cells = {mode: seconds for (mode, _), seconds in estimation.series(repetitions, chosen.clock).items()}
    widths = {}
    for mode, seconds in cells.items():
        if mode == baseline:
            continue
        if baseline in cells:
            estimate = stats.speedup(cells[baseline], seconds, estimator=chosen.estimator, between_run=between_run,
                                     key=("stop", mode, length))
            widths[mode] = estimate.half_width
        else:
            low, high = stats.median_interval(list(seconds.values()))
            widths[mode] = (high - low) / (low + high)
    return widths


def stop_reason(state: LengthSampling, protocol: Protocol, samples: list[Sample], baseline: str,
                elapsed: float, watch: Watch | None = None) -> str | None:
    if protocol.precision is not None and state.rotations >= protocol.repeats:
        state.half_widths = (watch(samples, state.length) if watch is not None else watched_half_widths(
            samples, state.length, baseline, protocol.between_run, protocol.threads))
        state.half_width = max(state.half_widths.values(), default=None)
    return stats.stop_rule(state.rotations, state.half_width, repeats=protocol.repeats, precision=protocol.precision,
                           max_repeats=protocol.max_repeats, elapsed=elapsed, max_seconds=protocol.max_seconds)


def sample(loops: dict[int, dict[str, Callable[[], object]]], protocol: Protocol, baseline: str = FULL,
           on_sample: Callable[[Sample], None] | None = None, state: Sampling | None = None,
           watch: Watch | None = None, limits: Callable[[], dict] | None = None, clock: Clock = HOST) -> Sampling:
    """Warm every loop up, then run rounds until every length has stopped.

    `loops` maps length -> mode -> the call to time. A call may have a `prepare()`, run before
    each sample outside its timed region (a context's prefill and warm-up steps), a `detail()`,
    read after it (what it timed inside itself: per-step durations, kept with the sample), and a
    `finish()`, run after that, also untimed (the release of a context's cache).
    `watch(samples, length)` gives the relative half-widths the precision target applies to
    (default: every speedup's, on the clock kvbench.measure.estimation chooses). Pass `state` to keep
    what was sampled when an interrupt ends the rounds early (the interrupt propagates;
    unfinished lengths are marked "interrupted"). `limits()`, if given, measures the machine's limits at
    the start of every round (kvbench.measure.machine.RoundLimits), kept in `state.limits` with the round's index.
    Every time it reads, the samples, the telemetry's CPU time and the --max-seconds deadline, is on `clock`.
    """
    state = state if state is not None else Sampling()
    counters = Counters(clock=clock)
    state.telemetry_unavailable, state.telemetry_seconds = dict(counters.unavailable), sample_cost(counters, 200)
    state.lengths = {length: LengthSampling(length) for length in loops}
    try:
        for by_mode in loops.values():
            for run in by_mode.values():
                for _ in range(protocol.warmup):
                    prepared(run)()
                    finished(run)
        with heap_frozen():  # the collection before each sample then costs microseconds, not tens of ms
            run_rounds(loops, protocol, baseline, on_sample, state, watch, counters, limits, clock)
    except KeyboardInterrupt:
        for length_state in state.lengths.values():
            length_state.stop = length_state.stop or "interrupted"
        raise
    finally:
        counters.close()
    return state


def run_rounds(loops: dict[int, dict[str, Callable[[], object]]], protocol: Protocol, baseline: str,
               on_sample: Callable[[Sample], None] | None, state: Sampling, watch: Watch | None, counters: Counters,
               limits: Callable[[], dict] | None = None, clock: Clock = HOST) -> None:
    def seconds_now() -> float:  # the deadline reads the clock the samples are timed on
        return clock.now_ns() / 1e9

    start, round_index, active = seconds_now(), 0, list(loops)
    rotation_seconds: dict[int, float] = {}  # each length's last rotation, wall time between its samples included
    by_length: dict[int, list[Sample]] = {length: [] for length in loops}
    while active:
        if limits is not None:  # between two samples, never inside one
            state.limits.append({"round": round_index, **limits()})
        longest = max(rotation_seconds.get(length, 0.0) for length in active)
        for length in active:
            count = rotations_in_round(state.lengths[length], protocol, rotation_seconds.get(length), longest)
            begun = seconds_now()
            for _ in range(count):
                rotation = state.lengths[length].rotations
                order = rotation_order(list(loops[length]), rotation, protocol.order, protocol.seed, length)
                for position, mode in enumerate(order):
                    run = prepared(loops[length][mode])
                    seconds, telemetry = time_observed(run, counters, clock)
                    kept = Sample(mode, length, rotation, position, seconds, round_index,
                                  round(seconds_now() - start - seconds, 6), telemetry,
                                  run.detail() if hasattr(run, "detail") else None)
                    finished(run)
                    state.samples.append(kept)
                    by_length[length].append(kept)
                    if on_sample is not None:
                        on_sample(kept)
                state.lengths[length].rotations += 1
            rotation_seconds[length] = (seconds_now() - begun) / count
        round_index += 1
        state.elapsed = seconds_now() - start
        for length in list(active):
            reason = stop_reason(state.lengths[length], protocol, by_length[length], baseline, state.elapsed, watch)
            if reason is not None:
                state.lengths[length].stop = reason
                active.remove(length)


def rotations_in_round(state: LengthSampling, protocol: Protocol, own: float | None, longest: float) -> int:
    """How many rotations a length runs in the next round: one under the fixed protocol and for its first
    `repeats`; after that as many as fit in the time the slowest length still sampling takes for one (up to
    the cap), so every length gets about the same time. Short loops are cheap: time, not a count of
    rotations, is what --max-seconds spends, and their samples are the noisiest."""
    if protocol.precision is None or state.rotations < protocol.repeats or not own:
        return 1
    return max(1, min(int(longest / own), protocol.max_repeats - state.rotations))


def prepared(run: Callable[[], object]) -> Callable[[], object]:
    """The call, its untimed preparation done first (a context's prefill), if it has one."""
    if hasattr(run, "prepare"):
        run.prepare()
    return run


def finished(run: Callable[[], object]) -> None:
    """The call's untimed end after a sample (releasing a context's cache), if it has one."""
    if hasattr(run, "finish"):
        run.finish()


def measure_loops(loops: dict[int, dict[str, Callable[[], object]]], protocol: Protocol = Protocol.fixed(),
                  on_sample: Callable[[Sample], None] | None = None) -> list[Sample]:
    """The protocol for any named loops (the asv suites, the comparison scripts): every sample."""
    return sample(loops, protocol, on_sample=on_sample).samples
