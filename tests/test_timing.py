"""kvbench.timing: the protocol (order, warmup, repetitions, gc, threads) and run_benchmark's outcome."""

import gc
from collections import Counter

import pytest
import torch

import kvbench.decode as decode_module
import kvbench.timing as timing
from kvbench.decode import MODES, token_ids
from kvbench.record import build_record
from kvbench.timing import Protocol, measure, mode_orders, per_step_seconds, run_benchmark, set_threads, time_call

# -- mode order -----------------------------------------------------------------------------


def test_mode_orders_two_modes_alternate():
    orders = mode_orders(["full", "concat"], 6)
    assert orders == [["full", "concat"], ["concat", "full"]] * 3


@pytest.mark.parametrize("modes", [["a", "b"], ["a", "b", "c"], ["a", "b", "c", "d"]])
@pytest.mark.parametrize("multiple", [1, 2, 3])
def test_mode_orders_balance_every_position(modes, multiple):
    m = len(modes)
    orders = mode_orders(modes, m * multiple)
    assert len(orders) == m * multiple
    for order in orders:
        assert sorted(order) == sorted(modes)  # every repetition runs every mode once
    for position in range(m):
        counts = Counter(order[position] for order in orders)
        assert counts == {mode: multiple for mode in modes}
    # No mode runs first in two consecutive repetitions.
    assert all(a[0] != b[0] for a, b in zip(orders, orders[1:]))


def test_mode_orders_one_mode_and_first_order():
    assert mode_orders(["static"], 3) == [["static"]] * 3
    assert mode_orders(["a", "b", "c"], 1) == [["a", "b", "c"]]


# -- measure ------------------------------------------------------------------------------


@pytest.fixture
def fake_decode(monkeypatch):
    """Replace the timed loop by a recorder: calls[i] = (mode, length)."""
    calls = []

    def decode(model, ids, mode, keep_logits=False):
        calls.append((mode, ids.shape[1]))
        sum(range(200))  # a few microseconds, so durations are never zero

    monkeypatch.setattr(timing, "decode", decode)
    monkeypatch.setattr(gc, "collect", lambda *args: 0)  # a full collection per sample is slow here
    return calls


@pytest.mark.parametrize("modes", [["full", "concat"], ["full", "concat", "static"], list(MODES)])
def test_measure_runs_warmup_then_recorded_order(tiny_model, fake_decode, modes):
    lengths, repeats, warmup = [4, 8], 3, 2
    ids_by_length = {n: token_ids(tiny_model.config, 1, n) for n in lengths}
    seen = []
    samples = measure(tiny_model, ids_by_length, modes, Protocol(repeats=repeats, warmup=warmup), on_sample=seen.append)

    assert seen == samples
    assert len(samples) == repeats * len(modes) * len(lengths)
    assert len(fake_decode) == len(samples) + warmup * len(modes) * len(lengths)
    orders = mode_orders(modes, repeats)
    expected_samples = [
        (mode, length, r, position)
        for length in lengths
        for r, order in enumerate(orders)
        for position, mode in enumerate(order)
    ]
    assert [(s.mode, s.length, s.repetition, s.order) for s in samples] == expected_samples
    # The calls actually made: warmups for every mode first (not recorded), then the recorded order.
    per_length = warmup * len(modes) + repeats * len(modes)
    for i, length in enumerate(lengths):
        block = fake_decode[i * per_length : (i + 1) * per_length]
        assert all(n == length for _, n in block)
        warmups, timed = block[: warmup * len(modes)], block[warmup * len(modes) :]
        assert Counter(mode for mode, _ in warmups) == {mode: warmup for mode in modes}
        assert [mode for mode, _ in timed] == [mode for order in orders for mode in order]
    assert all(isinstance(s.seconds, float) and s.seconds > 0 for s in samples)


def test_measure_without_warmup_makes_only_timed_calls(tiny_model, fake_decode):
    samples = measure(tiny_model, {4: token_ids(tiny_model.config, 1, 4)}, ["static"], Protocol(repeats=2, warmup=0))
    assert len(samples) == 2 and len(fake_decode) == 2


def test_measure_real_decode_gives_positive_seconds(tiny_model):
    ids = {4: token_ids(tiny_model.config, 1, 4)}
    samples = measure(tiny_model, ids, ["full", "static"], Protocol(repeats=2, warmup=1))
    assert [(s.mode, s.repetition, s.order) for s in samples] == [
        ("full", 0, 0), ("static", 0, 1), ("static", 1, 0), ("full", 1, 1)
    ]
    assert all(0 < s.seconds < 5 for s in samples)
    assert samples[0].to_dict() == {"mode": "full", "length": 4, "repetition": 0, "order": 0,
                                    "seconds": samples[0].seconds}


@pytest.mark.parametrize("kwargs, message", [
    ({"repeats": 0}, "repeats must be an integer >= 1, got 0"),
    ({"warmup": -1}, "warmup must be an integer >= 0, got -1"),
    ({"batch": True}, "batch must be an integer >= 1, got True"),
    ({"threads": 1.5}, "threads must be an integer >= 1, got 1.5"),
    ({"per_step_length": 0}, "per_step_length must be an integer >= 1, got 0"),
])
def test_protocol_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Protocol(**kwargs)


def test_protocol_describes_the_run_for_the_record():
    protocol = Protocol(repeats=5, warmup=0, batch=2, seed=3, threads=1, per_step_length=8)
    assert protocol.run_section("seed", [4, 8], ["full", "static"]) == {
        "preset": "seed", "lengths": [4, 8], "modes": ["full", "static"], "batch": 2, "seed": 3,
        "repeats": 5, "warmup": 0, "threads": 1, "per_step_length": 8}
    described = protocol.describe({"requested": 1, "intra_op": 1, "inter_op": 1})
    assert (described["repeats"], described["warmup"], described["threads"]) == (5, 0, 1)
    assert described["threads_in_effect"] == {"requested": 1, "intra_op": 1, "inter_op": 1}
    assert described["clock"] == "time.perf_counter_ns" and "rotating" in described["order"]


def test_measure_rejects_unknown_modes(tiny_model):
    with pytest.raises(ValueError, match="unknown mode"):
        measure(tiny_model, {4: token_ids(tiny_model.config, 1, 4)}, ["full", "bogus"])


# -- time_call and gc ---------------------------------------------------------------------


def test_time_call_disables_gc_only_while_timing():
    assert gc.isenabled()
    during = []
    seconds = time_call(lambda: during.append(gc.isenabled()))
    assert during == [False]
    assert gc.isenabled()
    assert isinstance(seconds, float) and seconds < 0.1  # appending to a list: far below a tenth of a second


def test_time_call_reenables_gc_when_the_call_raises():
    def boom():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        time_call(boom)
    assert gc.isenabled()
    with pytest.raises(KeyboardInterrupt):
        time_call(lambda: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert gc.isenabled()


def test_time_call_leaves_a_disabled_gc_disabled():
    gc.disable()
    try:
        time_call(lambda: None)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_time_call_measures_the_call():
    import time

    assert 0.009 < time_call(lambda: time.sleep(0.01)) < 1.0


# -- threads --------------------------------------------------------------------------------


@pytest.fixture
def restore_threads():
    intra = torch.get_num_threads()
    yield
    torch.set_num_threads(intra)


@pytest.mark.parametrize("threads", [1, 2])
def test_set_threads_returns_what_is_in_effect(restore_threads, threads):
    in_effect = set_threads(threads)
    assert in_effect["requested"] == threads
    assert in_effect["intra_op"] == torch.get_num_threads() == threads
    assert in_effect["inter_op"] == torch.get_num_interop_threads()
    if in_effect["inter_op"] != threads:  # too late to resize the inter-op pool: said, not hidden
        assert "inter-op" in in_effect["note"]
    else:
        assert "note" not in in_effect


@pytest.mark.parametrize("threads", [0, -1, True, 1.5, "2"])
def test_set_threads_rejects_non_positive_integers(restore_threads, threads):
    before = torch.get_num_threads()
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        set_threads(threads)
    assert torch.get_num_threads() == before


# -- per-step -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_per_step_seconds_one_duration_per_step(tiny_model, mode):
    ids = token_ids(tiny_model.config, 1, 6)
    durations = per_step_seconds(tiny_model, ids, mode, warmup=0)
    assert len(durations) == 6
    assert all(isinstance(d, float) and 0 < d < 5 for d in durations)
    assert gc.isenabled()


# -- run_benchmark --------------------------------------------------------------------------


def test_run_benchmark_checks_memory_and_repetitions(tiny_model):
    lengths, modes, repeats = [4, 8], ["full", "concat", "static", "paged"], 2
    events = []
    outcome = run_benchmark(tiny_model, lengths, modes, Protocol(repeats=repeats, warmup=1, per_step_length=5),
                            on_progress=lambda stage, done, total: events.append((stage, done, total)))
    assert outcome.interrupted is False
    cells = {(m, n) for m in modes for n in lengths}

    assert len(outcome.checks) == len(cells)
    assert {(c["mode"], c["length"]) for c in outcome.checks} == cells
    assert all(c["passed"] and c["max_abs_diff"] <= 1e-5 for c in outcome.checks)

    assert {(m["mode"], m["length"]) for m in outcome.memory} == cells
    for row in outcome.memory:
        assert row["expected_bytes"] == row["measured_bytes"] == 2 * 4 * row["length"] * 8 * 4
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


def test_run_benchmark_interrupted_keeps_completed_repetitions(tiny_model, monkeypatch):
    real_time_call, calls = timing.time_call, []

    def time_call(run):
        calls.append(1)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return real_time_call(run)

    monkeypatch.setattr(timing, "time_call", time_call)
    lengths, modes, repeats = [4, 8], ["full", "concat"], 2
    outcome = run_benchmark(tiny_model, lengths, modes, Protocol(repeats=repeats, warmup=0, per_step_length=4))
    assert outcome.interrupted is True
    assert outcome.per_step is None  # nothing more is run after Ctrl-C
    assert len(outcome.checks) == len(outcome.memory) == 4  # the gate finished before timing
    assert [(r["mode"], r["length"], r["repetition"], r["order"]) for r in outcome.repetitions] == [
        ("full", 4, 0, 0), ("concat", 4, 0, 1), ("concat", 4, 1, 0), ("full", 4, 1, 1), ("full", 8, 0, 0),
    ]
    # Such an outcome makes a valid incomplete record (and not a complete one).
    fields = dict(
        command=["kvbench"], config=tiny_model.config.to_dict(), protocol={}, environment={},
        run={"preset": "seed", "lengths": lengths, "modes": modes, "batch": 1, "seed": 0,
             "repeats": repeats, "warmup": 0, "threads": 1},
        checks=outcome.checks, repetitions=outcome.repetitions, memory=outcome.memory,
    )
    assert build_record(**fields, status="incomplete")["status"] == "incomplete"
    with pytest.raises(ValueError, match="at length 8: expected 2 repetitions, found [01]"):
        build_record(**fields, status="complete")


def test_run_benchmark_interrupt_during_the_gate_keeps_the_lengths_already_checked(tiny_model, monkeypatch):
    real, calls = decode_module.check_equivalence, []

    def check_equivalence(model, ids, modes, **kwargs):
        calls.append(ids.shape[1])
        if ids.shape[1] == 8:
            raise KeyboardInterrupt
        return real(model, ids, modes, **kwargs)

    monkeypatch.setattr(decode_module, "check_equivalence", check_equivalence)
    outcome = run_benchmark(tiny_model, [4, 8], ["full", "static"], Protocol(repeats=1))
    assert outcome.interrupted is True
    assert [(c["mode"], c["length"]) for c in outcome.checks] == [("full", 4), ("static", 4)]
    assert [(m["mode"], m["length"]) for m in outcome.memory] == [("full", 4), ("static", 4)]
    assert outcome.repetitions == [] and outcome.per_step is None


def test_run_benchmark_interrupt_during_the_profile_keeps_every_repetition(tiny_model, monkeypatch):
    def per_step_seconds(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(timing, "per_step_seconds", per_step_seconds)
    outcome = run_benchmark(tiny_model, [4], ["full", "static"], Protocol(repeats=2, warmup=0, per_step_length=4))
    assert outcome.interrupted is True and outcome.per_step is None
    assert len(outcome.repetitions) == 4 and len(outcome.checks) == 2


def test_run_benchmark_does_not_time_a_mode_that_raised_in_the_gate(tiny_model, monkeypatch):
    from kvbench.cache import KINDS, StaticCache

    class Exploding(StaticCache):
        def update(self, layer, k, v):
            raise RuntimeError("kernel exploded")

    monkeypatch.setitem(KINDS, "static", Exploding)
    outcome = run_benchmark(tiny_model, [4], ["full", "static"], Protocol(repeats=2, warmup=0))
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
