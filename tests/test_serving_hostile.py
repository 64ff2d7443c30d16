"""Hostile serving records: a committed one mutated field by field, read by every command that reads it.

The promise is a loop record's (tests/test_record_hostile.py): a serving record either reads and every command
works on it, or it is refused with one line naming the file and the field, exit status 2, before anything is
computed from it (kvbench.record.serving). Never a traceback, a division by zero or a field exported as it came.
The commands run in this process (kvbench.cli.main).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import re
import signal
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reading import shared_reads
from records import mutated, paths

from kvbench.cli import main
from kvbench.export import FORMATS
from kvbench.files import read_json
from kvbench.record import load_record, validate_record
from kvbench.record.upgrade import serving_to_v4

ROOT = Path(__file__).resolve().parents[1]
NAME = "results/serving/llama-mini-prefix-64.json"  # static and paged, 8 requests with a 64-token prefix: small
# the committed record is kvbench.serving/1, upgraded on load; the mutations are made to the record a run writes today
ORIGINAL = serving_to_v4(json.loads((ROOT / NAME).read_text()))
SERVING = sorted((ROOT / "results" / "serving").glob("*.json"))
PREFIX = "malformed serving record: "


@pytest.fixture(scope="module", autouse=True)
def reads_shared():
    """Each distinct file loaded once and each distinct plot drawn once, across the examples (tests/reading.py)."""
    with shared_reads():
        yield


def run(*argv) -> tuple[int, str, str]:
    """kvbench's exit status, standard output and standard error, in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([str(a) for a in argv])
    return status, out.getvalue(), err.getvalue()


def reading_commands(path: Path, output: Path) -> list[list]:
    """Every command that reads a serving record, on `path` (compare: against the record it was made from)."""
    commands = [["show", path], *(["report", path, "--format", layout] for layout in ("text", "markdown", "html")),
                ["compare", ROOT / NAME, path, "--force"]]
    for layout in FORMATS:
        commands.append(["export", path, "--format", layout, "--output", output / f"{layout}.json", "--force",
                         *(["--repository", "https://github.com/example/kvbench"] if layout == "conbench" else [])])
    return commands


def changed(change) -> dict:
    record = copy.deepcopy(ORIGINAL)
    change(record)
    return record


def first_request(record: dict, sample: int = 0) -> dict:
    return record["repetitions"][sample]["replay"]["requests"][0]


def zero_every_time(record: dict) -> None:
    """Every stamp of every replay at 0: no time passed, so every throughput would divide by zero."""
    for kept in record["repetitions"]:
        for request in kept["replay"]["requests"]:
            request.update(arrival=0.0, admitted=0.0, token_times=[0.0] * len(request["token_times"]),
                           token_cpu_times=[0.0] * len(request["token_cpu_times"]))


def without_paged_replays(record: dict) -> None:
    record["repetitions"] = [kept for kept in record["repetitions"] if kept["mode"] != "paged"]


def check_of(record: dict, kind: str) -> dict:
    return next(check for check in record["checks"] if check["mode"] == kind)


REPLAY = "repetitions/0/replay/requests/0"
# mutation -> the field and what is wrong with it, as the one line says them
HOSTILE = {
    "no between-run allowance": (lambda r: r["protocol"].pop("between_run"),
                                 "protocol/between_run: expected a relative standard deviation in [0, 0.5), got None"),
    "a sample without seconds": (lambda r: r["repetitions"][3].pop("seconds"),
                                 "repetitions/3/seconds: expected a finite number > 0, got None"),
    "a sample of another trace": (lambda r: r["repetitions"][3].update(trace="chat"),
                                  "repetitions/3/trace: expected the run's 'fixed', got 'chat'"),
    "a sample of another budget": (lambda r: r["repetitions"][3].update(budget=1),
                                   "repetitions/3/budget: expected the run's 8388608, got 1"),
    "a trace without requests": (lambda r: r["serving"]["trace"].pop("requests"),
                                 "serving/trace: a trace's requests are a list of objects with exactly the fields"),
    "a trace spec that is a list": (lambda r: r["serving"]["trace"].update(spec=["chat"]),
                                    "serving/trace/spec: expected dict, got list"),
    "checks that are true": (lambda r: r.update(checks=[True for _ in r["checks"]]),
                             "checks/0: expected dict, got bool"),
    "a check without passed": (lambda r: check_of(r, "paged").pop("passed"),
                               "checks/1/passed: expected true or false, got None"),
    "a kind without its check": (lambda r: r["checks"].pop(1),
                                 "checks: expected a check of every kind ['static', 'paged'], got none of 'paged'"),
    "every token at time 0": (zero_every_time, f"{REPLAY}/token_times/"),
    "a budget of 'lots'": (lambda r: r["serving"]["budget"].update(bytes="lots"),
                           "serving/budget/bytes: expected an integer >= 1, got 'lots'"),
    "a negative token time": (lambda r: first_request(r)["token_times"].__setitem__(0, -1.0),
                              f"{REPLAY}/token_times/0: expected a finite number >= 0, got -1.0"),
    "token times out of order": (lambda r: first_request(r)["token_times"].__setitem__(1, 0.0),
                                 f"{REPLAY}/token_times/1: expected a finite number >= "),
    "a first token before its admission": (lambda r: first_request(r).update(admitted=1e6),
                                           f"{REPLAY}/token_times/0: expected the first token at "
                                           "or after its admission at 1e+06 s"),
    "fewer CPU stamps than wall stamps": (
        lambda r: first_request(r)["token_cpu_times"].pop(),
        f"{REPLAY}/token_cpu_times: expected one CPU stamp per token ("),
    "more tokens than the request's output": (
        lambda r: first_request(r)["token_times"].extend([1e3] * 4096),
        f"{REPLAY}/token_times: expected 1 to "),
    "a replay of other requests": (lambda r: r["repetitions"][0]["replay"]["requests"].pop(),
                                   "repetitions/0/replay/requests: expected the trace's 8 requests, got 7"),
    "more used than reserved": (lambda r: r["repetitions"][0]["replay"]["iterations"][0].update(used=1e15),
                                "repetitions/0/replay/iterations/0/used: expected at most the "),
    "a replay of an unknown mode": (lambda r: r["repetitions"][0].update(mode="fast"),
                                    "repetitions/0/mode: expected one of ['control', 'paged', 'static'], got 'fast'"),
    "one rotation twice": (lambda r: r["repetitions"].append(copy.deepcopy(r["repetitions"][0])),
                           "repetitions/9/repetition: expected one replay of "),
    "a passed kind without a replay": (without_paged_replays,
                                       "repetitions: kinds ['paged'] passed their check but have no replay"),
    "a status that is a word": (lambda r: r.update(status="yes"),
                                "status: expected 'complete' or 'incomplete', got 'yes'"),
    "a kind named in markup": (lambda r: r["run"].update(modes=["static", "[bold]paged"]),
                               "run/modes: expected a non-empty list of kind names ([a-z][a-z0-9_-]{0,39}, not 'control'), "
                               "got ['static', '[bold]paged']"),
    "a kind named twice": (lambda r: r["run"].update(modes=["static", "static"]),
                           "run/modes: expected each kind once, got ['static', 'static']"),
    "repeats other than the protocol's": (lambda r: r["run"].update(repeats=4),
                                          "run/repeats: expected the protocol's 3, got 4"),
    "a workload of another trace": (lambda r: r["run"]["workload"].update(trace="chat"),
                                    "run/workload: expected {'kind': 'serving', 'trace': 'fixed'}, got "),
    "a model of no width": (lambda r: r["config"].update(width="x"),
                            "config: width must be a positive integer, got 'x'"),
    "a hostname that is a list": (lambda r: r["environment"]["os"].update(hostname=["bench", "1"]),
                                  "environment/os/hostname: "),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_serving_record_is_one_line_naming_the_file_and_the_field(case, tmp_path):
    change, words = HOSTILE[case]
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(changed(change)))
    for argv in reading_commands(path, tmp_path):
        status, _, err = run(*argv)
        assert status == 2 and err.count("\n") == 1, (argv[:3], err)
        assert err.startswith(f"kvbench: error: {path}: {PREFIX}{words}"), (argv[:3], err)
    assert not list(tmp_path.glob("*.json.*")) and sorted(tmp_path.iterdir()) == [path]  # nothing exported


def test_the_committed_serving_records_read_and_a_failed_kind_is_no_malformed_record(tmp_path):
    """Every committed record (kvbench.serving/1) upgrades and passes the check; a kind that failed its gate has
    no replay and is said to."""
    for path in SERVING:
        assert load_record(path)["run"]["modes"]

    def failed(record):
        without_paged_replays(record)
        check_of(record, "paged").update(passed=False, failed_requests=[{"request": 3, "position": 7}])
    path = tmp_path / "failed.json"
    path.write_text(json.dumps(changed(failed)))
    status, out, err = run("report", path)
    assert status == 0 and "EQUIVALENCE FAILED: paged: requests [{'request': 3, 'position': 7}]" in out, err
    status, out, err = run("compare", ROOT / NAME, path)
    assert status == 0 and "note: NEW's paged FAILED its gate" in out and "skipped (not in both records): " \
        "OLD's paged" in out, err


# --- any field, any value -----------------------------------------------------------------------------------


PATHS = paths(ORIGINAL)
VALUES = ([], {}, "", "junk", 10**30, -1, -1e300, 0, 0.5, 1e300, float("nan"), None, True)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(PATHS), st.sampled_from(("replace", "delete")), st.sampled_from(VALUES))
def test_a_mutated_serving_record_works_everywhere_or_is_refused_in_one_line(path, how, value):
    record = mutated(ORIGINAL, path, how, value)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "mutated.json"
        path.write_text(json.dumps(record))  # NaN is written as NaN: the reader refuses it, naming the field
        try:  # as a reader reads it: NaN anywhere is refused by the file reader, naming the field
            validate_record(read_json(path, "record"), str(path))
            sound = True
        except ValueError as error:
            sound = False
            assert str(error).startswith(f"{path}: ") and "\n" not in str(error)
        for argv in reading_commands(path, Path(directory)):
            status, _, err = run(*argv)
            assert status in (0, 2) and err.count("\n") <= 1, (argv[:3], status, err)
            if sound:
                assert status == 0 or argv[0] == "compare", (argv[:3], err)  # compare may find other work
            else:
                assert status == 2 and err.startswith(f"kvbench: error: {path}: "), (argv[:3], err)


# --- an interrupted run: kept, and said to be incomplete everywhere -------------------------------------------


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A serving run cut by SIGTERM after its 4th replay (of 9: static, paged and the A/A control, 3 rotations),
    the signal sent to this process from inside the sampler, as `timeout` or a CI runner would send it."""
    import torch

    from kvbench.serving import replay as serving  # where the sampler is called from (the layout moved it)

    real, sent = serving.sample, []

    def cut_short(*args, **kwargs):
        def on_sample(kept):
            sent.append(kept)
            if len(sent) == 4:
                os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **{**kwargs, "on_sample": on_sample})

    record = tmp_path_factory.mktemp("interrupted") / "cut.json"
    threads, serving.sample = torch.get_num_threads(), cut_short
    torch.set_num_threads(1)
    try:
        status, out, err = run("run", "--trace", "fixed:6,5", "--requests", "4", "--modes", "static,paged",
                               "--repeats", "3", "--output", record)
    finally:
        serving.sample = real
        torch.set_num_threads(threads)
    return record, status, out, err


def test_an_interrupted_serving_run_keeps_what_it_measured_and_says_so(interrupted):
    record, status, out, err = interrupted
    data = json.loads(record.read_text())
    assert status == 128 + signal.SIGTERM and f"marked incomplete: {record}" in err
    assert data["status"] == "incomplete" and len(data["repetitions"]) == 4
    assert {check["mode"] for check in data["checks"]} == {"static", "paged"}
    assert load_record(record) == data  # an incomplete record is a sound one
    assert "kvbench serving: seed, kinds static, paged (INCOMPLETE: interrupted run)" in out
    assert "INCOMPLETE record: the run was interrupted; only the completed replays are shown" in out


@pytest.mark.parametrize("layout, words", [
    ("text", ["kvbench serving: seed, kinds static, paged (INCOMPLETE: interrupted run)",
              "INCOMPLETE record: the run was interrupted; only the completed replays are shown"]),
    ("markdown", ["**kvbench serving: seed, kinds static, paged** — **INCOMPLETE: interrupted run**",
                  "> **Note:** INCOMPLETE record: the run was interrupted; only the completed replays are shown"]),
    ("html", ['<div class="banner">INCOMPLETE record: the run was interrupted; only the completed replays are '
              'shown.</div>']),
])
def test_every_report_layout_of_an_interrupted_record_says_incomplete(interrupted, tmp_path, layout, words):
    record = interrupted[0]
    status, out, err = run("report", record, "--format", layout)
    assert status == 0 and all(word in out for word in words), err
    status, _, err = run("report", record, "--format", layout, "--output", tmp_path / f"report.{layout}")
    assert status == 0 and all(word in (tmp_path / f"report.{layout}").read_text() for word in words), err


def test_compare_and_export_of_an_interrupted_record_say_incomplete(interrupted, tmp_path):
    record = interrupted[0]
    for layout in ("text", "markdown"):
        status, out, err = run("compare", record, record, "--format", layout)
        assert status == 0 and "OLD is INCOMPLETE (interrupted run): only its completed replays are compared" in out \
            and "NEW is INCOMPLETE (interrupted run)" in out, err
    for layout in ("conbench", "github-action-benchmark", "pytest-benchmark"):
        output = tmp_path / f"{layout}.json"
        status, _, err = run("export", record, "--format", layout, "--output", output,
                             *(["--repository", "https://github.com/example/kvbench"] if layout == "conbench" else []))
        assert status == 0, err
        exported = json.loads(output.read_text())
        facts = {"conbench": lambda: [result["info"]["record_status"] for result in exported],
                 "github-action-benchmark": lambda: [re.search(r"record_status: (\w+)", entry["extra"])[1]
                                                     for entry in exported],  # the figures' and quantities' too
                 "pytest-benchmark": lambda: [b["extra_info"]["record_status"] for b in exported["benchmarks"]]}
        assert set(facts[layout]()) == {"incomplete"}, layout


def test_a_run_interrupted_in_its_gates_reports_what_it_has_and_exports_nothing(tmp_path):
    """Cut before any replay: one check of two, no sample. The report says so under the kinds' headers; compare
    and export have nothing to line up and say why in one line."""
    def in_the_gates(record):
        record.update(status="incomplete", repetitions=[])
        record["run"]["control"] = None
        record["checks"].pop(1)
    path = tmp_path / "gates.json"
    path.write_text(json.dumps(changed(in_the_gates)))
    status, out, err = run("report", path)
    assert status == 0 and "(INCOMPLETE: interrupted run)" in out and "x static" in out and "static   pass" \
        not in out, err
    for argv in (["compare", ROOT / NAME, path], ["export", path, "--format", "bmf", "--output", tmp_path / "o.json"]):
        status, _, err = run(*argv)
        assert (status, err) == (2, f"kvbench: error: {path}: a serving record without a replay: "
                                    "repetitions: none was kept (interrupted)\n")
