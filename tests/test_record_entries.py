"""kvbench.record.entries: the cell key (loop and serving cells), the workload and the typed repetition."""

from __future__ import annotations

import copy
import pickle

import pytest

from kvbench.record import CellKey, Repetition, Workload
from records import request_record, view


def test_a_loop_cell_is_the_plain_mode_and_length_pair():
    key = CellKey("static", 64)
    assert key == ("static", 64) and hash(key) == hash(("static", 64))
    assert {("static", 64): 1}[key] == 1 and {key: 1}[("static", 64)] == 1
    assert (key.mode, key.length, key.trace, key.budget) == ("static", 64, None, None)
    mode, length = key
    assert (mode, length) == ("static", 64) and repr(key) == "CellKey('static', length=64)"
    assert sorted([CellKey("static", 64), CellKey("full", 128), CellKey("full", 64)]) == [
        ("full", 64), ("full", 128), ("static", 64)]


def test_a_serving_cell_is_a_mode_under_a_trace_and_a_budget_and_never_a_loop_cell():
    key = CellKey("paged", trace="burst-64", budget=1 << 20)
    assert (key.mode, key.trace, key.budget, key.length) == ("paged", "burst-64", 1 << 20, None)
    assert key == ("paged", "burst-64", 1 << 20) and key != CellKey("paged", 64)
    with pytest.raises(ValueError):
        mode, length = key
    assert CellKey.of({"mode": "paged", "trace": "burst-64", "budget": 1 << 20, "seconds": 1.0}) == key
    assert CellKey.of({"mode": "full", "length": 8, "seconds": 1.0}) == ("full", 8)


@pytest.mark.parametrize("key", [CellKey("static", 64), CellKey("paged", trace="t", budget=4096)])
def test_a_cell_key_survives_copying_and_pickling(key):
    for again in (copy.deepcopy(key), pickle.loads(pickle.dumps(key))):
        assert again == key and type(again) is CellKey and again.length == key.length and again.trace == key.trace


@pytest.mark.parametrize("arguments, keywords", [
    (("static",), {}),  # neither a length nor a serving point
    (("static", 64), {"trace": "t", "budget": 1}),  # both
    (("paged",), {"trace": "t"}),  # a trace without its budget
    (("",), {"length": 4}),
    ((None, 4), {}),
])
def test_a_cell_key_names_exactly_one_grid_point(arguments, keywords):
    with pytest.raises(ValueError, match="cell"):
        CellKey(*arguments, **keywords)


def test_the_workload_round_trips_the_records_form():
    for entry in ({"kind": "loop"}, {"kind": "request", "prompt": 9, "generate": 6},
                  {"kind": "contexts", "warmup_steps": 4, "timed_steps": 16}, {"kind": "contexts"}):
        workload = Workload.from_dict(entry)
        assert workload.to_dict() == entry
    assert Workload.from_dict({"kind": "request", "prompt": 9, "generate": 6}).is_request
    assert not Workload("contexts").timed_window and Workload("contexts", warmup_steps=4, timed_steps=16).timed_window


def test_a_views_cells_are_keys_and_its_repetitions_are_typed():
    record = request_record(prompt=16, generate=9, repeats=5)
    loaded = view(record)
    assert loaded.cells() == [("full", 24), ("static", 24), ("paged", 24)]
    assert all(type(cell) is CellKey for cell in loaded.cells())
    repetitions = loaded.every_repetition()
    assert len(repetitions) == 15 and all(isinstance(rep, Repetition) for rep in repetitions)
    first = record["repetitions"][0]
    assert repetitions[0] == Repetition(CellKey(first["mode"], 24), first["repetition"], first["order"], first["round"],
                                        first["started"], first["seconds"],
                                        {name: None for name in repetitions[0].telemetry}, first["ttft_seconds"],
                                        tuple(first["step_seconds"]))
    assert len(repetitions[0].step_seconds) == 8 and repetitions[0].mode == "full" and repetitions[0].length == 24
    assert loaded.workload == Workload("request", 16, 9)
    assert loaded.latency("static", 24)["ratios"]["tpot"]["ratio"] == pytest.approx(4.0, rel=0.05)
    assert loaded.cache_options("static") == {} and loaded.limits is None
