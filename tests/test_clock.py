"""The clock seam: every timer reads its times from the clock it is given, and waits on it before the second read."""

import time

import torch

import pytest

from kvbench.measure.clock import HOST, HostClock
from kvbench.measure.sampling import sample
from kvbench.measure.telemetry import Counters, sample_cost
from kvbench.measure.timing import CLOCK, Protocol, time_call
from kvbench.model import DecoderConfig, build_model
from kvbench.serving.scheduler import Scheduler, TokenSource, make_ledger
from kvbench.serving.trace import make_trace, parse_arrivals, parse_lengths
from kvbench.workloads.benchmark import per_step_seconds
from kvbench.workloads.decode import token_ids
from kvbench.workloads.requests import step_durations, time_request


class FakeClock:
    """Each read advances a fixed step; every call is logged, so a test sees the order too."""

    name = "fake"
    host_beside = False

    def __init__(self, step_ns: int = 2_500_000, cpu_step_ns: int = 1_000_000) -> None:
        self.wall, self.cpu, self.step_ns, self.cpu_step_ns, self.calls = 0, 0, step_ns, cpu_step_ns, []

    def now_ns(self) -> int:
        self.calls.append("now")
        self.wall += self.step_ns
        return self.wall

    def cpu_ns(self) -> int:
        self.calls.append("cpu")
        self.cpu += self.cpu_step_ns
        return self.cpu

    def mark(self) -> int:
        self.calls.append("mark")
        self.wall += self.step_ns
        return self.wall

    def synchronize(self) -> None:
        self.calls.append("sync")

    @staticmethod
    def elapsed_ns(start: int, end: int) -> int:
        return end - start

    host_elapsed_ns = elapsed_ns


def test_the_host_clock_is_perf_counter_and_the_threads_cpu_time_and_names_the_records_clock():
    assert HOST.now_ns is HOST.mark is time.perf_counter_ns and HOST.cpu_ns is time.thread_time_ns
    assert HOST.name == CLOCK == "time.perf_counter_ns" and HostClock().synchronize() is None
    assert HOST.elapsed_ns(5, 12) == HOST.host_elapsed_ns(5, 12) == 7 and not HOST.host_beside


def test_a_timed_call_is_the_clocks_two_marks_apart_then_the_wait():
    clock = FakeClock(step_ns=2_500_000)
    assert time_call(lambda: None, clock) == 0.0025
    assert clock.calls == ["mark", "mark", "sync"]


def test_each_step_is_the_clocks_step_and_the_clock_is_waited_on_once_after_the_last():
    clock = FakeClock(step_ns=1_000_000)
    assert step_durations(iter(range(3)), clock=clock) == [0.001, 0.001, 0.001]
    assert clock.calls == ["mark"] * 4 + ["sync"]


def test_a_request_and_a_loops_per_step_profile_come_from_the_clock():
    model = build_model(DecoderConfig(max_length=16), seed=0)
    ids = token_ids(model.config, 1, 8)
    timed = time_request(model, ids, "static", 4, clock=FakeClock(step_ns=3_000_000))
    assert timed == {"ttft_seconds": 0.003, "step_seconds": [0.003] * 4}  # P = 4 of 8 ids: 5 steps
    assert per_step_seconds(model, ids, "concat", warmup=0, clock=FakeClock(step_ns=4_000_000)) == [0.004] * 8


def test_a_serving_replays_token_stamps_are_read_from_its_clock():
    """Each model call reads the wall clock once and the CPU clock once after waiting on it: with whole prompts
    every call emits, so the CPU stamps are the clock's 2nd, 3rd, ... reads, and every wall stamp a whole step."""
    model = build_model(DecoderConfig(max_length=96), seed=0)
    trace = make_trace({**parse_lengths("uniform:3-20,2-12"), **parse_arrivals("all"), "requests": 4}, 0, 96)
    clock = FakeClock(step_ns=1_000_000, cpu_step_ns=1_000_000)
    scheduler = Scheduler(model, trace, make_ledger(model, "paged", 400_000),
                          TokenSource(128, trace.seed, trace.prefix), clock=clock)
    with torch.inference_mode():
        result = scheduler.run()
    cpu = sorted({t for r in result["requests"] for t in r["token_cpu_times"]})
    assert cpu == [k * 1_000_000 / 1e9 for k in range(1, len(cpu) + 1)]
    assert len(cpu) == clock.calls.count("sync") > len(result["iterations"])  # a call per prompt, per decode step
    stamps = [t for r in result["requests"] for t in r["token_times"]]
    assert stamps and all(round(t * 1000, 6) == int(round(t * 1000)) for t in stamps)


def test_the_samplers_deadline_samples_and_telemetry_all_read_the_clock_they_are_given():
    """Each read of the fake clock is 10 ms: a 2-second deadline is reached after about 200 reads, in a few real
    milliseconds; every sample is one read apart and its CPU time one CPU step, as the fake clock says."""
    clock = FakeClock(step_ns=10_000_000, cpu_step_ns=1_000_000)
    protocol = Protocol(repeats=2, precision=0.05, max_seconds=2.0, warmup=0)
    never_precise = lambda samples, length: {"static": 0.5}  # noqa: E731  only the deadline can stop it
    state = sample({8: {"full": lambda: None, "static": lambda: None}}, protocol, watch=never_precise, clock=clock)
    assert state.lengths[8].stop == "budget"
    assert 2.0 <= state.elapsed < 2.1 and round(state.elapsed * 100) == pytest.approx(state.elapsed * 100)
    assert state.telemetry_seconds == pytest.approx(0.01 / 200)  # the telemetry's cost, timed on the clock too
    assert {s.seconds for s in state.samples} == {0.01}
    assert {s.telemetry["cpu_seconds"] for s in state.samples} == {0.001}
    assert all(round(s.started * 100) == pytest.approx(s.started * 100) for s in state.samples)  # whole fake steps
    assert len(state.samples) == 2 * state.lengths[8].rotations > 2 * protocol.repeats


def test_the_telemetrys_cpu_time_and_its_cost_read_the_counters_clock():
    clock = FakeClock(step_ns=4_000_000, cpu_step_ns=3_000_000)
    counters = Counters(clock=clock)
    try:
        before, after = counters.read(opening=True), counters.read()
        assert counters.difference(before, after)["cpu_seconds"] == 0.003
        clock.calls.clear()
        assert sample_cost(counters, count=10) == pytest.approx(0.004 / 10)
        assert clock.calls == ["now"] + ["cpu"] * 20 + ["now"]
    finally:
        counters.close()
