"""kvbench.measure.estimation: the clock a length's speedups are estimated on, chosen from its telemetry, and
recorded."""

import copy

import numpy as np
import pytest
from records import NO_TELEMETRY, synthetic_record

from kvbench.measure import estimation, stats
from kvbench.record import RecordError, RecordView, validate_record


def repetition(mode, rotation, seconds, wait=0.0, cpu=None, length=64):
    return {"mode": mode, "length": length, "repetition": rotation, "order": 0, "seconds": seconds + wait,
            **NO_TELEMETRY, "cpu_seconds": seconds if cpu is None else cpu, "runqueue_seconds": wait}


def test_a_quiet_length_is_estimated_on_wall_time():
    reps = [repetition("full", r, 0.01) for r in range(8)] + [repetition("static", r, 0.005) for r in range(8)]
    chosen = estimation.choose(64, reps, threads=1)
    assert (chosen.clock, chosen.estimator, chosen.samples, chosen.waited) == ("wall", stats.DEFAULT_ESTIMATOR, 16, 0)
    assert chosen.reason == "0 of 16 samples waited for a CPU: wall time"


def test_a_length_whose_samples_waited_for_their_cpu_is_estimated_on_cpu_time():
    waits = [0.004] * 5 + [0.0] * 11  # 5 of 16 (31%) waited, more than 1% of their time each
    reps = [repetition("full" if i % 2 else "static", i // 2, 0.01, wait) for i, wait in enumerate(waits)]
    chosen = estimation.choose(64, reps, threads=1)
    assert (chosen.clock, chosen.waited) == ("cpu", 5)
    assert "5 of 16 samples waited for a CPU (another process shared its CPU)" in chosen.reason
    # one thread's CPU time misses the other threads' work, and without it there is nothing to read
    assert estimation.choose(64, reps, threads=2).clock == "wall"
    assert "2 threads" in estimation.choose(64, reps, threads=2).reason
    blind = [{**rep, "cpu_seconds": None} for rep in reps]
    assert estimation.choose(64, blind, threads=1).clock == "wall"
    # a wait of under 1% of a sample, or fewer than a quarter of the samples waiting, is not contention
    light = [repetition("full", r, 0.01, 0.00005) for r in range(16)]
    assert estimation.choose(64, light, threads=1).clock == "wall"
    few = [repetition("full", r, 0.01, 0.004 if r < 3 else 0.0) for r in range(16)]
    assert estimation.choose(64, few, threads=1).clock == "wall"


def contended_seconds(rotations=31, seed=3):
    """full 4 ms, static 1 ms of CPU each; every sample also waits 0-40% of it for its CPU, at random."""
    rng = np.random.default_rng(seed)
    reps = []
    for r in range(rotations):
        for mode, cpu in (("full", 4e-3), ("static", 1e-3)):
            cpu_time = cpu * (1 + 0.002 * rng.standard_normal())
            reps.append((mode, r, cpu_time, cpu_time * rng.uniform(0.0, 0.4)))
    return reps


def test_the_record_of_a_contended_run_reports_the_cpu_clock_speedup_and_why():
    reps = contended_seconds()
    seconds = {}
    for mode, r, cpu, wait in reps:
        seconds.setdefault((mode, 64), []).append(cpu + wait)
    record = synthetic_record(seconds)
    telemetry = {(mode, r): (cpu, wait) for mode, r, cpu, wait in reps}
    for rep in record["repetitions"]:
        cpu, wait = telemetry[(rep["mode"], rep["repetition"])]
        rep.update(cpu_seconds=cpu, runqueue_seconds=wait)
    rebuilt = synthetic_record(seconds)  # its summary, from wall time alone, for comparison
    from kvbench.record.summary import summarize

    record["summary"] = summarize(record["repetitions"], record["checks"], control=None,
                                  estimator=stats.DEFAULT_ESTIMATOR, interval=stats.DEFAULT_INTERVAL,
                                  between_run=record["summary"]["between_run"], rule=estimation.RULE, threads=1)
    validate_record(record)
    view = RecordView(record)
    chosen = view.estimation(64)
    assert chosen["clock"] == "cpu" and chosen["waited"] > 0.9 * chosen["samples"]
    assert view.speedup_samples("full", 64) == {r: cpu for (mode, r), (cpu, _) in telemetry.items() if mode == "full"}
    on_cpu, on_wall = view.speedup("static", 64), RecordView(rebuilt).speedup("static", 64)
    assert on_cpu["speedup"] == pytest.approx(4.0, rel=0.01)  # the loops' own times: 4 ms / 1 ms
    assert (on_cpu["high"] - on_cpu["low"]) < (on_wall["high"] - on_wall["low"]) / 2  # the waits' noise is gone
    assert stats.rerun_floor(0.01) * 0.99 <= (on_cpu["high"] - on_cpu["low"]) / (2 * on_cpu["speedup"]) < 0.03
    tampered = copy.deepcopy(record)
    tampered["summary"]["estimation"]["lengths"][0]["clock"] = "wall"
    with pytest.raises(RecordError, match="summary/estimation is"):
        validate_record(tampered)


def test_records_written_before_the_rule_keep_their_wall_time_speedups(make_record):
    record = make_record({("full", 16): [2.0, 2.2, 2.1], ("static", 16): [1.0, 1.1, 1.0]})
    record["schema"] = "kvbench.record/2"  # written before the rule: no estimation section, upgraded on reading
    del record["summary"]["estimation"]
    view = RecordView(validate_record(record))
    assert view.estimation(16)["clock"] == "wall" and view.speedup_samples("static", 16) == view.samples("static", 16)
