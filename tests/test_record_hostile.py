"""Hostile records: committed records mutated field by field, read by every command that reads records.

The promise (docs/record.md, "What a reader can trust"): a record either loads and every command
works on it, or it is refused with one line naming the file and the field, exit status 2. Never a
traceback, never exit 1. The commands run in this process (kvbench.cli.main), so that a hundred
mutations cost seconds, not minutes of interpreter start-ups.
"""

from __future__ import annotations

import contextlib
import copy
import io
import re
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reading import shared_reads
from records import mutated, paths

from kvbench.cli import main
from kvbench.export import FORMATS
from kvbench.record import RecordError, load_record

ROOT = Path(__file__).resolve().parents[1]
# One record of each shape a reader meets: the loop (gpt2 and llama), a request, a contexts sweep with
# limits and hf-* modes. Small ones, so that every command on every mutation stays cheap.
RECORDS = ("results/layouts/seed.json", "results/llama/llama-tiny.json", "results/latency/llama-mini-request.json",
           "results/latency/qwen2.5-0.5b-contexts.json")
ORIGINALS = {name: json.loads((ROOT / name).read_text()) for name in RECORDS}
# What replaces a value: every JSON type, and numbers no measurement has.
HOSTILE = ([], [1, "x"], {}, {"junk": [1]}, "", "junk", "<b>x</b>", 10**30, -1, -1e300, 0, 0.5, float("nan"), None, True)
EXAMPLES = 40  # with the deadline below, about a minute of the suite on a shared 2-core machine


PATHS = {name: paths(record) for name, record in ORIGINALS.items()}


@pytest.fixture(scope="module", autouse=True)
def reads_shared():
    """Each distinct file loaded once and each distinct plot drawn once, across the examples (tests/reading.py)."""
    with shared_reads():
        yield


def run(*argv: str) -> tuple[int, str]:
    """kvbench's exit status and standard error, in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main([str(a) for a in argv])
        except SystemExit as exit_:
            status = exit_.code
    return status, err.getvalue()


def reading_commands(path: Path, original: Path, output: Path) -> list[list]:
    """Every command that reads a record, on `path` (compare: against the record it was made from)."""
    commands = [["show", path], *(["report", path, "--format", layout] for layout in ("text", "markdown", "html")),
                ["compare", original, path], ["compare", original, path, "--across-machines"]]
    for layout in FORMATS:
        commands.append(["export", path, "--format", layout, "--output", output / f"{layout}.json", "--force",
                         *(["--repository", "https://github.com/example/kvbench"] if layout == "conbench" else [])])
    return commands


def assert_every_reader_copes(record: dict, original: str, directory: Path) -> None:
    path = directory / "mutated.json"
    path.write_text(json.dumps(record))  # NaN is written as NaN: a reader must refuse it, not believe it
    try:
        load_record(path)
        loads = True
    except RecordError as error:
        loads = False
        assert str(path) in str(error) and "\n" not in str(error)
    for argv in reading_commands(path, ROOT / original, directory):
        status, err = run(*argv)
        assert status in (0, 2), f"{argv[:4]} exited {status}: {err}"
        if status == 2:
            assert len(err.strip().splitlines()) == 1 and err.startswith("kvbench: error: "), err
        if loads and argv[0] != "compare":  # compare may refuse to line up different work
            assert status == 0, f"{argv[:4]}: the record loads, but the command refused it: {err}"
        if not loads:
            assert status == 2 and str(path) in err, f"{argv[:4]}: {err}"


@st.composite
def mutations(draw):
    name = draw(st.sampled_from(RECORDS))
    path = draw(st.sampled_from(PATHS[name]))
    how = draw(st.sampled_from(("replace", "replace", "delete", "junk")))
    return name, mutated(ORIGINALS[name], path, how, draw(st.sampled_from(HOSTILE)))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(mutations())
def test_a_mutated_record_loads_and_works_everywhere_or_is_refused_in_one_line(mutation):
    name, record = mutation
    with tempfile.TemporaryDirectory() as directory:
        assert_every_reader_copes(record, name, Path(directory))


@pytest.mark.parametrize("name", RECORDS)
def test_the_committed_records_work_with_every_reader(name, tmp_path):
    assert_every_reader_copes(ORIGINALS[name], name, tmp_path)


# --- the cases found by hand: each loaded before, and crashed a reader ---------------------------------------


def with_change(name: str, change) -> dict:
    record = copy.deepcopy(ORIGINALS.get(name) or json.loads((ROOT / name).read_text()))
    change(record)
    return record


def renamed(record: dict, old: str, new: str) -> None:
    """Every cell of mode `old` becomes mode `new`, consistently: only the mode's name is wrong."""
    record["run"]["modes"] = [new if mode == old else mode for mode in record["run"]["modes"]]
    for entries in (record["checks"], record["repetitions"], record["memory"], record["summary"]["cells"],
                    record["summary"]["speedups"], record["summary"].get("controls", [])):
        for entry in entries:
            entry["mode"] = new if entry["mode"] == old else entry["mode"]


HAND_FOUND = {
    "a hostname that is a list": ("results/layouts/seed.json", "environment/os/hostname",
                                  lambda r: r["environment"]["os"].update(hostname=["bench", "1"])),
    "a CPU frequency that is a string": ("results/layouts/seed.json", "environment/system/cpu_freq_max_mhz",
                                         lambda r: r["environment"]["system"].update(cpu_freq_max_mhz="3.1 GHz")),
    "a git commit that is an object": ("results/layouts/seed.json", "environment/kvbench/git_commit",
                                       lambda r: r["environment"]["kvbench"].update(git_commit={"sha": "abc"})),
    "a contexts record without a matmul rate": ("results/latency/qwen2.5-0.5b-contexts.json", "limits/matmul",
                                                lambda r: r["limits"].update(matmul=[])),
    "an hf-* mode on the gpt2 family": ("results/layouts/seed.json", "run/modes",
                                        lambda r: renamed(r, "static", "hf-static")),
}


@pytest.mark.parametrize("case", HAND_FOUND)
def test_a_record_a_reader_would_trip_on_is_refused_naming_the_file_and_the_field(case, tmp_path):
    name, field, change = HAND_FOUND[case]
    assert_refused_naming(with_change(name, change), name, field, tmp_path)


def assert_refused_naming(record: dict, name: str, field: str, directory: Path) -> None:
    """`record` is refused by the library and by every reading command in one line naming the file and `field`."""
    path = directory / "hostile.json"
    path.write_text(json.dumps(record))
    with pytest.raises(RecordError) as refused:
        load_record(path)
    assert str(refused.value).startswith(f"{path}: {field}")
    for argv in reading_commands(path, ROOT / name, directory):
        status, err = run(*argv)
        assert (status, err.count("\n")) == (2, 1) and f"{path}: {field}" in err, (argv, err)


def current(name: str) -> dict:
    """A committed record as kvbench writes it today: upgraded to schema 4, as plain JSON."""
    return json.loads(json.dumps(load_record(ROOT / name)))


def first_cell(record: dict) -> dict:
    return record["summary"]["cells"][0]


def without_per_token_median(change):
    """A /3 file that lacks a derived per-token median (filled on load from the cell's median and length),
    and whose cell is changed by `change`."""
    def mutate(record):
        record["schema"] = "kvbench.record/3"  # only a /3 label is filled: a /4 file lacking it is refused
        del first_cell(record)["per_token_median"]
        change(first_cell(record))
    return mutate


QUALITY = "results/real/quality-quantized.json"  # a real model's run: model, token_ids and quality sections
# Schema 3 records whose derived or read-by-the-report fields are missing or out of range: each was read before
# anything checked it (show and report exited 1 with a ZeroDivisionError, a KeyError or a TypeError).
SCHEMA_3_FOUND = {
    "a cell of length 0 without its per-token median": (
        "results/layouts/seed.json", "summary/cells/0/length: 0 is less than the minimum of 1",
        without_per_token_median(lambda cell: cell.update(length=0))),
    "a cell without a length or its per-token median": (
        "results/layouts/seed.json", "summary/cells/0: 'length' is a required property",
        without_per_token_median(lambda cell: cell.pop("length"))),
    "a cell whose length is a string, without its per-token median": (
        "results/layouts/seed.json", "summary/cells/0/length: 'x' is not of type 'integer'",
        without_per_token_median(lambda cell: cell.update(length="x"))),
    "a quantized cache's group of 0 tokens": (
        QUALITY, "run/cache_options/quantized-int8/group_size: 0 is less than the minimum of 1",
        lambda r: r["run"]["cache_options"]["quantized-int8"].update(group_size=0)),
    "a negative residual": (QUALITY, "run/cache_options/quantized-int4/residual: -1 is less than the minimum of 0",
                            lambda r: r["run"]["cache_options"]["quantized-int4"].update(residual=-1)),
    "a group size that is a string": (QUALITY, "run/cache_options/quantized-int8/group_size: '32' is not of type",
                                      lambda r: r["run"]["cache_options"]["quantized-int8"].update(group_size="32")),
    "a quality entry without its KL": (QUALITY, "quality/modes/0: 'kl_mean' is a required property",
                                       lambda r: r["quality"]["modes"][0].pop("kl_mean")),
    "a quality entry without its sample": (QUALITY, "quality/modes/1: 'sample' is a required property",
                                           lambda r: r["quality"]["modes"][1].pop("sample")),
    "a top-1 agreement above 1": (QUALITY, "quality/modes/1/top1_agreement: 1.5 is greater than the maximum of 1",
                                  lambda r: r["quality"]["modes"][1].update(top1_agreement=1.5)),
    "an interval with a low and no high": (QUALITY, "quality/modes/1/nll_difference/high: None is not of type",
                                           lambda r: r["quality"]["modes"][1]["nll_difference"].update(high=None)),
    "a quality section without its greedy prompt": (QUALITY, "quality: 'prompt' is a required property",
                                                    lambda r: r["quality"].pop("prompt")),
    "corpus token ids without their sha256": (QUALITY, "token_ids: 'sha256' is a required property",
                                              lambda r: r["token_ids"].pop("sha256")),
    "corpus token ids without their name": (QUALITY, "token_ids: 'name' is a required property",
                                            lambda r: r["token_ids"].pop("name")),
}


def test_random_token_ids_need_no_corpus_name_and_every_reader_copes(tmp_path):
    """Only corpus token ids name a corpus and its digest; random ones load and are reported as such."""
    record = current(QUALITY)
    record["token_ids"] = {"source": "random"}
    assert_every_reader_copes(record, QUALITY, tmp_path)
    from kvbench.record import RecordView
    from kvbench.report.record.quality import model_sentence

    assert model_sentence(RecordView(load_record(tmp_path / "mutated.json"))).endswith("; random token ids")


@pytest.mark.parametrize("case", SCHEMA_3_FOUND)
def test_a_current_record_missing_what_is_derived_or_read_is_refused_naming_the_field(case, tmp_path):
    name, field, change = SCHEMA_3_FOUND[case]
    record = current(name)
    change(record)
    assert record["schema"] in ("kvbench.record/3", "kvbench.record/4")
    assert_refused_naming(record, name, field, tmp_path)


def test_a_version_1_run_written_as_version_3_without_its_per_token_medians_loads_as_before(tmp_path):
    """The check before the filling holds what version 3 allows (schema 1's samples have no start time, its
    summary no interval), not version 2's stricter types: a sound file lacking only derived keys still loads."""
    record = {**current("results/layouts/seed.json"), "schema": "kvbench.record/3"}
    for cell in record["summary"]["cells"]:
        del cell["per_token_median"]
    path = tmp_path / "unfilled.json"
    path.write_text(json.dumps(record))
    assert load_record(path) == current("results/layouts/seed.json")


def test_the_gpt2_refusal_is_the_rule_run_applies():
    """One rule, stated once: the record's check says what `kvbench run --modes hf-static` says of gpt2."""
    from kvbench.config import PlainConfig
    from kvbench.models.hf import hf_architecture

    with pytest.raises(ValueError) as run_says:
        hf_architecture(PlainConfig())
    record = with_change("results/layouts/seed.json", lambda r: renamed(r, "static", "hf-static"))
    from kvbench.record import validate_record

    with pytest.raises(RecordError, match=re.escape(str(run_says.value))):
        validate_record(record)


def test_a_sensor_that_failed_is_null_and_loads(tmp_path):
    """capture.py writes None, with its reason, for a key it could not read: such a record is sound."""
    def failed(record):
        record["environment"]["system"]["cpu_freq_max_mhz"] = None
        record["environment"]["kvbench"]["git_commit"] = None
        record["environment"]["unavailable"].update({"system.cpu_freq_max_mhz": "not reported",
                                                     "kvbench.git_commit": "no commits yet"})
    path = tmp_path / "sensor.json"
    path.write_text(json.dumps(with_change("results/layouts/seed.json", failed)))
    assert load_record(path)["environment"]["kvbench"]["git_commit"] is None
    assert run("show", path)[0] == 0 and run("export", path, "--format", "bmf", "--output", tmp_path / "b.json")[0] == 0


def committed_records() -> list[Path]:
    found = []
    for path in sorted((ROOT / "results").rglob("*.json")):
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            if str(json.loads(path.read_text()).get("schema", "")).startswith("kvbench.record/"):
                found.append(path)
    return found


def test_every_committed_record_still_loads():
    paths = committed_records()
    assert len(paths) >= 100  # results/ holds about a hundred records: a broken glob must not pass quietly
    for path in paths:
        load_record(path)
