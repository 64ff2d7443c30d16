"""kvbench.record.upgrade: committed records of every older version load as the current schema, and every
command that reads records works on them exactly as on the same record written today."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kvbench.cli import main
from kvbench.record import SCHEMA, RecordError, RecordView, load_record, upgrade, write_record
from kvbench.record.schema import READABLE
from kvbench.record.upgrade import v1_to_v2, v2_to_v3

ROOT = Path(__file__).resolve().parents[1]
# Of each older shape one committed record: version 1 (the fixed protocol); version 2 before the workload, the
# between-run allowance and the estimation were recorded (noise), before the workload (llama), a request with
# limits, a contexts run from before the timed window, and one with it.
V1 = ("results/layouts/seed.json", "results/layouts/seed-long.json", "results/layouts/medium.json")
V2 = ("results/noise/random/run-00.json", "results/llama/llama-tiny.json", "results/latency/llama-mini-request.json",
      "results/latency/qwen2.5-0.5b-contexts.json", "results/latency/llama-mini-contexts-steady.json")


def raw(name: str) -> dict:
    return json.loads((ROOT / name).read_text())


PREFIX_RECORDS = ("shared", "multi-turn-fcfs", "multi-turn-lpf", "none")  # written in the one record from the start


def committed_records() -> list[str]:
    found = []
    for path in sorted((ROOT / "results").rglob("*.json")):
        text = path.read_text()
        if '"kvbench.record/' in text[:200]:
            found.append(str(path.relative_to(ROOT)))
    return found


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_committed_records_are_of_every_older_version_and_stay_as_written():
    versions = {raw(name)["schema"] for name in committed_records()}
    # every older version is committed: /3 by the real model's re-measured records (results/real/quality-*), /4 by
    # the serving A/A pairs (results/serving/aa), the first serving runs written in the one record
    assert {"kvbench.record/1", "kvbench.record/2", "kvbench.record/4"} <= versions <= set(READABLE)
    assert SCHEMA == "kvbench.record/4"
    assert {name for name in committed_records() if raw(name)["schema"] == SCHEMA} == (
        {f"results/serving/aa/pair{pair}-{run}.json" for pair in (1, 2, 3) for run in "ab"}
        | {"results/eviction/serving-budget.json"}
        | {f"results/eviction/smollm2-ratio-0{ratio}.json" for ratio in (25, 50, 75)}
        | {"results/real/needle.json", "results/real/needle-evicting.json"}  # the scored kinds: docs/eviction.md
        | {f"results/serving/goodput/llama-mini-chat-16-capacity-{tokens}-{pair}.json"  # docs/serving.md: goodput
           for tokens in ("512", "none") for pair in (1, 2)}
        | {f"results/serving/prefix-{name}.json" for name in PREFIX_RECORDS}  # the prefix cache: docs/serving.md
        | {"results/serving/smollm2/chat-6.json", "results/serving/smollm2/chat-6-peer.json",
           "results/serving/smollm2/prefix-shared.json"})  # a trained model
    assert READABLE == ("kvbench.record/1", "kvbench.record/2", "kvbench.record/3", "kvbench.record/4")
    assert {raw(name)["schema"] for name in V1} == {"kvbench.record/1"}
    assert {raw(name)["schema"] for name in V2} == {"kvbench.record/2"}


@pytest.mark.parametrize("name", [*V1, *V2])
def test_an_older_record_loads_as_the_current_schema_and_its_file_is_not_rewritten(name):
    before = (ROOT / name).read_bytes()
    record = load_record(ROOT / name)
    assert record["schema"] == SCHEMA
    assert (ROOT / name).read_bytes() == before
    original = json.loads(before)
    # what was measured is what the file holds: the upgrade adds, it never changes a sample or a summary value
    assert [rep["seconds"] for rep in record["repetitions"]] == [rep["seconds"] for rep in original["repetitions"]]
    assert [c["median"] for c in record["summary"]["cells"]] == [c["median"] for c in original["summary"]["cells"]]
    assert [s["speedup"] for s in record["summary"]["speedups"]] == \
        [s["speedup"] for s in original["summary"]["speedups"]]


def test_upgrading_is_pure_and_idempotent_for_every_committed_record():
    names = committed_records()
    assert len(names) >= 100
    for name in names:
        original = raw(name)
        kept = copy.deepcopy(original)
        once = upgrade(original)
        assert original == kept, f"{name}: upgrading changed its input"
        assert once["schema"] == SCHEMA and upgrade(once) is once, name
        assert upgrade(copy.deepcopy(once)) == once, name


def test_version_1_is_upgraded_to_what_the_fixed_protocol_did():
    original = raw("results/layouts/seed.json")
    record = v1_to_v2(original)
    assert record["schema"] == "kvbench.record/2" and "sampling" not in original
    assert record["sampling"]["lengths"] == [{"length": 64, "rotations": 15, "stop": "fixed", "half_width": None},
                                             {"length": 1024, "rotations": 15, "stop": "fixed", "half_width": None}]
    first = record["repetitions"][0]
    assert first["round"] == first["repetition"] == 0 and first["started"] is None and first["cpu_seconds"] is None
    assert record["summary"]["estimator"] is None and record["summary"]["controls"] == []
    assert record["summary"]["speedups"][0] == {"mode": "concat", "length": 64, "speedup": 1.8816660157836036,
                                                "valid": True, "low": None, "high": None, "pairs": None}
    view = RecordView(load_record(ROOT / "results/layouts/seed.json"))
    assert view.estimator is None and view.control is None and view.workload.kind == "loop"
    assert view.planned(64) == 15 and view.recorded_between_run == 0.0
    assert view.summary("concat", 64)["per_token_median"] == pytest.approx(view.summary("concat", 64)["median"] / 64)


def test_version_2_is_upgraded_with_every_section_a_run_writes_today():
    original = raw("results/noise/random/run-00.json")
    assert not {"workload", "plugins"} & set(original["run"]) and "between_run" not in original["summary"]
    record = v2_to_v3(original)
    assert record["run"]["workload"] == {"kind": "loop"} and record["run"]["plugins"] == []
    assert record["run"]["cache_options"] == {} and record["run"]["control"] == original["run"]["control"]
    assert record["summary"]["between_run"] is None and record["summary"]["estimation"] is None
    assert record["summary"]["baseline"] == "full"


def test_an_incomplete_version_1_record_counts_the_rotations_it_ran():
    original = raw("results/layouts/seed.json")
    original["status"] = "incomplete"
    original["repetitions"] = [rep for rep in original["repetitions"] if rep["length"] == 64 and rep["repetition"] < 4]
    sampling = v1_to_v2(original)["sampling"]
    assert sampling["lengths"] == [{"length": 64, "rotations": 4, "stop": "interrupted", "half_width": None}]


def rewritten(name: str, directory: Path) -> tuple[Path, Path]:
    """The committed file and the same record written today (upgraded, then written as schema 3), under one
    file name in two folders, so that what a command prints of each differs by the folder alone."""
    old, new = directory / "old" / "record.json", directory / "new" / "record.json"
    old.parent.mkdir()
    old.write_bytes((ROOT / name).read_bytes())
    write_record(load_record(old), new)
    assert json.loads(new.read_text())["schema"] == SCHEMA
    return old, new


@pytest.mark.parametrize("name", [V1[0], *V2[1:]])
def test_show_and_report_read_an_older_record_as_the_same_record_written_today(name, tmp_path, capsys):
    old, new = rewritten(name, tmp_path)
    for argv in (["show"], ["report"], ["report", "--format", "markdown"]):
        code_old, out_old, err_old = run(capsys, argv[0], old, *argv[1:])
        code_new, out_new, err_new = run(capsys, argv[0], new, *argv[1:])
        assert code_old == code_new == 0, (argv, err_old, err_new)
        assert out_old.replace(str(old), "PATH").replace(str(old.parent), "DIR") == \
            out_new.replace(str(new), "PATH").replace(str(new.parent), "DIR"), argv
    view = RecordView.load(old)
    baseline, mode = view.baseline, next(m for m in view.modes if m != view.baseline)
    length = view.lengths[0]
    code, out, _ = run(capsys, "show", old)
    assert code == 0 and mode in out and baseline in out
    if view.workload.is_request:  # its table is latency: TTFT and TPOT per mode
        assert f"request: {view.workload.prompt} prompt tokens, {view.workload.generate} generated" in out
    else:
        assert f"{view.speedup(mode, length)['speedup']:.2f}" in out


@pytest.mark.parametrize("name", [V1[0], V2[2]])
def test_compare_an_older_record_with_a_current_one(name, tmp_path, capsys):
    old, new = rewritten(name, tmp_path)
    code, out, err = run(capsys, "compare", old, new)
    assert code == 0, err
    view = RecordView.load(new)
    for mode in view.modes:
        assert mode in out
    # the same samples on both sides: no cell changed
    assert " 0 slower, 0 faster, " in out


def test_a_request_record_shows_its_workload_latency_and_limits_through_the_view():
    view = RecordView.load(ROOT / "results/latency/llama-mini-request.json")
    assert view.workload.is_request and (view.workload.prompt, view.workload.generate) == (512, 128)
    assert view.workload.to_dict() == {"kind": "request", "prompt": 512, "generate": 128}
    assert view.limits is not None and view.limits["weight_bytes_per_step"] > 0
    (length,) = view.lengths
    entry = view.latency("concat", length)
    assert entry["mode"] == "concat" and entry["ttft"]["median"] > 0 and "ttft" in entry["ratios"]
    assert view.latency("full", length)["ratios"] == {} and view.latency("concat", length + 1) is None
    repetitions = view.every_repetition()
    assert len(repetitions) == len(view.record["repetitions"])
    assert {rep.mode for rep in repetitions} == {*view.modes, "control"}
    assert all(len(rep.step_seconds) == 127 and rep.ttft_seconds > 0 for rep in repetitions)
    assert repetitions[0].telemetry["cpu_seconds"] == view.record["repetitions"][0]["cpu_seconds"]


def test_a_contexts_record_from_before_the_timed_window_has_no_step_counts():
    before = RecordView.load(ROOT / "results/latency/qwen2.5-0.5b-contexts.json").workload
    steady = RecordView.load(ROOT / "results/latency/llama-mini-contexts-steady.json").workload
    assert before.kind == "contexts" and not before.timed_window and before.timed_steps is None
    assert steady.timed_window and (steady.warmup_steps, steady.timed_steps) == (4, 16)


def test_a_malformed_older_record_is_refused_in_one_line(tmp_path, capsys):
    record = raw("results/layouts/seed.json")
    record["summary"]["cells"][0]["median"] = [1, 2]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(record))
    with pytest.raises(RecordError, match="summary median for mode 'full' at length 64 is \\[1, 2\\]"):
        load_record(path)
    del record["repetitions"][0]["order"]
    path.write_text(json.dumps(record))
    code, _, err = run(capsys, "show", path)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "repetitions/0: 'order' is a required property" in err


def test_a_schema_3_record_without_a_later_section_reads_as_its_schema_2_twin(tmp_path, capsys):
    """A record labelled /3 that lacks what schema 2 left optional (say a file edited by hand) is filled by the
    same step as a schema 2 record, not refused, and the same file relabelled /2 reads the same."""
    older_shape = raw("results/noise/random/run-00.json")  # no workload, plugins, between-run or estimation
    record = {**older_shape, "schema": "kvbench.record/3"}
    current, older = tmp_path / "current.json", tmp_path / "older.json"
    current.write_text(json.dumps(record))
    older.write_text(json.dumps(older_shape))
    loaded = load_record(current)
    assert loaded == load_record(older)
    assert loaded["run"]["workload"] == {"kind": "loop"} and loaded["run"]["plugins"] == []
    assert loaded["summary"]["between_run"] is None
    cell = loaded["summary"]["cells"][0]
    assert cell["per_token_median"] == pytest.approx(cell["median"] / cell["length"])
    assert run(capsys, "show", current)[0] == 0
    # filled, then held to schema 3: a malformed cell is named in one line, never a KeyError
    del record["summary"]["cells"][0]["median"]
    current.write_text(json.dumps(record))
    code, _, err = run(capsys, "show", current)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "'median' is a required property" in err


@pytest.mark.parametrize("length", [0, -3, "64", True, 2.5, None])
def test_the_upgrade_derives_no_per_token_median_from_a_length_it_cannot_divide_by(length):
    """upgrade() is also handed records no schema has checked (RecordView(record)): a cell's length that is not
    a positive integer (None: no length) gives no per-token median, for the schema to name, rather than a
    ZeroDivisionError, a KeyError, a TypeError, or a median divided by True or 2.5."""
    record = raw("results/noise/random/run-00.json")
    first, second = record["summary"]["cells"][:2]
    for cell in (first, second):  # this run's kvbench wrote them; the upgrade derives them for older ones
        del cell["per_token_median"]
    if length is None:
        del first["length"]
    else:
        first["length"] = length
    cells = upgrade(record)["summary"]["cells"]
    assert cells[0]["per_token_median"] is None
    assert cells[1]["per_token_median"] == pytest.approx(second["median"] / second["length"])


def test_a_schema_3_record_upgrades_to_4_unchanged_but_its_label_and_4_needs_every_section(tmp_path, capsys):
    """/3 to /4 changes no value of a loop, request or contexts record; a file labelled /4 lacking a section /3
    requires is refused (only a /3 label is read as its /2 twin), in one line."""
    three = {**load_record(ROOT / "results/noise/random/run-00.json"), "schema": "kvbench.record/3"}
    four = upgrade(three)
    assert four == {**three, "schema": "kvbench.record/4"} and three["schema"] == "kvbench.record/3"
    del four["run"]["workload"]
    path = tmp_path / "four.json"
    path.write_text(json.dumps(four))
    code, _, err = run(capsys, "show", path)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "'workload' is a required property" in err


@pytest.mark.parametrize("name", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "results/serving").glob("*.json")
                                         if p.stem not in {f"prefix-{name}" for name in PREFIX_RECORDS}))
def test_a_serving_1_record_upgrades_to_4_with_the_same_numbers(name):
    """Every committed kvbench.serving/1 record loads as a /4 record of the serving workload: its replays, checks,
    trace and budget are the file's, keyed by the cell (mode, trace, budget) instead of the length 0, and the
    figures every reader derives are those of the file's own stamps."""
    from kvbench.record import CellKey, RecordView
    from kvbench.serving.figures import replay_figures

    original = raw(name)
    assert original["schema"] == "kvbench.serving/1"
    record = load_record(ROOT / name)
    assert record["schema"] == SCHEMA and record["run"]["workload"]["kind"] == "serving"
    assert record["run"]["modes"] == original["kinds"] and record["run"]["control"] == original["control"]
    assert [rep["seconds"] for rep in record["repetitions"]] == [kept["seconds"] for kept in original["samples"]]
    assert [rep["replay"] for rep in record["repetitions"]] == [kept["replay"] for kept in original["samples"]]
    assert all("length" not in rep for rep in record["repetitions"])
    assert record["serving"]["trace"] == original["trace"] and record["serving"]["budget"] == original["budget"]
    assert {check["mode"]: check["passed"] for check in record["checks"]} == \
        {kind: check["passed"] for kind, check in original["checks"].items()}
    view = RecordView(record, name)
    budget, trace = original["budget"]["bytes"], view.workload.trace
    assert view.cells()[0] == CellKey(original["kinds"][0], trace=trace, budget=budget)
    assert view.cells()[0].length is None and view.cells()[0].budget == budget
    kept = original["samples"][0]
    cell = CellKey(kept["mode"], trace=trace, budget=budget)
    assert view.serving.figures(cell)[kept["repetition"]] == replay_figures(kept["replay"])
    per_request = view.serving.request_figures(cell)[kept["repetition"]]
    first = kept["replay"]["requests"][0]
    assert per_request["ttft"][0] == first["token_times"][0] - first["arrival"]
