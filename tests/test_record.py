"""kvbench.record: summaries derived by hand, atomic never-overwrite writes, and every way a file can be bad."""

import copy
import json
import os

import pytest

from kvbench.record import (
    RECORD_SCHEMA,
    SCHEMA,
    RecordError,
    RecordExistsError,
    RecordView,
    cell_statistics,
    load_record,
    summarize,
    validate_record,
    write_record,
)
from kvbench.workloads.decode import compare_logits

SECONDS = {("full", 4): [1.0, 2.0, 3.0, 4.0], ("concat", 4): [0.5, 0.25, 1.0, 0.75],
           ("full", 8): [4.0, 4.0, 8.0, 6.0], ("concat", 8): [2.0, 1.0, 1.5, 3.0]}


def cell(record, mode, length):
    (found,) = [c for c in record["summary"]["cells"] if (c["mode"], c["length"]) == (mode, length)]
    return found


def speedup(record, mode, length):
    (found,) = [s for s in record["summary"]["speedups"] if (s["mode"], s["length"]) == (mode, length)]
    return found


def dump(path, data):
    path.write_text(json.dumps(data))
    return path


# -- statistics -----------------------------------------------------------------------------


def test_cell_statistics_by_hand():
    stats = cell_statistics([4.0, 1.0, 3.0, 2.0])
    # Inclusive quartiles of 1, 2, 3, 4: positions 1.75 and 3.25 (linear interpolation).
    assert stats == {"median": 2.5, "min": 1.0, "max": 4.0, "q1": 1.75, "q3": 3.25, "repetitions": 4}
    odd = cell_statistics([5.0, 1.0, 3.0])
    assert (odd["median"], odd["q1"], odd["q3"]) == (3.0, 2.0, 4.0)
    one = cell_statistics([0.5])
    assert (one["median"], one["min"], one["max"], one["q1"], one["q3"]) == (0.5,) * 5


def test_summary_matches_hand_computed_statistics(make_record):
    record = make_record(SECONDS)
    full4 = cell(record, "full", 4)
    assert (full4["median"], full4["min"], full4["max"], full4["q1"], full4["q3"]) == (2.5, 1.0, 4.0, 1.75, 3.25)
    assert full4["repetitions"] == 4 and full4["valid"] is True
    assert full4["per_token_median"] == pytest.approx(2.5 / 4)
    concat4 = cell(record, "concat", 4)  # sorted: 0.25, 0.5, 0.75, 1.0
    assert (concat4["median"], concat4["q1"], concat4["q3"]) == (0.625, 0.4375, 0.8125)
    assert cell(record, "full", 8)["median"] == 5.0
    assert cell(record, "concat", 8)["median"] == 1.75
    assert record["summary"]["baseline"] == "full"
    # speedup = median over rotations of full / cached, one per cached cell, none for the baseline:
    # at 4 the pairs give 1/0.5, 2/0.25, 3/1, 4/0.75 = 2, 8, 3, 5.33 -> (3 + 5.33) / 2
    concat = speedup(record, "concat", 4)
    assert concat["speedup"] == pytest.approx((3 + 16 / 3) / 2) and concat["pairs"] == 4 and concat["valid"]
    assert concat["low"] < concat["speedup"] < concat["high"]
    assert speedup(record, "concat", 8)["speedup"] == pytest.approx(3.0)  # 2, 4, 5.33, 2 -> (2 + 4) / 2
    assert {s["mode"] for s in record["summary"]["speedups"]} == {"concat"}
    assert record["summary"]["estimator"] == "median-of-ratios" and record["summary"]["interval"] == "rerun"


def test_failed_check_invalidates_cell_and_speedup(make_record):
    record = make_record(SECONDS, failed={("concat", 8)})
    assert cell(record, "concat", 8)["valid"] is False
    assert speedup(record, "concat", 8)["valid"] is False
    assert speedup(record, "concat", 8)["speedup"] == pytest.approx(3.0)  # still reported, flagged
    assert speedup(record, "concat", 4)["valid"] is True
    # A failing baseline invalidates every speedup at that length.
    record = make_record(SECONDS, failed={("full", 4)})
    assert speedup(record, "concat", 4)["valid"] is False
    assert speedup(record, "concat", 8)["valid"] is True


def test_unchecked_cell_is_invalid():
    reps = [{"mode": "static", "length": 4, "repetition": 0, "order": 0, "seconds": 1.0}]
    assert summarize(reps, checks=[])["cells"][0]["valid"] is False


# -- write / load ---------------------------------------------------------------------------


def test_round_trip(make_record, tmp_path):
    record = make_record(SECONDS)
    path = write_record(record, tmp_path / "sub" / "run.json")
    assert path == tmp_path / "sub" / "run.json"
    assert load_record(path) == record
    assert set(RECORD_SCHEMA["required"]) <= set(record)
    assert record["schema"] == SCHEMA == "kvbench.record/4"
    assert os.listdir(path.parent) == ["run.json"]  # no temp file left behind


def test_write_never_overwrites_without_force(make_record, tmp_path):
    path = tmp_path / "run.json"
    path.write_text("precious")
    with pytest.raises(RecordExistsError, match="already exists"):
        write_record(make_record(SECONDS), path)
    assert path.read_text() == "precious"
    assert os.listdir(tmp_path) == ["run.json"]


def test_write_with_force_replaces(make_record, tmp_path):
    path = tmp_path / "run.json"
    path.write_text("old")
    record = make_record(SECONDS)
    write_record(record, path, force=True)
    assert load_record(path) == record
    assert os.listdir(tmp_path) == ["run.json"]


def test_write_validates_first(make_record, tmp_path):
    record = make_record(SECONDS)
    record["repetitions"][0]["seconds"] = -1.0
    with pytest.raises(RecordError):
        write_record(record, tmp_path / "run.json")
    assert os.listdir(tmp_path) == []


def test_errors_are_value_errors():
    assert issubclass(RecordError, ValueError)
    assert issubclass(RecordExistsError, RecordError)


def test_load_missing_file(tmp_path):
    with pytest.raises(RecordError, match="no such file"):
        load_record(tmp_path / "absent.json")


def test_load_truncated_json(make_record, tmp_path):
    text = json.dumps(make_record(SECONDS), indent=1)
    path = tmp_path / "half.json"
    path.write_text(text[: len(text) // 2])
    with pytest.raises(RecordError, match="not valid JSON"):
        load_record(path)


def test_load_empty_file(tmp_path):
    path = tmp_path / "empty.json"
    path.write_text("")
    with pytest.raises(RecordError, match="not valid JSON"):
        load_record(path)


@pytest.mark.parametrize("data", [[1, 2], "text", 3, None])
def test_load_non_object_json(tmp_path, data):
    with pytest.raises(RecordError, match="expected a JSON object"):
        load_record(dump(tmp_path / "x.json", data))


@pytest.mark.parametrize("data", [{"name": "x"}, {"schema": "other.tool/1"}, {"schema": 1}])
def test_load_foreign_json(tmp_path, data):
    with pytest.raises(RecordError, match="not a kvbench record"):
        load_record(dump(tmp_path / "x.json", data))


def test_load_future_schema_version(make_record, tmp_path):
    record = make_record(SECONDS)
    record["schema"] = "kvbench.record/5"
    with pytest.raises(RecordError, match="unsupported schema version 'kvbench.record/5'"):
        load_record(dump(tmp_path / "x.json", record))


@pytest.mark.parametrize("value", [-1.0, 0.0, "fast"])
def test_load_bad_seconds_names_the_path(make_record, tmp_path, value):
    record = make_record(SECONDS)
    record["repetitions"][0]["seconds"] = value
    with pytest.raises(RecordError, match="repetitions/0/seconds"):
        load_record(dump(tmp_path / "x.json", record))


def test_load_missing_top_level_key(make_record, tmp_path):
    record = make_record(SECONDS)
    del record["environment"]
    with pytest.raises(RecordError, match="'environment' is a required property"):
        load_record(dump(tmp_path / "x.json", record))


@pytest.mark.parametrize("stat", ["median", "min", "max", "q1", "q3"])
def test_load_rejects_tampered_summary(make_record, tmp_path, stat):
    record = make_record(SECONDS)
    cell(record, "concat", 4)[stat] *= 1.5
    with pytest.raises(RecordError, match=f"summary {stat} for mode 'concat' at length 4.*repetitions give"):
        load_record(dump(tmp_path / "x.json", record))


@pytest.mark.parametrize("tamper", ["speedup", "valid"])
def test_load_rejects_tampered_speedup_or_validity(make_record, tmp_path, tamper):
    record = make_record(SECONDS, failed={("concat", 4)})
    if tamper == "speedup":
        speedup(record, "concat", 8)["speedup"] *= 10
    else:  # claim a cell that failed the gate is a valid speedup
        cell(record, "concat", 4)["valid"] = True
        speedup(record, "concat", 4)["valid"] = True
    with pytest.raises(RecordError):
        load_record(dump(tmp_path / "x.json", record))


def test_load_rejects_summary_missing_a_cell(make_record, tmp_path):
    record = make_record(SECONDS)
    record["summary"]["cells"] = [c for c in record["summary"]["cells"] if c["mode"] != "full" or c["length"] != 8]
    with pytest.raises(RecordError, match="summary has no cell for mode 'full' at length 8"):
        load_record(dump(tmp_path / "x.json", record))


def test_complete_record_missing_a_cells_repetitions(make_record, tmp_path):
    record = make_record(SECONDS)
    record["repetitions"] = [r for r in record["repetitions"] if (r["mode"], r["length"]) != ("concat", 8)]
    with pytest.raises(RecordError, match="mode 'concat' at length 8: expected 4 repetitions, found 0"):
        load_record(dump(tmp_path / "x.json", record))


def test_complete_record_with_too_few_repetitions(make_record):
    with pytest.raises(RecordError, match="mode 'full' at length 4: expected 4 repetitions, found 3"):
        make_record({**SECONDS, ("full", 4): [1.0, 2.0, 3.0]}, repeats=4)


def test_repetition_outside_the_grid_is_rejected(make_record):
    record = make_record(SECONDS)
    record["repetitions"].append({**record["repetitions"][0], "mode": "static"})
    with pytest.raises(RecordError, match=r"mode 'static' at length 4 is outside the modes \['full', 'concat'\]"):
        validate_record(record)


def test_incomplete_record_allows_missing_repetitions(make_record, tmp_path):
    partial = {("full", 4): [1.0, 2.0], ("concat", 4): [0.5], ("full", 8): [], ("concat", 8): []}
    partial = {key: value for key, value in partial.items() if value}
    record = make_record(partial, status="incomplete", repeats=2)
    record["run"]["lengths"] = [4, 8]
    loaded = load_record(write_record(record, tmp_path / "part.json"))
    assert loaded["status"] == "incomplete"
    assert cell(loaded, "concat", 4)["repetitions"] == 1
    assert speedup(loaded, "concat", 4)["speedup"] == 1.0 / 0.5  # only rotation 0 has both modes
    # The same samples claimed complete are rejected.
    claimed = copy.deepcopy(loaded)
    claimed["status"] = "complete"
    with pytest.raises(RecordError, match=r"a complete record has an entry for every length \[4, 8\], found \[4\]"):
        validate_record(claimed)


def test_unknown_status_is_rejected(make_record):
    record = make_record(SECONDS)
    record["status"] = "done"
    with pytest.raises(RecordError, match="status"):
        validate_record(record)


def test_failed_check_with_non_finite_logits_can_be_recorded(make_record, tmp_path):
    import torch

    reference = torch.zeros(1, 4, 3)
    candidate = reference.clone()
    candidate[0, 2, 1] = float("nan")
    failed = compare_logits("concat", candidate, reference, atol=1e-5, rtol=1e-5).to_dict()
    passed = compare_logits("full", reference, reference, atol=1e-5, rtol=1e-5).to_dict()
    checks = [{**(passed if mode == "full" else failed), "length": length, "mode": mode}
              for mode in ("full", "concat") for length in (4, 8)]
    record = make_record(SECONDS, checks=checks)
    loaded = load_record(write_record(record, tmp_path / "nan.json"))
    concat = next(c for c in loaded["checks"] if c["mode"] == "concat")
    assert concat["passed"] is False
    assert concat["first_divergent_position"] == 2
    assert concat["non_finite"] == 1


def test_a_non_finite_reference_is_recorded_as_such_and_a_record_hiding_it_is_refused(make_record, tmp_path):
    import torch

    reference = torch.zeros(1, 4, 3)
    reference[0, 1, 0] = float("nan")
    checks = [{**compare_logits(mode, reference, reference, atol=1e-5, rtol=1e-5).to_dict(), "length": length,
               "mode": mode} for mode in ("full", "concat") for length in (4, 8)]
    record = make_record(SECONDS, checks=checks)
    loaded = load_record(write_record(record, tmp_path / "overflow.json"))
    assert {(c["failure"], c["reference_non_finite"], c["first_reference_non_finite"]) for c in loaded["checks"]} == {
        ("reference not finite", 1, 1)}
    assert not any(cell["valid"] for cell in loaded["summary"]["cells"])
    hidden = copy.deepcopy(record)
    hidden["checks"][1].update(failure="diverged")
    with pytest.raises(RecordError, match="non-finite reference is the failure named first"):
        validate_record(hidden)
    passed = copy.deepcopy(record)
    passed["checks"][1].update(passed=True, failure=None, first_divergent_position=None)
    with pytest.raises(RecordError, match="failure None with 1 non-finite reference logits"):
        validate_record(passed)


def test_a_machine_probe_round_trips_and_one_that_skips_a_workload_is_refused(make_record, tmp_path):
    from records import machine_probe

    record = make_record(SECONDS, probe=machine_probe(1.2))
    view = RecordView.load(write_record(record, tmp_path / "probe.json"))
    assert view.machine_probe["workloads"].keys() == {"python", "dispatch", "matmul", "copy"}
    assert len(view.probe_seconds("matmul")) == 10 and RecordView(make_record(SECONDS)).probe_seconds("matmul") == []
    skipped = copy.deepcopy(record)
    del skipped["machine_probe"]["end"]["copy"]
    with pytest.raises(RecordError, match="machine_probe/end times"):
        validate_record(skipped)
    short = copy.deepcopy(record)
    short["machine_probe"]["start"]["python"].pop()
    with pytest.raises(RecordError, match="machine_probe/start/python: 4 samples, the probe takes 5"):
        validate_record(short)


# --- the read-only view ------------------------------------------------------------------------


def test_view_indexes_the_record_once_for_every_reader(make_record):
    record = make_record({("full", 4): [1.0, 2.0, 3.0], ("static", 4): [0.5, 0.25, 1.0],
                          ("full", 8): [4.0, 4.0, 8.0], ("static", 8): [2.0, 1.0, 1.5]}, failed={("static", 8)})
    view = RecordView(record, "rec.json")
    assert (view.source, view.status, view.complete, view.baseline) == ("rec.json", "complete", True, "full")
    assert view.modes == ["full", "static"] and view.lengths == [4, 8] and view.planned_repeats == 3
    assert view.grid() == view.cells() == [("full", 4), ("static", 4), ("full", 8), ("static", 8)]
    assert view.samples("static", 4) == {0: 0.5, 1: 0.25, 2: 1.0}
    assert view.seconds("full", 8) == [4.0, 4.0, 8.0]
    assert view.summary("static", 4)["median"] == 0.5 and view.speedup("static", 4)["speedup"] == 3.0  # 2, 8, 3
    assert view.memory("full", 8)["measured_bytes"] == 256 * 8
    assert view.passed("static", 4) and not view.passed("static", 8)
    assert view.check("static", 8)["first_divergent_position"] == 2
    assert view.samples("paged", 4) == {} and view.check("paged", 4) is None and view.memory("paged", 4) is None


def test_view_of_an_interrupted_run_lists_only_measured_cells(make_record, tmp_path):
    record = make_record({("full", 4): [1.0, 2.0], ("static", 4): [0.5]}, status="incomplete", repeats=2,
                         lengths=[4, 8])
    view = RecordView.load(write_record(record, tmp_path / "part.json"))
    assert view.source == str(tmp_path / "part.json") and not view.complete
    assert view.grid() == [("full", 4), ("static", 4), ("full", 8), ("static", 8)]
    assert view.cells() == [("full", 4), ("static", 4)]


def test_a_record_of_a_published_preset_with_dots_in_its_name_is_sound():
    from records import synthetic_record

    from kvbench.config import PlainConfig
    from kvbench.record import validate_record

    record = synthetic_record({("full", 8): [0.2, 0.21], ("static", 8): [0.1, 0.11]}, preset="qwen2.5-0.5b")
    record["config"] = PlainConfig.from_preset("qwen-tiny").to_dict()
    assert validate_record(record)["run"]["preset"] == "qwen2.5-0.5b"
