"""kvbench.measure.telemetry: every counter read from canned kernel text, failure branches, the disturbance rules."""

from __future__ import annotations

import os

import pytest

import kvbench.measure.telemetry as telemetry
from kvbench.measure.telemetry import FIELDS, Counters, Reading, disturbances, tally


def descriptor_of(tmp_path, name: str, text: str) -> int:
    path = tmp_path / name
    path.write_text(text)
    return os.open(path, os.O_RDONLY)


def test_counters_are_parsed_from_the_kernels_text(tmp_path):
    schedstat = descriptor_of(tmp_path, "schedstat", "169531754 141902 5\n")
    stat = descriptor_of(tmp_path, "stat", "cpu  493260 0 61113 156270 493 0 125 361 0 0\ncpu0 1 2 3\nintr 5 6\n")
    v1 = descriptor_of(tmp_path, "v1", "nr_periods 10\nnr_throttled 2\nthrottled_time 123456\n")
    v2 = descriptor_of(tmp_path, "v2", "usage_usec 5\nnr_throttled 1\nthrottled_usec 42\n")
    plain = descriptor_of(tmp_path, "plain", "usage_usec 5\n")
    try:
        assert telemetry._schedstat_wait(schedstat) == 141902
        assert telemetry._steal(stat) == 361
        assert telemetry._throttled(v1) == 123456
        assert telemetry._throttled(v2) == 42_000
        assert telemetry._throttled(plain) is None
        assert telemetry._schedstat_wait(None) is None and telemetry._steal(None) is None
    finally:
        for descriptor in (schedstat, stat, v1, v2, plain):
            os.close(descriptor)


def test_the_cgroup_file_is_found_from_proc_self_cgroup(tmp_path):
    root = tmp_path / "sys" / "fs" / "cgroup"
    (root / "cpu" / "job").mkdir(parents=True)
    (root / "cpu" / "job" / "cpu.stat").write_text("nr_throttled 0\nthrottled_time 0\n")
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("4:memory:/x\n1:cpu:/job\n0::/\n")
    found = dict(root=str(root), membership=str(cgroup))
    assert telemetry.cgroup_cpu_stat(**found) == root / "cpu" / "job" / "cpu.stat"
    cgroup.write_text("0::/\n")
    assert telemetry.cgroup_cpu_stat(**found) is None


def test_a_missing_source_is_none_with_a_reason_and_costs_nothing_else(monkeypatch):
    real_open = os.open

    def refuse_schedstat(path, *args, **kwargs):
        if str(path).endswith("schedstat"):
            raise FileNotFoundError(2, "No such file or directory")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(telemetry.os, "open", refuse_schedstat)
    counters = Counters()
    try:
        assert counters.unavailable["runqueue_seconds"] == "/proc/thread-self/schedstat: No such file or directory"
        reading = counters.read()
        sample = counters.difference(reading, counters.read())
        assert sample["runqueue_seconds"] is None and set(sample) == set(FIELDS)
        assert sample["cpu_seconds"] >= 0
    finally:
        counters.close()


def test_difference_scales_every_counter():
    counters = Counters()
    counters._ticks = 100
    start = Reading(cpu_ns=1_000_000, voluntary=1, involuntary=2, runqueue_ns=10, steal_ticks=5, throttled_ns=0, cpu=0)
    end = Reading(cpu_ns=3_000_000, voluntary=4, involuntary=2, runqueue_ns=2_000_010, steal_ticks=7,
                  throttled_ns=1_000, cpu=1)
    assert counters.difference(start, end) == pytest.approx({
        "cpu_seconds": 0.002, "voluntary_switches": 3, "involuntary_switches": 0, "runqueue_seconds": 0.002,
        "steal_seconds": 0.02, "throttled_seconds": 1e-6, "cpu_start": 0, "cpu_end": 1})
    counters.close()


QUIET = {"cpu_seconds": 0.0099, "voluntary_switches": 0, "involuntary_switches": 0, "runqueue_seconds": 0.0,
         "steal_seconds": 0.0, "throttled_seconds": 0.0, "cpu_start": 1, "cpu_end": 1}


@pytest.mark.parametrize("change, reasons", [
    ({}, []),
    ({"involuntary_switches": 3}, []),  # preempted for microseconds: not a disturbance by itself
    ({"involuntary_switches": 3, "runqueue_seconds": 0.0002, "cpu_seconds": 0.0097}, ["waited for a CPU", "off CPU"]),
    ({"runqueue_seconds": 0.0002}, ["waited for a CPU"]),
    ({"runqueue_seconds": 0.00005}, []),  # 0.5% of the sample: below the 1% that counts
    ({"steal_seconds": 0.001}, ["steal"]),
    ({"throttled_seconds": 0.0001}, ["throttled"]),
    ({"cpu_end": 0}, ["migrated"]),
    ({"cpu_seconds": 0.009}, ["off CPU"]),
    ({key: None for key in FIELDS}, []),  # nothing measured: nothing to say
])
def test_disturbances(change, reasons):
    assert disturbances(0.010, {**QUIET, **change}) == reasons


def test_tally_counts_disturbed_samples_and_each_reason_most_frequent_first():
    samples = [(0.010, QUIET), (0.010, {**QUIET, "cpu_end": 0}),
               (0.010, {**QUIET, "runqueue_seconds": 0.0002, "cpu_seconds": 0.0097}),
               (0.010, {**QUIET, "runqueue_seconds": 0.0002})]
    assert tally(samples) == (3, {"waited for a CPU": 2, "migrated": 1, "off CPU": 1})
    assert list(tally(samples)[1]) == ["waited for a CPU", "migrated", "off CPU"]
    assert tally([]) == (0, {})
