"""kvbench export: every format of results/reference.json read back by its consumer, not only written.

pytest-benchmark's own `pytest-benchmark compare` (a subprocess) prints the exported file's table;
the conbench document passes conbench's client-side BenchmarkResult (benchadapt) and a schema of
the server's documented create rules; BMF and github-action-benchmark documents pass schemas
written from their published documentation (tests/schemas/). Then several machines, bad records.
"""

import copy
import json
import math
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import jsonschema
import pytest
from records import synthetic_record, view

from kvbench.cli import main
from kvbench.export import FORMATS, export_document
from kvbench.export.pytest_benchmark import sample_stats
from kvbench.record import RecordView

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results" / "reference.json"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
REPOSITORY = "https://github.com/example-org/kvbench"
PYTEST_BENCHMARK = str(Path(sys.executable).with_name("pytest-benchmark"))


def schema(name: str) -> dict:
    return json.loads((SCHEMAS / name).read_text())


def export(capsys, tmp_path, fmt, *records, extra=()):
    output = tmp_path / f"{fmt}.json"
    code = main(["export", *map(str, records or (REFERENCE,)), "--format", fmt, "--output", str(output), *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"wrote {output}" in out
    return json.loads(output.read_text()), output


@pytest.fixture(scope="module")
def reference():
    return RecordView.load(REFERENCE)


def cells(reference):
    return reference.cells()


def speedup_entry(reference, mode, length):
    return reference.speedup(mode, length)


def test_formats_are_the_cli_choices():
    from kvbench.cli import build_parser

    export_parser = build_parser()._subparsers._group_actions[0].choices["export"]
    (choices,) = [action.choices for action in export_parser._actions if "--format" in action.option_strings]
    assert list(choices) == list(FORMATS) == ["bmf", "conbench", "github-action-benchmark",
                                              "github-action-benchmark-bigger-is-better", "pytest-benchmark"]


# -- Bencher Metric Format ----------------------------------------------------------------------


def test_bmf_validates_and_holds_every_cell_with_its_interval_and_speedup(capsys, tmp_path, reference):
    document, _ = export(capsys, tmp_path, "bmf")
    jsonschema.validate(document, schema("bmf.schema.json"))
    assert len(document) == len(cells(reference)) == 24
    for mode, length in cells(reference):
        measures = document[f"kvbench/seed/{mode}/{length}"]
        latency = measures["latency"]
        assert latency["value"] == pytest.approx(reference.summary(mode, length)["median"] * 1e9)
        assert latency["lower_value"] < latency["value"] < latency["upper_value"]
        if mode == "full":
            assert set(measures) == {"latency"}
            continue
        entry = speedup_entry(reference, mode, length)
        assert measures["speedup"] == pytest.approx({"value": entry["speedup"], "lower_value": entry["low"],
                                                     "upper_value": entry["high"]})


def test_bmf_of_the_reference_matches_the_report_interval(capsys, tmp_path):
    """static at 512: the README prints 9.06x [8.79, 9.32] for this record."""
    document, _ = export(capsys, tmp_path, "bmf")
    speedup = document["kvbench/seed/static/512"]["speedup"]
    assert (round(speedup["value"], 2), round(speedup["lower_value"], 2), round(speedup["upper_value"], 2)) == \
        (9.06, 8.79, 9.32)


# -- github-action-benchmark --------------------------------------------------------------------


def test_github_action_benchmark_validates_with_unique_names_and_cost_vs_full(capsys, tmp_path, reference):
    document, _ = export(capsys, tmp_path, "github-action-benchmark")
    jsonschema.validate(document, schema("github-action-benchmark.schema.json"))
    names = [entry["name"] for entry in document]
    assert len(names) == len(set(names)), "the action matches a benchmark to its previous value by name"
    by_name = {entry["name"]: entry for entry in document}
    for mode, length in cells(reference):
        seconds = by_name[f"kvbench/seed/{mode}/{length}"]
        assert seconds["unit"] == "ms"
        assert seconds["value"] == pytest.approx(reference.summary(mode, length)["median"] * 1e3)
        low, high = map(float, re.match(r"([0-9.e+-]+) to ([0-9.e+-]+) ms", seconds["range"]).groups())
        assert low < seconds["value"] < high
        samples = seconds["extra"].split("samples ms: ")[1].split()
        assert [float(s) for s in samples] == pytest.approx([s * 1e3 for s in reference.seconds(mode, length)],
                                                             rel=1e-5)
        cost = by_name.get(f"kvbench/seed/{mode}/{length} cost vs full")
        if mode == "full":
            assert cost is None
        else:
            assert cost["value"] == pytest.approx(1 / speedup_entry(reference, mode, length)["speedup"])


def test_the_bigger_is_better_document_holds_each_speedup_as_it_is(capsys, tmp_path, reference):
    """The action's tool is one direction per file: speedups (and a serving run's throughputs) go into a
    customBiggerIsBetter document in their own units, never inverted into the smaller-is-better one."""
    document, _ = export(capsys, tmp_path, "github-action-benchmark-bigger-is-better")
    jsonschema.validate(document, schema("github-action-benchmark.schema.json"))
    by_name = {entry["name"]: entry for entry in document}
    cached = [(mode, length) for mode, length in cells(reference) if mode != "full"]
    assert sorted(by_name) == sorted(f"kvbench/seed/{mode}/{length} speedup vs full" for mode, length in cached)
    for mode, length in cached:
        entry, truth = by_name[f"kvbench/seed/{mode}/{length} speedup vs full"], speedup_entry(reference, mode, length)
        assert entry["unit"] == "x full" and entry["value"] == pytest.approx(truth["speedup"])
        assert entry["range"].startswith(f"{truth['low']:.6g} to {truth['high']:.6g} x full")
    smaller, _ = export(capsys, tmp_path, "github-action-benchmark")
    assert not [entry for entry in smaller if "speedup" in entry["name"] or "/(" in entry["unit"]]


# -- conbench -----------------------------------------------------------------------------------


def test_conbench_passes_benchadapt_and_the_servers_rules(capsys, tmp_path, reference):
    from benchadapt import BenchmarkResult

    document, _ = export(capsys, tmp_path, "conbench", extra=("--repository", REPOSITORY))
    assert isinstance(document, list) and len(document) == len(cells(reference))
    server = schema("conbench-result.schema.json")
    for result in document:
        jsonschema.validate(result, server)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # benchadapt warns "Result not publishable!" for a result the server refuses
            assert BenchmarkResult(**copy.deepcopy(result)).to_publishable_dict() == result
        tags = result["tags"]
        mode, length = tags["mode"], int(tags["length"])
        assert result["stats"]["data"] == [r["seconds"] for r in reference.repetitions(mode, length)]
        assert result["stats"]["unit"] == "s"
        assert result["github"] == {"repository": REPOSITORY, "commit": reference.environment["kvbench"]["git_commit"]}
        assert result["machine_info"]["name"] == "vm" and result["machine_info"]["cpu_model_name"] == "AMD EPYC"
        if mode != "full":
            entry = speedup_entry(reference, mode, length)
            info = result["info"]
            assert (info["speedup_vs_full"], info["speedup_low"], info["speedup_high"]) == \
                (entry["speedup"], entry["low"], entry["high"])
    assert len({r["run_id"] for r in document}) == 1, "one record is one conbench run"


def test_conbench_needs_a_github_repository(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("CONBENCH_PROJECT_REPOSITORY", raising=False)
    output = tmp_path / "c.json"
    for extra, fragment in (((), "--repository https://github.com/ORG/REPO"),
                            (("--repository", "https://gitlab.com/x/y"), "starting with https://github.com/")):
        code = main(["export", str(REFERENCE), "--format", "conbench", "--output", str(output), *extra])
        assert_one_line_error(capsys, code, fragment)
        assert not output.exists()
    monkeypatch.setenv("CONBENCH_PROJECT_REPOSITORY", REPOSITORY)
    document, _ = export(capsys, tmp_path, "conbench")
    assert document[0]["github"]["repository"] == REPOSITORY


# -- pytest-benchmark ---------------------------------------------------------------------------


def test_pytest_benchmark_stats_are_pytest_benchmarks_own(reference):
    """Every field as the pinned pytest-benchmark computes it, but hd15iqr: 5.2 returns the first datum beyond
    Q3 + 1.5 IQR (an outlier), 5.3 fixed it to the highest datum within, which kvbench writes."""
    from pytest_benchmark.stats import Stats

    datasets = [reference.seconds(mode, length) for mode, length in cells(reference)]
    datasets += [[1.0], [3.0, 1.0], [5.0, 1.0, 2.0, 4.0, 3.0], [1.0, 9.0, 2.0, 8.0, 3.0, 7.0, 100.0]]
    for data in datasets:
        theirs = Stats()
        for value in data:
            theirs.update(value)
        mine = sample_stats(data)
        fields = [field for field in Stats.fields if field != "hd15iqr"]
        assert {field: mine[field] for field in fields} == pytest.approx({f: theirs.as_dict()[f] for f in fields})
        assert mine["hd15iqr"] == max(value for value in data if value <= theirs.q3 + 1.5 * theirs.iqr)
        assert mine["data"] == data and mine["iterations"] == 1


@pytest.mark.skipif(not Path(PYTEST_BENCHMARK).exists(), reason="pytest-benchmark is in the dev extra")
def test_pytest_benchmark_compare_prints_the_exported_table(capsys, tmp_path, reference):
    document, output = export(capsys, tmp_path, "pytest-benchmark")
    assert document["commit_info"]["id"] == reference.environment["kvbench"]["git_commit"]
    done = subprocess.run([PYTEST_BENCHMARK, "compare", str(output), "--columns=min,median,max,rounds",
                           "--name=long", "--time-unit=ms", "--group-by=group"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Failed to load" not in done.stdout + done.stderr
    table = done.stdout
    for mode, length in cells(reference):
        name = f"kvbench/seed::decode[{mode}-{length}]"
        line = next((line for line in table.splitlines() if name in line), None)
        assert line is not None, f"{name} missing from:\n{table}"
        median_ms = reference.summary(mode, length)["median"] * 1e3
        numbers = [float(n.replace(",", "")) for n in re.findall(r"(?<![\w.\[-])[0-9][0-9,]*\.?[0-9]*(?![\w\]-])",
                                                                   line.split(name, 1)[1])]
        assert any(math.isclose(n, median_ms, rel_tol=1e-3) for n in numbers), (line, median_ms)
        assert len(reference.seconds(mode, length)) in numbers, line
    assert "seed, length 512" in table  # grouped by length: the modes line up


# -- request, contexts and incomplete records ----------------------------------------------------

REQUEST = ROOT / "results" / "latency" / "llama-mini-request.json"  # prompt 512, generate 128
CONTEXTS = ROOT / "results" / "latency" / "llama-mini-contexts.json"
INCOMPLETE_SECONDS = {("full", 8): [2.0e-3, 2.1e-3, 1.9e-3, 2.0e-3], ("concat", 8): [1.0e-3, 1.2e-3, 0.9e-3, 1.1e-3],
                      ("full", 16): [4.0e-3, 4.4e-3], ("concat", 16): [1.5e-3]}  # interrupted in length 16


@pytest.fixture
def other_work(tmp_path):
    """name -> (record path, workload name, {(mode, length): the samples each exported cell must hold})."""
    incomplete = tmp_path / "incomplete.json"
    incomplete.write_text(json.dumps(synthetic_record(INCOMPLETE_SECONDS, status="incomplete", repeats=4)))
    out = {"incomplete": (incomplete, "seed", dict(INCOMPLETE_SECONDS))}
    for name, path, workload in (("request", REQUEST, "llama-mini,prompt=512,generate=128"),
                                 ("contexts", CONTEXTS, "llama-mini,contexts")):
        record = RecordView.load(path)
        out[name] = (path, workload, {cell: record.seconds(*cell) for cell in record.cells()})
    return out


def test_a_request_samples_end_to_end_seconds_and_a_contexts_run_one_step():
    """What the exported samples are: a request's TTFT plus every step; the contexts' steps grow with the context."""
    request = RecordView.load(REQUEST)
    for rep in request.repetitions("static", 639):
        assert len(rep["step_seconds"]) == 127
        parts = rep["ttft_seconds"] + sum(rep["step_seconds"])
        assert parts <= rep["seconds"] <= 1.01 * parts  # the whole request, timed around its timed parts
    contexts = RecordView.load(CONTEXTS)
    assert contexts.run["workload"] == {"kind": "contexts"} and len(contexts.lengths) > 1
    shortest, longest = min(contexts.lengths), max(contexts.lengths)
    assert contexts.summary("full", longest)["median"] > contexts.summary("full", shortest)["median"]


@pytest.mark.parametrize("name", ["request", "contexts", "incomplete"])
def test_request_contexts_and_incomplete_records_export_their_own_samples_in_every_format(capsys, tmp_path, name,
                                                                                          other_work):
    from benchadapt import BenchmarkResult

    path, workload, samples = other_work[name]
    record = RecordView.load(path)
    bmf, _ = export(capsys, tmp_path, "bmf", path)
    jsonschema.validate(bmf, schema("bmf.schema.json"))
    cells = {name for name in bmf if name.count("/") == 3}  # the others are a request's or contexts run's figures
    assert cells == {f"kvbench/{workload}/{mode}/{length}" for mode, length in samples}
    assert all(name.rsplit("/", 1)[0] in cells for name in set(bmf) - cells)
    actions, _ = export(capsys, tmp_path, "github-action-benchmark", path)
    jsonschema.validate(actions, schema("github-action-benchmark.schema.json"))
    by_name = {entry["name"]: entry for entry in actions}
    conbench, _ = export(capsys, tmp_path, "conbench", path, extra=("--repository", REPOSITORY))
    by_cell = {(r["tags"]["mode"], int(r["tags"]["length"])): r for r in conbench if "figure" not in r["tags"]}
    assert set(by_cell) == set(samples)
    for (mode, length), seconds in samples.items():
        key = f"kvbench/{workload}/{mode}/{length}"
        median = sorted(seconds)[len(seconds) // 2] if len(seconds) % 2 else \
            sum(sorted(seconds)[len(seconds) // 2 - 1 : len(seconds) // 2 + 1]) / 2
        assert bmf[key]["latency"]["value"] == pytest.approx(median * 1e9)
        assert by_name[key]["value"] == pytest.approx(median * 1e3)
        assert f"record_status: {record.status}" in by_name[key]["extra"]
        assert [float(x) for x in by_name[key]["extra"].split("samples ms: ")[1].split()] == \
            pytest.approx([x * 1e3 for x in seconds], rel=1e-5)
        result = by_cell[(mode, length)]
        jsonschema.validate(result, schema("conbench-result.schema.json"))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert BenchmarkResult(**copy.deepcopy(result)).to_publishable_dict() == result
        assert result["stats"]["data"] == seconds and result["info"]["record_status"] == record.status
    if name == "incomplete":  # length 16 was cut short: its cells keep the samples taken, the speedup its one pair
        assert bmf["kvbench/seed/concat/16"]["speedup"]["value"] == pytest.approx(4.0e-3 / 1.5e-3)
        assert by_cell[("full", 16)]["stats"]["iterations"] == 1 and len(by_cell[("full", 16)]["stats"]["data"]) == 2


@pytest.mark.skipif(not Path(PYTEST_BENCHMARK).exists(), reason="pytest-benchmark is in the dev extra")
@pytest.mark.parametrize("name", ["request", "contexts", "incomplete"])
def test_pytest_benchmark_compare_prints_request_contexts_and_incomplete_records(capsys, tmp_path, name, other_work):
    path, workload, samples = other_work[name]
    document, output = export(capsys, tmp_path, "pytest-benchmark", path)
    assert {b["extra_info"]["record_status"] for b in document["benchmarks"]} == {RecordView.load(path).status}
    done = subprocess.run([PYTEST_BENCHMARK, "compare", str(output), "--columns=min,max,rounds", "--name=long",
                           "--time-unit=us", "--group-by=group"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "Failed to load" not in done.stdout + done.stderr, done.stderr
    for (mode, length), seconds in samples.items():
        name_in_table = f"kvbench/{workload}::decode[{mode}-{length}]"
        line = next((line for line in done.stdout.splitlines() if name_in_table in line), None)
        assert line is not None, f"{name_in_table} missing from:\n{done.stdout}"
        numbers = [float(n.replace(",", "")) for n in re.findall(r"(?<![\w.\[-])[0-9][0-9,]*\.?[0-9]*(?![\w\]-])",
                                                                   line.split(name_in_table, 1)[1])]
        assert any(math.isclose(n, min(seconds) * 1e6, rel_tol=1e-3) for n in numbers), (line, min(seconds))
        assert any(math.isclose(n, max(seconds) * 1e6, rel_tol=1e-3) for n in numbers), (line, max(seconds))
        assert len(seconds) in numbers, line


# -- several machines ---------------------------------------------------------------------------


@pytest.fixture
def second_machine(tmp_path):
    """The reference record as another machine took it: only the hostname, the machine's name, differs."""
    record = json.loads(REFERENCE.read_text())
    record["environment"]["os"]["hostname"] = "laptop"
    path = tmp_path / "laptop.json"
    path.write_text(json.dumps(record))
    return path


@pytest.fixture
def same_machine(tmp_path):
    """Another run on the reference's machine, of other work (two layers): other cells, the same hostname and CPU."""
    reference = json.loads(REFERENCE.read_text())
    record = synthetic_record({("full", 8): [2e-3, 2.2e-3, 1.9e-3], ("static", 8): [1e-3, 1.1e-3, 0.9e-3]},
                              config={**reference["config"], "layers": 2}, environment=reference["environment"])
    path = tmp_path / "same-machine.json"
    path.write_text(json.dumps(record))
    return path


def test_two_machines_go_into_one_conbench_and_one_action_file(capsys, tmp_path, second_machine):
    document, _ = export(capsys, tmp_path, "conbench", REFERENCE, second_machine, extra=("--repository", REPOSITORY))
    assert {r["machine_info"]["name"] for r in document} == {"vm", "laptop"}
    assert len(document) == 48 and len({r["run_id"] for r in document}) == 2
    actions, _ = export(capsys, tmp_path, "github-action-benchmark", REFERENCE, second_machine)
    jsonschema.validate(actions, schema("github-action-benchmark.schema.json"))
    names = [entry["name"] for entry in actions]
    assert "kvbench/seed/static/64 on vm" in names and "kvbench/seed/static/64 on laptop" in names
    assert len(names) == len(set(names))


@pytest.mark.parametrize("fmt, fragment", [("bmf", "--testbed"), ("pytest-benchmark", "one machine_info")])
def test_formats_with_one_machine_per_file_refuse_two(capsys, tmp_path, second_machine, fmt, fragment):
    output = tmp_path / "out.json"
    code = main(["export", str(REFERENCE), str(second_machine), "--format", fmt, "--output", str(output)])
    assert_one_line_error(capsys, code, fragment)
    assert not output.exists()


def test_records_of_one_machine_share_a_bmf_file_and_their_action_names_carry_no_machine(capsys, tmp_path,
                                                                                           same_machine):
    """The machine is told by the hostname: one machine's two records go into one file, two machines' do not."""
    document, _ = export(capsys, tmp_path, "bmf", REFERENCE, same_machine)
    assert len(document) == 24 + 2
    assert document["kvbench/seed,layers=2/static/8"]["latency"]["value"] == pytest.approx(1e-3 * 1e9)
    actions, _ = export(capsys, tmp_path, "github-action-benchmark", REFERENCE, same_machine)
    names = {entry["name"] for entry in actions}
    assert "kvbench/seed/static/64" in names and "kvbench/seed,layers=2/static/8" in names
    assert not any(" on " in name for name in names)


def test_records_of_different_commits_do_not_share_an_action_file(capsys, tmp_path, second_machine):
    record = json.loads(second_machine.read_text())
    record["environment"]["kvbench"]["git_commit"] = "b" * 40
    second_machine.write_text(json.dumps(record))
    output = tmp_path / "out.json"
    code = main(["export", str(REFERENCE), str(second_machine), "--format", "github-action-benchmark",
                 "--output", str(output)])
    assert_one_line_error(capsys, code, "one commit per run")
    assert not output.exists()


# -- what a cell that failed its check exports -----------------------------------------------------


def test_a_failed_check_keeps_its_seconds_and_loses_its_speedup():
    seconds = {("full", 8): [2e-3, 2.1e-3, 1.9e-3, 2e-3, 2e-3], ("concat", 8): [1e-3] * 5, ("static", 8): [1e-3] * 5}
    record = view(synthetic_record(seconds, failed={("concat", 8)}))
    bmf = export_document([record], "bmf")
    assert set(bmf["kvbench/seed/concat/8"]) == {"latency"}
    assert set(bmf["kvbench/seed/static/8"]) == {"latency", "speedup"}
    conbench = {r["tags"]["mode"]: r for r in export_document([record], "conbench", {"repository": REPOSITORY})}
    assert conbench["concat"]["info"]["speedup_valid"] is False and conbench["concat"]["info"]["equivalence"] == "FAILED"
    actions = {entry["name"] for entry in export_document([record], "github-action-benchmark")}
    assert "kvbench/seed/concat/8 cost vs full" not in actions and "kvbench/seed/static/8 cost vs full" in actions


def test_workload_names_what_differs_from_the_preset():
    seconds = {("full", 8): [2e-3] * 3, ("static", 8): [1e-3] * 3}
    record = synthetic_record(seconds)
    record["config"]["layers"] = 2
    names = export_document([view(record)], "bmf")
    assert set(names) == {"kvbench/seed,layers=2/full/8", "kvbench/seed,layers=2/static/8"}


# -- bad input ----------------------------------------------------------------------------------


def assert_one_line_error(capsys, code, fragment):
    _, err = capsys.readouterr()
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvbench: error: ") and "Traceback" not in err, err
    assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("content, fragment", [
    (None, "no such file"),
    ("", "not valid JSON"),
    ('{"schema": "kvbench.record/2", "status": "comp', "not valid JSON"),
    ('{"name": "package.json"}', "not a kvbench record"),
    ("[1, 2]", "expected a JSON object"),
])
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_bad_records_are_one_line_and_nothing_is_written(capsys, tmp_path, content, fragment, fmt):
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    output = tmp_path / "out.json"
    code = main(["export", str(REFERENCE), str(bad), "--format", fmt, "--output", str(output),
                 "--repository", REPOSITORY] if fmt == "conbench" else
                ["export", str(REFERENCE), str(bad), "--format", fmt, "--output", str(output)])
    assert_one_line_error(capsys, code, fragment)
    assert not output.exists() and list(tmp_path.iterdir()) == ([bad] if content is not None else [])


def reference_with(change) -> str:
    record = json.loads(REFERENCE.read_text())
    change(record)
    return json.dumps(record)


@pytest.mark.parametrize("content, fragment", [
    (reference_with(lambda r: r.update(schema="kvbench.record/99")),
     "bad.json: unsupported schema version 'kvbench.record/99'"),
    (reference_with(lambda r: r.update(status="bogus")), "bad.json: status: 'bogus' is not one of"),
    (reference_with(lambda r: r["repetitions"][0].update(seconds=float("nan"))),
     "bad.json: repetitions/0/seconds: non-finite"),
    (reference_with(lambda r: r["repetitions"][0].update(seconds=-1.0)),
     "bad.json: repetitions/0/seconds: -1.0 is less than"),
    (reference_with(lambda r: r["repetitions"][0].update(length="16")),
     "bad.json: repetitions/0/length: '16' is not of type"),
    (reference_with(lambda r: r["repetitions"][0].update(mode="warp")),
     "bad.json: repetition for mode 'warp' at length 16"),
    (reference_with(lambda r: r.update(environment=[])), "bad.json: environment: [] is not of type 'object'"),
    (reference_with(lambda r: r.update(checks=[c for c in r["checks"] if c["mode"] != "static"])),
     "bad.json: summary marks mode 'static' at length 16 valid=True, but its check gives valid=False"),
    (reference_with(lambda r: r["environment"]["os"].update(hostname=["vm"])), "environment/os/hostname"),
    (reference_with(lambda r: r["environment"]["kvbench"].update(git_commit={"sha": 1})),
     "environment/kvbench/git_commit"),
], ids=["schema", "status", "nan seconds", "negative seconds", "length a string", "unknown mode", "environment a list",
        "a timed cell without its check", "hostname a list", "commit an object"])
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_records_wrong_inside_are_one_line_naming_the_field_and_nothing_is_written(capsys, tmp_path, content,
                                                                                  fragment, fmt):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    output = tmp_path / "out.json"
    code = main(["export", str(bad), "--format", fmt, "--output", str(output),
                 *(["--repository", REPOSITORY] if fmt == "conbench" else [])])
    assert_one_line_error(capsys, code, fragment)
    assert not output.exists()


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_record_that_is_not_a_regular_file_is_refused_without_reading_it(capsys, tmp_path, kind):
    bad = tmp_path / "bad.json"
    os.mkfifo(bad) if kind == "fifo" else bad.mkdir()
    output = tmp_path / "out.json"
    code = main(["export", str(REFERENCE), str(bad), "--format", "bmf", "--output", str(output)])
    assert_one_line_error(capsys, code, "is a FIFO, not a regular file" if kind == "fifo" else "is a directory")
    assert not output.exists()


def test_output_checks(capsys, tmp_path):
    existing = tmp_path / "old.json"
    existing.write_text("keep")
    code = main(["export", str(REFERENCE), "--format", "bmf", "--output", str(existing)])
    assert_one_line_error(capsys, code, "--force")
    assert existing.read_text() == "keep"
    copy_of_reference = tmp_path / "ref.json"
    shutil.copy(REFERENCE, copy_of_reference)
    code = main(["export", str(copy_of_reference), "--format", "bmf", "--output", str(copy_of_reference), "--force"])
    assert_one_line_error(capsys, code, "is the record being read")
    code = main(["export", str(REFERENCE), "--format", "bmf", "--output", "/proc/kvbench.json"])
    assert_one_line_error(capsys, code, "/proc")
    code = main(["export", str(REFERENCE), "--format", "bmf", "--output", str(tmp_path / "b.json"),
                 "--repository", REPOSITORY])
    assert_one_line_error(capsys, code, "--repository")
    code = main(["export", str(REFERENCE), "--format", "csv", "--output", str(tmp_path / "c.json")])
    assert_one_line_error(capsys, code, "--format")
    assert main(["export", str(REFERENCE), "--format", "bmf", "--output", str(existing), "--force"]) == 0
    assert "kvbench/seed/full/16" in json.loads(existing.read_text())


# -- a request's and a contexts run's figures, as the report shows them ------------------------------


def medians_with_intervals(values: list[float]) -> tuple[float, float, float]:
    """The median and its order-statistic interval, computed here from the raw values (not by
    kvbench.measure.latency)."""
    import statistics

    from kvbench.measure.stats import median_interval

    return (statistics.median(values), *median_interval(values))


def request_truth(record: RecordView, mode: str, length: int) -> dict:
    """TTFT, TPOT (with intervals) and ITL percentiles of one request cell, from its raw repetitions."""
    import numpy as np

    reps = record.repetitions(mode, length)
    ttfts = [rep["ttft_seconds"] for rep in reps]
    tpots = [sum(rep["step_seconds"]) / len(rep["step_seconds"]) for rep in reps]
    steps = [s for rep in reps for s in rep["step_seconds"]]
    percentiles = dict(zip((50, 90, 99), np.percentile(steps, [50, 90, 99])))
    return {"ttft": (medians_with_intervals(ttfts), ttfts), "tpot": (medians_with_intervals(tpots), tpots),
            **{f"itl_p{level}": ((value, None, None), steps) for level, value in percentiles.items()}}


@pytest.fixture(scope="module")
def contexts_record(tmp_path_factory):
    """A real contexts run with the timed window (the committed ones predate it): llama-tiny, two contexts."""
    path = tmp_path_factory.mktemp("contexts") / "contexts.json"
    code = main(["run", "--preset", "llama-tiny", "--contexts", "5,9", "--modes", "full,static", "--repeats", "5",
                 "--warmup", "0", "--control", "none", "--no-progress", "--output", str(path)])
    assert code == 0
    return path


def contexts_truth(record: RecordView, mode: str, length: int) -> dict:
    workload = record.run["workload"]
    reps = record.repetitions(mode, length)
    steps = [sum(rep["step_seconds"][workload["warmup_steps"]:]) / workload["timed_steps"] for rep in reps]
    firsts = [rep["step_seconds"][0] for rep in reps]
    return {"step": (medians_with_intervals(steps), steps), "first_step": (medians_with_intervals(firsts), firsts)}


def figure_case(name: str, contexts_path: Path) -> tuple[str, RecordView, dict]:
    """(workload name, record, {cell: {figure: ((median, low, high), the values it summarizes)}})."""
    if name == "request":
        request = RecordView.load(REQUEST)
        return "llama-mini,prompt=512,generate=128", request, {c: request_truth(request, *c) for c in request.cells()}
    contexts = RecordView.load(contexts_path)
    return "llama-tiny,contexts", contexts, {c: contexts_truth(contexts, *c) for c in contexts.cells()}


@pytest.mark.parametrize("name", ["request", "contexts"])
def test_bmf_and_the_action_carry_ttft_tpot_itl_and_the_context_steps_with_their_intervals(capsys, tmp_path, name,
                                                                                            contexts_record):
    workload, record, truth = figure_case(name, contexts_record)
    bmf, _ = export(capsys, tmp_path, "bmf", record.source)
    jsonschema.validate(bmf, schema("bmf.schema.json"))
    actions, _ = export(capsys, tmp_path, "github-action-benchmark", record.source)
    jsonschema.validate(actions, schema("github-action-benchmark.schema.json"))
    by_name = {entry["name"]: entry for entry in actions}
    assert len(by_name) == len(actions)
    for (mode, length), figures in truth.items():
        for figure, ((median, low, high), samples) in figures.items():
            key = f"kvbench/{workload}/{mode}/{length}/{figure}"
            measure = bmf[key]["latency"]  # Bencher's built-in measure: its unit, nanoseconds, is Bencher's own
            assert measure["value"] == pytest.approx(median * 1e9)
            entry = by_name[key]
            assert entry["unit"] == "ms" and entry["value"] == pytest.approx(median * 1e3)
            if low is None:  # an ITL percentile, pooled over steps: the report shows it without an interval
                assert set(measure) == {"value"} and "range" not in entry
                assert f"pooled over {len(samples)} steps" in entry["extra"]
                continue
            assert (measure["lower_value"], measure["upper_value"]) == pytest.approx((low * 1e9, high * 1e9))
            shown = re.match(r"([0-9.e+-]+) to ([0-9.e+-]+) ms \(95% interval of the median\)", entry["range"])
            assert tuple(map(float, shown.groups())) == pytest.approx((low * 1e3, high * 1e3), rel=1e-5)
            listed = entry["extra"].split("samples ms: ")[1].split()
            assert [float(x) for x in listed] == pytest.approx([x * 1e3 for x in samples], rel=1e-5)
    figures = {name.rsplit("/", 1)[1] for name in bmf if name.count("/") == 4}
    assert figures == ({"ttft", "tpot", "itl_p50", "itl_p90", "itl_p99"} if "prompt" in workload
                       else {"step", "first_step"})


@pytest.mark.parametrize("name", ["request", "contexts"])
def test_conbench_results_of_the_figures_pass_benchadapt_with_their_samples_and_intervals(capsys, tmp_path, name,
                                                                                           contexts_record):
    from benchadapt import BenchmarkResult

    workload, record, truth = figure_case(name, contexts_record)
    document, _ = export(capsys, tmp_path, "conbench", record.source, extra=("--repository", REPOSITORY))
    by_case = {(r["tags"]["mode"], int(r["tags"]["length"]), r["tags"].get("figure")): r for r in document}
    assert len(by_case) == len(document)
    for result in document:
        jsonschema.validate(result, schema("conbench-result.schema.json"))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert BenchmarkResult(**copy.deepcopy(result)).to_publishable_dict() == result
    for (mode, length), figures in truth.items():
        assert by_case[(mode, length, None)]["stats"]["data"] == record.seconds(mode, length)
        for figure, ((median, low, high), samples) in figures.items():
            series = "itl" if figure.startswith("itl") else figure
            result = by_case[(mode, length, series)]
            assert result["stats"]["unit"] == "s" and result["stats"]["data"] == pytest.approx(samples)
            info = result["info"]
            assert info[f"{figure}_s"] == pytest.approx(median)
            assert info == by_case[(mode, length, None)]["info"]  # every result of a cell carries every figure
            if low is not None:
                assert (info[f"{figure}_low_s"], info[f"{figure}_high_s"]) == pytest.approx((low, high))
                assert "order-statistic interval of the median" in info["figure_interval"]
            else:
                assert f"{figure}_low_s" not in info


@pytest.mark.skipif(not Path(PYTEST_BENCHMARK).exists(), reason="pytest-benchmark is in the dev extra")
@pytest.mark.parametrize("name", ["request", "contexts"])
def test_pytest_benchmark_compare_prints_the_figures_medians_as_the_report_has_them(capsys, tmp_path, name,
                                                                                      contexts_record):
    """pytest-benchmark computes each series' median from the exported samples: it must be the report's figure."""
    workload, record, truth = figure_case(name, contexts_record)
    document, output = export(capsys, tmp_path, "pytest-benchmark", record.source)
    done = subprocess.run([PYTEST_BENCHMARK, "compare", str(output), "--columns=median,rounds", "--name=long",
                           "--time-unit=us", "--group-by=group"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "Failed to load" not in done.stdout + done.stderr, done.stderr
    for (mode, length), figures in truth.items():
        for figure, ((median, low, high), samples) in figures.items():
            if low is None:
                benchmark = next(b for b in document["benchmarks"] if b["name"] == f"itl[{mode}-{length}]")
                assert benchmark["extra_info"][f"{figure}_s"] == pytest.approx(median)
                continue
            name = f"kvbench/{workload}::{figure}[{mode}-{length}]"
            line = next((line for line in done.stdout.splitlines() if name in line), None)
            assert line is not None, f"{name} missing from:\n{done.stdout}"
            numbers = [float(n.replace(",", "")) for n in
                       re.findall(r"(?<![\w.\[-])[0-9][0-9,]*\.?[0-9]*(?![\w\]-])", line.split(name, 1)[1])]
            assert any(math.isclose(n, median * 1e6, rel_tol=1e-3) for n in numbers), (line, median)
            assert len(samples) in numbers, line


def committed_work() -> list[str]:
    """Every committed record of a request or contexts run (found by its run.workload)."""
    found = []
    for path in sorted((ROOT / "results").rglob("*.json")):
        try:
            document = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            continue
        run = document.get("run") if isinstance(document, dict) and "schema" in document else None
        if isinstance(run, dict) and (run.get("workload") or {}).get("kind") in ("request", "contexts"):
            found.append(str(path.relative_to(ROOT)))
    return found


COMMITTED_WORK = committed_work()


@pytest.mark.parametrize("relative", COMMITTED_WORK)
def test_every_committed_request_and_contexts_record_exports_the_reports_figures(relative):
    """Every committed request record's cells carry the TTFT and TPOT its summary (what the report prints) holds;
    a contexts record carries its steady and first steps, or, from before the timed window, exports what one
    sample covers and no figure it lacks."""
    record = RecordView.load(ROOT / relative)
    bmf = export_document([record], "bmf")
    jsonschema.validate(bmf, schema("bmf.schema.json"))
    actions = export_document([record], "github-action-benchmark")
    jsonschema.validate(actions, schema("github-action-benchmark.schema.json"))
    conbench = export_document([record], "conbench", {"repository": REPOSITORY})
    kind = record.run["workload"]["kind"]
    if kind == "contexts" and "timed_steps" not in record.run["workload"]:
        assert all(r["info"]["sample"].startswith("one decode step after the context's prefill") for r in conbench)
        assert not any("figure" in r["tags"] for r in conbench)
        return
    if kind == "contexts":  # with the timed window: its steady step and first step, as the raw steps give them
        for mode, length in record.cells():
            for figure, ((median, low, high), _) in contexts_truth(record, mode, length).items():
                (result,) = [r for r in conbench if (r["tags"]["mode"], int(r["tags"]["length"]),
                                                     r["tags"].get("figure")) == (mode, length, figure)]
                assert (result["info"][f"{figure}_s"], result["info"][f"{figure}_low_s"],
                        result["info"][f"{figure}_high_s"]) == pytest.approx((median, low, high))
        return
    summary = {entry["mode"]: entry for entry in record.record["summary"]["latency"]}
    prompt, generate = record.run["workload"]["prompt"], record.run["workload"]["generate"]
    for mode, length in record.cells():
        cell = f"kvbench/{record.run['preset']},prompt={prompt},generate={generate}/{mode}/{length}"
        for figure in ("ttft", "tpot"):
            measure, expected = bmf[f"{cell}/{figure}"]["latency"], summary[mode][figure]
            assert (measure["value"], measure["lower_value"], measure["upper_value"]) == pytest.approx(
                (expected["median"] * 1e9, expected["low"] * 1e9, expected["high"] * 1e9))
        assert bmf[f"{cell}/itl_p99"]["latency"] == pytest.approx({"value": summary[mode]["itl_p99"] * 1e9})
        action = next(entry for entry in actions if entry["name"] == f"{cell}/tpot")
        assert action["value"] == pytest.approx(summary[mode]["tpot"]["median"] * 1e3)
