"""kvbench.measure.sampling: rounds over the lengths, whole rotations, and the rule that stops each length.

The timed calls are replaced by a script of durations, so that every stopping rule is
reached on purpose: the fixed protocol, "precise", the cap, the budget, an interrupt.
"""

from __future__ import annotations

import itertools
import time

import pytest

import kvbench.measure.sampling as sampling
from kvbench.measure.sampling import Sampling, sample, stop_reason, watched_half_widths
from kvbench.measure.telemetry import FIELDS
from kvbench.measure.timing import Protocol, Sample, rotation_order


class SecondsClock:
    """A clock whose wall time is `seconds()` (the thread's CPU time is the real one): the deadline's reads."""

    name = "scripted"

    def __init__(self, seconds) -> None:
        self.seconds = seconds

    def now_ns(self) -> int:
        return round(self.seconds() * 1e9)

    cpu_ns = staticmethod(time.thread_time_ns)

    def synchronize(self) -> None:
        pass


@pytest.fixture
def scripted(monkeypatch):
    """durations[label] -> an iterator of seconds; each timed call returns the next one."""
    durations: dict[str, itertools.cycle] = {}
    calls: list[str] = []

    def time_observed(run, probe, clock):
        label = run()
        calls.append(label)
        return next(durations[label]), dict.fromkeys(FIELDS)

    monkeypatch.setattr(sampling, "time_observed", time_observed)
    return durations, calls


def loops(lengths, labels):
    return {length: {label: (lambda label=label: label) for label in labels} for length in lengths}


def test_the_fixed_protocol_runs_exactly_repeats_rotations_in_rounds_over_the_lengths(scripted):
    durations, calls = scripted
    durations.update(full=itertools.cycle([2.0]), static=itertools.cycle([1.0]))
    protocol = Protocol.fixed(3, warmup=1, order="rotate")
    state = sample(loops([4, 8], ["full", "static"]), protocol)
    assert calls[:4] == ["full", "static", "full", "static"]  # one warmup per mode and length first
    timed = [(s.length, s.repetition, s.mode, s.round) for s in state.samples]
    assert timed == [(length, r, mode, r) for r in range(3) for length in (4, 8)
                     for mode in rotation_order(["full", "static"], r, "rotate", 0, length)]
    assert {length: (s.rotations, s.stop) for length, s in state.lengths.items()} == {4: (3, "fixed"), 8: (3, "fixed")}
    assert all(s.telemetry is not None for s in state.samples)


def test_samples_carry_when_they_started_in_the_order_they_ran():
    state = sample(loops([4, 8], ["full", "static"]), Protocol.fixed(3, warmup=0))
    starts = [s.started for s in state.samples]
    assert len(starts) == 12 and starts == sorted(starts) and starts[0] >= 0
    assert state.elapsed >= starts[-1]


def test_a_precise_length_stops_at_the_minimum_and_a_noisy_one_keeps_sampling(scripted):
    durations, _ = scripted
    steady = itertools.cycle([1.0, 1.001, 0.999])
    noisy = itertools.cycle([1.0, 1.5, 0.7, 1.3, 0.8, 1.6, 0.6])
    durations.update(full=itertools.cycle([2.0]), quiet=steady, loud=noisy)
    protocol = Protocol(repeats=7, precision=0.05, max_repeats=30, max_seconds=1e6, control="none")
    state = sample({4: {"full": lambda: "full", "quiet": lambda: "quiet"},
                    8: {"full": lambda: "full", "loud": lambda: "loud"}}, protocol)
    quiet, loud = state.lengths[4], state.lengths[8]
    assert (quiet.rotations, quiet.stop) == (7, "precise") and quiet.half_width <= 0.05
    assert (loud.rotations, loud.stop) == (30, "cap") and loud.half_width > 0.05
    assert set(loud.half_widths) == {"loud"}
    later = [s for s in state.samples if s.round >= 7]
    assert {s.length for s in later} == {8}  # a stopped length is no longer sampled


def test_the_budget_stops_every_length_still_sampling(scripted):
    durations, _ = scripted
    durations.update(full=itertools.cycle([2.0]), loud=itertools.cycle([1.0, 1.5, 0.7, 1.3, 0.8, 1.6, 0.6]))
    ticks = itertools.count(0.0, 1.0)  # one "second" passes at every look at the clock
    protocol = Protocol(repeats=5, precision=0.01, max_repeats=1000, max_seconds=50.0, control="none",
                        between_run=0.0)
    state = sample(loops([4, 8], ["full", "loud"]), protocol, clock=SecondsClock(lambda: next(ticks)))
    assert {s.stop for s in state.lengths.values()} == {"budget"}
    assert all(5 <= s.rotations < 1000 for s in state.lengths.values())


def test_the_minimum_rotations_are_run_whatever_the_budget(scripted):
    durations, _ = scripted
    durations.update(full=itertools.cycle([2.0]), loud=itertools.cycle([1.0, 1.5, 0.7]))
    ticks = itertools.count(0.0, 100.0)
    state = sample(loops([4], ["full", "loud"]), Protocol(repeats=7, precision=0.01, max_seconds=1.0,
                                                          between_run=0.0), clock=SecondsClock(lambda: next(ticks)))
    assert (state.lengths[4].rotations, state.lengths[4].stop) == (7, "budget")


def test_without_a_baseline_the_rule_watches_each_modes_median(scripted):
    durations, _ = scripted
    durations.update(static=itertools.cycle([1.0, 1.002, 0.998]), paged=itertools.cycle([2.0, 2.002, 1.998]))
    state = sample(loops([4], ["static", "paged"]), Protocol(repeats=9, precision=0.05, control="none"))
    assert state.lengths[4].stop == "precise" and set(state.lengths[4].half_widths) == {"static", "paged"}


def test_an_interrupt_keeps_the_samples_and_marks_unfinished_lengths(scripted):
    durations, _ = scripted
    counter = itertools.count()

    def explode():
        if next(counter) == 5:
            raise KeyboardInterrupt
        return 1.0

    durations.update(full=itertools.cycle([2.0]), static=(explode() for _ in itertools.count()))
    state = Sampling()
    with pytest.raises(KeyboardInterrupt):
        sample(loops([4, 8], ["full", "static"]), Protocol.fixed(4, warmup=0, order="rotate"), state=state)
    assert 0 < len(state.samples) < 16
    assert {s.stop for s in state.lengths.values()} == {"interrupted"}


def test_stop_reason_follows_the_rule_in_its_order():
    state = sampling.LengthSampling(4, rotations=3)
    fixed = Protocol.fixed(3)
    assert stop_reason(state, fixed, [], "full", 0.0) == "fixed"
    targeted = Protocol(repeats=5, precision=0.05, max_repeats=6, max_seconds=10.0)
    assert stop_reason(state, targeted, [], "full", 1e9) is None  # below the minimum: go on, whatever the budget
    samples = [Sample(mode, 4, r, 0, seconds) for r in range(6)
               for mode, seconds in (("full", 2.0 + 0.5 * (r % 3)), ("static", 1.0))]
    state.rotations = 5
    assert stop_reason(state, targeted, samples, "full", 0.0) is None
    assert stop_reason(state, targeted, samples, "full", 20.0) == "budget"
    state.rotations = 6
    assert stop_reason(state, targeted, samples, "full", 0.0) == "cap"


def test_half_widths_are_those_of_the_speedups_the_report_prints():
    from kvbench.measure import stats

    samples = [Sample(mode, 4, r, 0, seconds) for r in range(15)
               for mode, seconds in (("full", 2.0 + 0.01 * r), ("static", 1.0 + 0.003 * (r % 4)))]
    widths = watched_half_widths(samples, 4, "full")
    expected = stats.speedup({r: 2.0 + 0.01 * r for r in range(15)}, {r: 1.0 + 0.003 * (r % 4) for r in range(15)},
                             key=("stop", "static", 4))
    assert widths == {"static": pytest.approx(expected.half_width)}


@pytest.fixture
def clocked(monkeypatch):
    """A fake clock that moves only by what each timed call is scripted to take: durations[(length, label)]
    cycles through its seconds."""
    now = [0.0]
    durations: dict[tuple[int, str], itertools.cycle] = {}

    def time_observed(run, probe, clock):
        seconds = next(durations[run()])
        now[0] += seconds
        return seconds, dict.fromkeys(FIELDS)

    monkeypatch.setattr(sampling, "time_observed", time_observed)
    return durations, SecondsClock(lambda: now[0])


def keyed_loops(lengths, labels):
    return {length: {label: (lambda key=(length, label): key) for label in labels} for length in lengths}


def test_past_its_minimum_a_short_length_runs_as_many_rotations_as_fit_in_the_slowest_ones(clocked):
    clocked, clock = clocked
    # length 4's rotation takes 4 units, length 8's 40 (the modes' times vary, their sum does not):
    # after the minimum, 4 runs ten rotations a round
    unit = 1 / 1024  # exact in binary, so the clock's sums are exact
    clocked.update({(4, "full"): itertools.cycle([2 * unit, 3 * unit, unit, 2.5 * unit]),
                    (4, "loud"): itertools.cycle([2 * unit, unit, 3 * unit, 1.5 * unit]),
                    (8, "full"): itertools.cycle([20 * unit, 30 * unit, 10 * unit, 25 * unit]),
                    (8, "loud"): itertools.cycle([20 * unit, 10 * unit, 30 * unit, 15 * unit])})
    protocol = Protocol(repeats=3, precision=0.01, max_repeats=1000, max_seconds=2.0, control="none", between_run=0.0)
    state = sample(keyed_loops([4, 8], ["full", "loud"]), protocol, clock=clock)
    per_round = {}
    for kept in state.samples:
        per_round.setdefault((kept.length, kept.round), set()).add(kept.repetition)
    assert [len(per_round[(4, r)]) for r in range(5)] == [1, 1, 1, 10, 10]
    assert [len(per_round[(8, r)]) for r in range(5)] == [1, 1, 1, 1, 1]
    assert {s.stop for s in state.lengths.values()} == {"budget"}
    # time, not rotations, is shared: each length spent about half the budget
    spent = {length: sum(k.seconds for k in state.samples if k.length == length) for length in (4, 8)}
    assert spent[4] == pytest.approx(spent[8], rel=0.15)
    # the cap bounds a round too, and the fixed protocol keeps one rotation a round
    capped = sample(keyed_loops([4, 8], ["full", "loud"]), Protocol(repeats=3, precision=0.01, max_repeats=8,
                                                                    max_seconds=10.0, control="none", between_run=0.0))
    assert (capped.lengths[4].rotations, capped.lengths[4].stop) == (8, "cap")
    fixed = sample(keyed_loops([4, 8], ["full", "loud"]), Protocol.fixed(5, warmup=0))
    assert {(k.length, k.round) for k in fixed.samples} == {(n, r) for n in (4, 8) for r in range(5)}


def test_rotations_in_round_is_one_until_a_length_has_its_minimum_and_a_timed_rotation():
    protocol = Protocol(repeats=3, max_repeats=50)
    young, grown = sampling.LengthSampling(4, rotations=2), sampling.LengthSampling(4, rotations=45)
    assert sampling.rotations_in_round(young, protocol, 0.001, 0.1) == 1
    assert sampling.rotations_in_round(sampling.LengthSampling(4, rotations=3), protocol, None, 0.1) == 1
    assert sampling.rotations_in_round(sampling.LengthSampling(4, rotations=3), protocol, 0.001, 0.1) == 47
    assert sampling.rotations_in_round(grown, protocol, 0.001, 0.1) == 5  # up to the cap
    assert sampling.rotations_in_round(sampling.LengthSampling(4, rotations=3), protocol, 0.1, 0.1) == 1
    assert sampling.rotations_in_round(sampling.LengthSampling(4, rotations=3), Protocol.fixed(3), 0.001, 0.1) == 1


def test_the_heap_is_frozen_out_of_collection_while_sampling_and_released_after(thawed_heap):
    import gc

    seen = []

    def probe_the_collector():
        seen.append((gc.get_freeze_count(), gc.isenabled()))

    sample({4: {"full": probe_the_collector, "static": probe_the_collector}}, Protocol.fixed(2, warmup=1))
    # warmup runs before the freeze; every timed call runs frozen, with the collector off
    assert seen[:2] == [(0, True)] * 2
    assert len(seen) == 6 and all(frozen > 0 and not enabled for frozen, enabled in seen[2:])
    assert gc.get_freeze_count() == 0 and gc.isenabled()


# --- pinned by value -------------------------------------------------------------------------------


def test_the_rule_stops_on_the_widest_of_several_watched_intervals():
    widths = {"static": 0.01, "paged": 0.08, "concat": 0.03}
    protocol = Protocol(repeats=3, precision=0.05, max_repeats=100, max_seconds=1e9)
    state = sampling.LengthSampling(4, rotations=3)
    assert stop_reason(state, protocol, [], "full", 0.0, watch=lambda samples, length: widths) is None
    assert state.half_width == 0.08 and state.half_widths == widths
    at_target = Protocol(repeats=3, precision=0.08, max_repeats=100, max_seconds=1e9)
    assert stop_reason(state, at_target, [], "full", 0.0, watch=lambda samples, length: widths) == "precise"
    nothing = sampling.LengthSampling(4, rotations=3)  # nothing watched: no width, no precision stop
    assert stop_reason(nothing, at_target, [], "full", 0.0, watch=lambda samples, length: {}) is None
    assert nothing.half_width is None
    assert nothing.to_dict() == {"length": 4, "rotations": 3, "stop": None, "half_width": None, "half_widths": {}}


def test_without_a_baseline_the_half_width_is_that_of_the_median_interval():
    seconds = {"static": [1.0, 1.1, 0.9, 1.2, 0.8, 1.05, 0.95], "paged": [2.0] * 7}
    samples = [Sample(mode, 4, r, 0, values[r]) for mode, values in seconds.items() for r in range(7)]
    widths = watched_half_widths(samples, 4, "full")
    # 7 values: the order statistics x(1) and x(7), the range: (1.2 - 0.8) / (0.8 + 1.2)
    assert widths == {"static": pytest.approx(0.2), "paged": 0.0}


def test_each_sample_started_when_the_clock_says_it_did(clocked):
    clocked, clock = clocked
    unit = 1 / 1024
    clocked.update({(4, "full"): itertools.cycle([2 * unit]), (4, "static"): itertools.cycle([unit])})
    state = sample(keyed_loops([4], ["full", "static"]), Protocol.fixed(2, warmup=1, order="rotate"), clock=clock)
    # warmup (3 units) moves the clock before the first sample; starts count from the run's first sample
    took = {"full": 2 * unit, "static": unit}
    modes = [s.mode for s in state.samples]
    assert modes == rotation_order(["full", "static"], 0, "rotate", 0, 4) + rotation_order(["full", "static"], 1,
                                                                                           "rotate", 0, 4)
    assert [s.started for s in state.samples] == [round(sum(took[m] for m in modes[:i]), 6) for i in range(4)]
    assert state.elapsed == 6 * unit
    assert [s.order for s in state.samples] == [0, 1, 0, 1] and [s.repetition for s in state.samples] == [0, 0, 1, 1]


def test_sampling_closes_its_probe(scripted):
    import os

    durations, _ = scripted
    durations.update(full=itertools.cycle([2.0]), static=itertools.cycle([1.0]))
    before = len(os.listdir("/proc/self/fd"))
    sample(loops([4], ["full", "static"]), Protocol.fixed(2, warmup=0))
    assert len(os.listdir("/proc/self/fd")) == before  # the probe's /proc descriptors were closed


def test_a_prepare_runs_before_every_call_outside_the_timed_region(scripted):
    durations, calls = scripted
    durations.update(full=itertools.cycle([2.0]))

    class Prepared:
        def prepare(self):
            calls.append("prepare")

        def __call__(self):
            return "full"

    state = sample({4: {"full": Prepared()}}, Protocol.fixed(2, warmup=1))
    assert calls == ["prepare", "prepare", "full", "prepare", "full"]  # the warmup's call is not timed here
    assert len(state.samples) == 2


def test_a_sample_is_prepared_timed_read_and_finished_in_that_order_and_handed_on_as_kept(scripted):
    """Every call's untimed ends, the warmup's too: prepare() before it, detail() read after the timed call,
    finish() last (a context's cache released); on_sample hears each sample as it is kept."""
    durations, calls = scripted
    durations.update(full=itertools.cycle([2.0]))

    class Staged:
        def prepare(self):
            calls.append("prepare")

        def __call__(self):
            return "full"  # the scripted timer notes the timed call

        def detail(self):
            calls.append("detail")
            return {"steps": [1.0]}

        def finish(self):
            calls.append("finish")

    handed = []
    state = sample({4: {"full": Staged()}}, Protocol.fixed(2, warmup=1), on_sample=handed.append)
    assert calls == ["prepare", "finish"] + ["prepare", "full", "detail", "finish"] * 2
    assert len(handed) == 2 and all(heard is kept for heard, kept in zip(handed, state.samples))
    assert [kept.detail for kept in state.samples] == [{"steps": [1.0]}] * 2


def test_widths_are_watched_only_under_a_precision_target_once_the_minimum_rotations_ran():
    watched = []

    def watch(samples, length):
        watched.append(length)
        return {"static": 0.01}

    fixed = sampling.LengthSampling(4, rotations=5)
    assert stop_reason(fixed, Protocol.fixed(3), [], "full", 0.0, watch=watch) == "fixed"
    assert watched == [] and fixed.half_width is None
    targeted = Protocol(repeats=3, precision=0.05, max_repeats=10, max_seconds=1e9)
    early = sampling.LengthSampling(4, rotations=2)
    assert stop_reason(early, targeted, [], "full", 0.0, watch=watch) is None
    assert watched == [] and early.half_width is None
    ready = sampling.LengthSampling(4, rotations=3)
    assert stop_reason(ready, targeted, [], "full", 0.0, watch=watch) == "precise"
    assert watched == [4] and ready.half_width == 0.01


def test_a_contended_length_is_watched_on_the_cpu_clock_of_one_thread():
    """Every sample waited for a CPU: with one thread (the default) the speedup is of CPU seconds, which here are
    steady, while wall seconds are not; with two threads wall time is the only honest clock."""
    samples = [Sample(mode, 4, r, 0, wall, telemetry={"runqueue_seconds": wall, "cpu_seconds": cpu})
               for r in range(9)
               for mode, wall, cpu in (("full", 2.0 + 0.3 * (r % 3), 2.0), ("static", 1.0 + 0.4 * (r % 2), 1.0))]
    steady = watched_half_widths(samples, 4, "full", between_run=0.0)
    assert steady == {"static": 0.0}
    assert watched_half_widths(samples, 4, "full", between_run=0.0, threads=2)["static"] > 0.05


def test_a_round_runs_at_least_one_rotation_and_an_empty_run_took_no_time():
    protocol = Protocol(repeats=3, max_repeats=50)
    assert sampling.rotations_in_round(sampling.LengthSampling(4, rotations=3), protocol, 0.2, 0.1) == 1
    assert Sampling().elapsed == 0.0 and sampling.LengthSampling(4).rotations == 0
