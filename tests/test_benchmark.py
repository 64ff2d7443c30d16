"""kvbench.workloads.benchmark: one run end to end: the gate, memory, the sampled rotations, the A/A control,
interrupts."""

from collections import Counter

import pytest

import kvbench.measure.sampling as sampling_module
import kvbench.workloads.benchmark as benchmark_module
import kvbench.workloads.decode as decode_module
from kvbench.measure import machine
from kvbench.measure.timing import CONTROL, Protocol, mode_orders
from kvbench.model import DecoderConfig, build_model
from kvbench.record import build_record
from kvbench.workloads.benchmark import control_mode, run_benchmark


@pytest.fixture(scope="module")
def tiny_model():
    """The harness does not depend on the family (tests/test_cache.py and test_decode.py run both): the lab."""
    return build_model(DecoderConfig(max_length=64), seed=0)


def test_control_mode_repeats_a_cached_mode():
    assert control_mode("auto", ["full", "static", "paged"]) == "static"
    assert control_mode("paged", ["full", "static", "paged"]) == "paged"
    assert control_mode("none", ["full", "static"]) is None
    assert control_mode("auto", ["full"]) is None
    with pytest.raises(ValueError, match="control must be 'auto', 'none' or one of the cached modes"):
        control_mode("full", ["full", "static"])


def test_a_run_collects_the_whole_heap_once_and_thaws_it_after(tiny_model, monkeypatch, thawed_heap):
    """Everything alive when the run starts is frozen out of its later collections (the probes', the memory
    profile's, each timed call's), which then walk only what the run allocated; it is thawed when the run ends."""
    import gc

    import kvbench.workloads.workload as workload_module

    alive, seen = [[]], []

    def watching(name, real):
        def watched(*args, **kwargs):
            seen.append((name, not any(found is alive for found in gc.get_objects())))
            return real(*args, **kwargs)
        return watched

    monkeypatch.setattr(machine, "probe_phase", watching("probe", machine.probe_phase))
    monkeypatch.setattr(workload_module, "peak_memory_growth", watching("memory", workload_module.peak_memory_growth))
    run_benchmark(tiny_model, [4], ["full", "static"], Protocol.fixed(1, warmup=0, control="none"))
    assert seen == [("probe", True), ("memory", True), ("memory", True), ("probe", True)]
    assert gc.get_freeze_count() == 0 and any(found is alive for found in gc.get_objects())


@pytest.mark.real_machine  # the real probe calls, timed before the gate and after the profile
def test_run_benchmark_checks_memory_and_repetitions(tiny_model):
    lengths, modes, repeats = [4, 8], ["full", "concat", "static", "paged"], 2
    events = []
    outcome = run_benchmark(tiny_model, lengths, modes,
                            Protocol.fixed(repeats, warmup=1, per_step_length=5, control="none", order="rotate"),
                            on_progress=lambda event: events.append((event.stage, event.done, event.total)))
    assert outcome.interrupted is False
    cells = {(m, n) for m in modes for n in lengths}

    assert len(outcome.checks) == len(cells)
    assert {(c["mode"], c["length"]) for c in outcome.checks} == cells
    assert all(c["passed"] and c["max_abs_diff"] <= 1e-5 * (1 + c["reference_max_abs"]) for c in outcome.checks)

    assert {(m["mode"], m["length"]) for m in outcome.memory} == cells
    config = tiny_model.config
    for row in outcome.memory:  # 2 (k, v) x layers x KV heads x T x D x 4 bytes
        assert row["expected_bytes"] == row["measured_bytes"] == \
            2 * config.layers * config.kv_heads * row["length"] * config.head_dim * 4
        assert row["reserved_bytes"] >= row["measured_bytes"]
        assert isinstance(row["peak_rss_growth_bytes"], int) and row["peak_method"]

    assert len(outcome.repetitions) == len(cells) * repeats
    assert Counter((r["mode"], r["length"]) for r in outcome.repetitions) == {cell: repeats for cell in cells}
    for r in outcome.repetitions:
        assert r["seconds"] > 0
        assert mode_orders(modes, repeats)[r["repetition"]][r["order"]] == r["mode"]

    assert [(p["mode"], p["length"], len(p["seconds"])) for p in outcome.per_step] == [(m, 5, 5) for m in modes]
    assert ("time", len(cells) * repeats, len(cells) * repeats) in events
    assert ("check", len(cells), len(cells)) in events

    probe = outcome.machine_probe  # the fixed workloads, before the gate and after the profile
    assert set(probe) == {"workloads", "repeats", "start", "end"} and probe["repeats"] == machine.REPEATS
    for phase in ("start", "end"):
        assert set(probe[phase]) == set(machine.PROBE_CALLS)
        assert all(len(seconds) == machine.REPEATS and min(seconds) > 0 for seconds in probe[phase].values())
    assert events[:2] == [("machine probe", 0, 1), ("machine probe", 1, 1)]
    assert events[-2:] == [("machine probe", 0, 1), ("machine probe", 1, 1)]


def test_run_benchmark_interrupted_keeps_completed_repetitions(tiny_model, monkeypatch):
    real_time_observed, calls = sampling_module.time_observed, []

    def time_observed(run, probe, clock):
        calls.append(1)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return real_time_observed(run, probe, clock)

    monkeypatch.setattr(sampling_module, "time_observed", time_observed)
    lengths, modes, repeats = [4, 8], ["full", "concat"], 2
    outcome = run_benchmark(tiny_model, lengths, modes,
                            Protocol.fixed(repeats, warmup=0, per_step_length=4, control="none", order="rotate"))
    assert outcome.interrupted is True
    assert outcome.per_step is None  # nothing more is run after Ctrl-C
    assert len(outcome.checks) == len(outcome.memory) == 4  # the gate finished before timing
    # rounds: rotation 0 at length 4, then at 8; rotation 1 at 4 ... interrupted at the 6th sample
    assert [(r["mode"], r["length"], r["repetition"], r["order"]) for r in outcome.repetitions] == [
        ("full", 4, 0, 0), ("concat", 4, 0, 1), ("full", 8, 0, 0), ("concat", 8, 0, 1), ("concat", 4, 1, 0),
    ]
    assert {length: state.stop for length, state in outcome.sampling.lengths.items()} == {4: "interrupted",
                                                                                         8: "interrupted"}
    # Such an outcome makes a valid incomplete record (and not a complete one).
    fields = dict(
        command=["kvbench"], config=tiny_model.config.to_dict(), protocol={}, environment={},
        run={"preset": "seed", "lengths": lengths, "modes": modes, "batch": 1, "seed": 0,
             "repeats": repeats, "warmup": 0, "threads": 1},
        checks=outcome.checks, repetitions=outcome.repetitions, memory=outcome.memory,
    )
    assert build_record(**fields, status="incomplete")["status"] == "incomplete"
    with pytest.raises(ValueError, match=r"length [48] stopped \(fixed\) after 1 rotations, fewer than run.repeats 2"):
        build_record(**fields, status="complete")


def test_run_benchmark_interrupt_during_the_gate_keeps_the_lengths_already_checked(tiny_model, monkeypatch):
    real, calls = decode_module.check_equivalence, []

    def check_equivalence(model, ids, modes, **kwargs):
        calls.append(ids.shape[1])
        if ids.shape[1] == 8:
            raise KeyboardInterrupt
        return real(model, ids, modes, **kwargs)

    monkeypatch.setattr(decode_module, "check_equivalence", check_equivalence)
    outcome = run_benchmark(tiny_model, [4, 8], ["full", "static"], Protocol.fixed(1))
    assert outcome.interrupted is True
    assert [(c["mode"], c["length"]) for c in outcome.checks] == [("full", 4), ("static", 4)]
    assert [(m["mode"], m["length"]) for m in outcome.memory] == [("full", 4), ("static", 4)]
    assert outcome.repetitions == [] and outcome.per_step is None


def test_run_benchmark_interrupt_during_the_profile_keeps_every_repetition(tiny_model, monkeypatch):
    def per_step_seconds(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(benchmark_module, "per_step_seconds", per_step_seconds)
    outcome = run_benchmark(tiny_model, [4], ["full", "static"],
                            Protocol.fixed(2, warmup=0, per_step_length=4, control="none"))
    assert outcome.interrupted is True and outcome.per_step is None
    assert len(outcome.repetitions) == 4 and len(outcome.checks) == 2


def test_run_benchmark_does_not_time_a_mode_that_raised_in_the_gate(tiny_model, monkeypatch):
    from kvbench.cache import KINDS, StaticCache

    class Exploding(StaticCache):
        def update(self, layer, k, v):
            raise RuntimeError("kernel exploded")

    monkeypatch.setitem(KINDS, "static", Exploding)
    outcome = run_benchmark(tiny_model, [4], ["full", "static"], Protocol.fixed(2, warmup=0))
    (static,) = [c for c in outcome.checks if c["mode"] == "static"]
    assert static["passed"] is False and static["error"] == "RuntimeError: kernel exploded"
    assert static["max_abs_diff"] is None
    assert {r["mode"] for r in outcome.repetitions} == {"full"}
    assert [m["mode"] for m in outcome.memory] == ["full"]
    record = build_record(command=["kvbench"], config=tiny_model.config.to_dict(), protocol={}, environment={},
                          run={"preset": "seed", "lengths": [4], "modes": ["full", "static"], "batch": 1, "seed": 0,
                               "repeats": 2, "warmup": 0, "threads": 1},
                          checks=outcome.checks, repetitions=outcome.repetitions, memory=outcome.memory)
    assert record["status"] == "complete"  # a mode that cannot be timed is not a missing repetition


def test_the_control_is_its_mode_timed_again_in_the_same_rotations(tiny_model):
    outcome = run_benchmark(tiny_model, [4], ["full", "static"], Protocol.fixed(3, warmup=0))
    assert outcome.control == "static"
    labels = Counter(r["mode"] for r in outcome.repetitions)
    assert labels == {"full": 3, "static": 3, CONTROL: 3}
    for rotation in range(3):  # every rotation times all three labels once
        assert sorted(r["order"] for r in outcome.repetitions if r["repetition"] == rotation) == [0, 1, 2]
    assert [c["mode"] for c in outcome.checks] == ["full", "static"]  # the control is its mode's code: no check of its own


# -- the client-visible workloads ------------------------------------------------------------


def record_of(outcome, lengths, modes, protocol, workload, model):
    from records import ENVIRONMENT

    from kvbench.record import record_from_run, validate_record

    record = record_from_run(outcome, command=["kvbench", "run"], preset="seed", config=model.config, lengths=lengths,
                             modes=modes, protocol=protocol, in_effect={}, environment=dict(ENVIRONMENT),
                             workload=workload.describe())
    return validate_record(record)


def test_a_request_run_times_every_step_and_records_the_latency_of_each_mode(tiny_model):
    from kvbench.workloads.workload import Request

    workload, modes = Request(prompt=9, generate=6), ["full", "static", "paged"]
    protocol = Protocol.fixed(3, warmup=0, control="auto")
    outcome = run_benchmark(tiny_model, [workload.length], modes, protocol, workload=workload)
    assert [(c["mode"], c["length"], c["passed"]) for c in outcome.checks] == [(m, 14, True) for m in modes]
    for rep in outcome.repetitions:
        assert len(rep["step_seconds"]) == 5 and rep["ttft_seconds"] > 0
        assert rep["ttft_seconds"] + sum(rep["step_seconds"]) <= rep["seconds"]  # measured inside the sample
    assert all(entry["expected_bytes"] == entry["measured_bytes"] == 2 * 4 * 14 * 8 * 4 for entry in outcome.memory)
    record = record_of(outcome, [14], modes, protocol, workload, tiny_model)
    assert record["run"]["workload"] == {"kind": "request", "prompt": 9, "generate": 6}
    latency = {entry["mode"]: entry for entry in record["summary"]["latency"]}
    assert set(latency) == {"full", "static", "paged", "control"}
    assert latency["static"]["requests"] == 3 and latency["static"]["generated"] == 6
    assert set(latency["static"]["ratios"]) == {"ttft", "tpot"} and latency["full"]["ratios"] == {}
    assert latency["static"]["tpot"]["low"] <= latency["static"]["tpot"]["median"] <= latency["static"]["tpot"]["high"]


def test_a_contexts_run_times_a_window_of_steady_steps_after_each_context(tiny_model):
    from kvbench.record.meaning import check_workload
    from kvbench.workloads.workload import Contexts

    modes, protocol = ["full", "static", "quantized-int8"], Protocol.fixed(2, warmup=0, control="none")
    outcome = run_benchmark(tiny_model, [8, 20], modes, protocol, workload=Contexts())
    assert {(c["mode"], c["length"]) for c in outcome.checks} == {(m, n) for m in modes for n in (8, 20)}
    assert all(c["passed"] for c in outcome.checks)
    static = [e for e in outcome.memory if e["mode"] == "static"]
    assert [(e["length"], e["measured_bytes"]) for e in static] == [(8, 2 * 4 * 8 * 8 * 4), (20, 2 * 4 * 20 * 8 * 4)]
    record = record_of(outcome, [8, 20], modes, protocol, Contexts(), tiny_model)
    assert record["run"]["workload"] == {"kind": "contexts", "warmup_steps": 4, "timed_steps": 16}
    assert "latency" not in record["summary"]
    assert {(s["mode"], s["length"]) for s in record["summary"]["speedups"]} == {
        (m, n) for m in ("static", "quantized-int8") for n in (8, 20)}
    for rep in record["repetitions"]:  # every step kept, warm-up first; the sample timed the 16 others only
        assert len(rep["step_seconds"]) == 20 and 0 < sum(rep["step_seconds"][4:]) <= rep["seconds"]
    assert check_workload(record) is None
    record["repetitions"][0]["step_seconds"].pop()
    assert check_workload(record) == ("repetitions/0: a contexts run of 4 warm-up and 16 timed steps keeps 20 step "
                                      "durations, got 19")


def test_a_contexts_record_from_before_the_timed_window_loads_and_reports_its_cold_step_as_it_was():
    """Committed records of one cold step per sample (issue 28's defect) stay readable, shown as they were."""
    import statistics
    from pathlib import Path

    from kvbench.record import RecordView, load_record
    from kvbench.report.record.model import build_report

    path = Path(__file__).resolve().parents[1] / "results/latency/llama-mini-contexts.json"
    view = RecordView(load_record(path), str(path))
    report = build_report(view)
    assert view.run["workload"] == {"kind": "contexts"} and report.context_steps == []
    static = next(row for row in report.limits if row.mode == "static" and row.what == "decode @ 256")
    assert static.seconds == statistics.median(view.speedup_samples("static", 256).values())
