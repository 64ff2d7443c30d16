"""kvbench history and asv-show on asv results someone else wrote: a results repository that several
people or CI jobs push to.

Markup in every string a file gives the page (commit hash, machine folder, parameter and benchmark names,
units, environment facts, the results directory's own name) must reach the page as text: the page holds
no element, attribute or script the files put there, shows their escaped text, and in headless Chromium
runs its own script and no other. Bad types, out-of-range numbers and special files end in one line
naming the file and the field, exit 2, never a traceback or a hang.
"""

import html
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_history import CHROMIUM, COMMITTED, SPEEDUP, TIME, chromium, proxy, read_page, result_files  # noqa: F401

from kvbench import files
from kvbench.asvtools import capture_path_for_result
from kvbench.cli import main
from kvbench.report.history import page as historypage
from kvbench.report.history.charts import build_history
from kvbench.report.history.page import SCRIPT, render_page

ROOT = Path(__file__).resolve().parents[1]
COMMIT = "<script>alert(1)</script>"  # its first 8 characters, exactly "<script>", label the axis
MACHINE = "<img id=injected-machine src=x onerror=alert(2)>"  # a folder name: no "/"
PARAM = "'<b id=injected-param>full</b>'"
BENCHMARK = "speedup.<i id=injected-benchmark>x</i>.track_speedup"
UNIT = "<b id=injected-unit>x</b>"
PARAM_NAME = "<b id=injected-param-name>mode</b>"
TORCH = "<b id=injected-torch>2.99</b>"
DIRECTORY = '<i id="injected-directory">d</i>'
PAYLOADS = (COMMIT, COMMIT[:8], MACHINE, PARAM, BENCHMARK, UNIT, PARAM_NAME, TORCH, DIRECTORY)
PAGE_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "code", "span", "i", "table", "tr",
             "th", "td", "ul", "li", "label", "input", "section", "svg", "line", "text", "polyline", "path", "circle",
             "polygon", "g", "script",
             "tbody"}  # what render_page writes, and the tbody a browser adds to each table


def edit_json(path: Path, change) -> None:
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))  # NaN stays NaN, as asv writes it


def column(document: dict, name: str) -> int:
    return document["result_columns"].index(name)


@pytest.fixture
def hostile(tmp_path) -> Path:
    """The committed results with markup in every string the page shows."""
    root = tmp_path / DIRECTORY
    shutil.copytree(COMMITTED.parent, root)
    results = root / "asv"
    for folder in (results, root / "captures"):
        (folder / "history-b").rename(folder / MACHINE)
    for machine in ("history-a", MACHINE):
        for path in result_files(results, machine):
            def rename(document):
                entry = document["results"][TIME]
                entry[column(document, "params")][0][0] = PARAM
                document["results"][BENCHMARK] = document["results"].pop(SPEEDUP)
            edit_json(path, rename)
    newest = result_files(results, "history-a")[-1]
    edit_json(newest, lambda document: document.update(commit_hash=COMMIT))
    edit_json(capture_path_for_result(newest), lambda capture: capture["environment"]["torch"].update(version=TORCH))

    def describe(meta):
        meta[BENCHMARK] = {**meta.pop(SPEEDUP), "unit": UNIT, "param_names": [PARAM_NAME, "length"]}
    edit_json(results / "benchmarks.json", describe)
    return results


def injected(page: str) -> list[str]:
    """What a page holds that it did not put there itself: elements, ids, event handlers, scripts."""
    reader = read_page(page)
    found = [f"<{tag}>" for tag in set(reader.tags) - PAGE_TAGS]
    found += [f"{tag} {name}={value}" for tag, name, value in reader.attributes
              if name.startswith("on") or (name == "id" and value != "filter") or name in ("src", "href")]
    found += [f"script {text[:40]!r}" for text in reader.scripts if text != SCRIPT]
    return found + ([f"{reader.tags.count('script')} scripts"] if reader.tags.count("script") != 1 else [])


def test_every_string_from_the_files_is_text_on_the_page(hostile):
    history = build_history(hostile)
    assert COMMIT in [c.hash for c in history.commits] and MACHINE in history.machines
    page = render_page(history)
    assert injected(page) == []
    for payload in PAYLOADS:  # shown, escaped: not dropped, not markup
        assert html.escape(payload) in page, payload
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;script&gt;</text>" in page  # table, axis
    assert read_page(page).tags.count("svg") == len(history.charts) == 4


def test_the_check_catches_a_page_without_escaping(hostile, monkeypatch):
    """The test above fails on a page that stops escaping: removing the one escaping path injects elements."""
    monkeypatch.setattr(historypage.Html, "escape", classmethod(lambda cls, text: cls(str(text))))
    found = injected(render_page(build_history(hostile)))
    assert "img id=injected-machine" in found and "img onerror=alert(2)" in found and "1 scripts" not in found


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)")
def test_chromium_draws_the_hostile_page_and_runs_only_its_own_script(tmp_path, hostile, proxy):
    page = tmp_path / "hostile.html"
    page.write_text(render_page(build_history(hostile)))
    dom = chromium(tmp_path, proxy, page, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-ready="yes"' in dom.stdout, "the page's own script did not run"
    assert injected(dom.stdout) == []
    reader = read_page(dom.stdout)
    assert reader.tags.count("svg") == 4 and reader.tags.count("polyline") == 2 * 4  # every chart drawn
    assert "injected-machine" in dom.stdout  # as text: the legend and the tables still name the machine
    # Markup that did get in would not run: the policy allows one script, by its hash.
    tampered = tmp_path / "tampered.html"
    tampered.write_text(page.read_text().replace("</body>", '<script>document.body.dataset.pwned = "y";</script>'
                                                             "</body>"))
    dom = chromium(tmp_path, proxy, tampered, "--dump-dom")
    assert 'data-ready="yes"' in dom.stdout and 'data-pwned="y"' not in dom.stdout


# -- bad types and ranges: one line naming the file and the field, exit 2 ----------------------------


def set_time_column(name: str, value):
    def change(document):
        document["results"][TIME][column(document, name)] = value
    return change


def set_first(name: str, value):
    def change(document):
        document["results"][TIME][column(document, name)][0] = value
    return change


BAD_RESULTS = [
    ("entry a string", lambda d: d["results"].update({TIME: "fast"}), f"results/{TIME}: expected a list, got 'fast'"),
    ("results a list", lambda d: d.update(results=[]), "results: expected an object, got list"),
    ("date a string", lambda d: d.update(date="2026-12-03"), "date: expected a number or null, got '2026-12-03'"),
    ("date -1e20", lambda d: d.update(date=-1e20), "date: expected a number in [0, 2.53402e+14], got -1e+20"),
    ("date 1e20", lambda d: d.update(date=1e20), "date: expected a number in [0, 2.53402e+14], got 1e+20"),
    ("date 10**400", lambda d: d.update(date=10**400), "date: expected a number in [0, 2.53402e+14], got 1000"),
    ("date a boolean", lambda d: d.update(date=True), "date: expected a number or null, got True"),
    ("commit a list", lambda d: d.update(commit_hash=["a"]), "commit_hash: expected a string, got list"),
    ("samples strings", set_time_column("samples", [["0.01", "0.02"]] * 7),
     f"results/{TIME}/samples/0/0: expected a number or null, got '0.01'"),
    ("samples a string", set_time_column("samples", "0.01 0.02"),
     f"results/{TIME}/samples: expected a list, got '0.01 0.02'"),
    ("value a string", set_first("result", "0.01"), f"results/{TIME}/result/0: expected a number or null, got '0.01'"),
    ("value huge", set_first("result", 1e308),
     f"results/{TIME}/result/0: expected a number in [-1e+100, 1e+100], got 1e+308"),
    ("values short", set_time_column("result", [0.01]),
     f"results/{TIME}/result: expected 7 entries (one per parameter combination), got 1"),
    ("stat a string", set_first("stats_ci_99_a", "low"), f"results/{TIME}/stats_ci_99_a/0: expected a number"),
    ("param a number", set_time_column("params", [[1], ["64"]]), f"results/{TIME}/params/0/0: expected a string, got 1"),
    ("params a grid", set_time_column("params", [[f"'{i}'" for i in range(100)]] * 3),
     f"results/{TIME}/params: expected at most 100,000 parameter combinations"),
    ("started_at a string", set_time_column("started_at", "noon"), f"results/{TIME}/started_at: expected a number"),
    ("version a number", set_time_column("version", 3), f"results/{TIME}/version: expected a string or null, got 3"),
    ("entry too long", lambda d: d["results"][TIME].extend([None] * 20), f"results/{TIME}: expected at most 13"),
    ("unknown column", lambda d: d["result_columns"].append("bogus"), "result_columns/13: expected one of result"),
    ("old format", lambda d: d.update(version=1), "version: expected asv's result format 2, got 1"),
    ("machine fact an object", lambda d: d["params"].update(cpu={"a": 1}),
     "params/cpu: expected a string or a number, got dict"),
    ("env var a list", lambda d: d.update(env_vars={"OMP_NUM_THREADS": ["1"]}),
     "env_vars/OMP_NUM_THREADS: expected a string, got list"),
    ("requirements a list", lambda d: d.update(requirements=["torch"]), "requirements: expected an object, got list"),
    ("no env_name", lambda d: d.pop("env_name"), "missing key 'env_name'"),
]


@pytest.fixture
def results_copy(tmp_path) -> Path:
    shutil.copytree(COMMITTED.parent, tmp_path / "history")
    return tmp_path / "history" / "asv"


def assert_one_line(capsys, status: int, *fragments: str) -> str:
    out, err = capsys.readouterr()
    assert status == 2 and out == "", (status, out, err)
    assert err.startswith("kvbench: error: ") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err
    return err


@pytest.mark.parametrize(("case", "change", "message"), BAD_RESULTS, ids=[case[0] for case in BAD_RESULTS])
def test_a_bad_field_in_a_result_file_is_one_line_naming_file_and_field(results_copy, tmp_path, capsys, case, change,
                                                                         message):
    path = result_files(results_copy, "history-a")[-1]
    edit_json(path, change)
    page = tmp_path / "page.html"
    assert_one_line(capsys, main(["history", str(results_copy), "--output", str(page)]), f"{path}: ", message)
    assert not page.exists()
    assert_one_line(capsys, main(["asv-show", str(path)]), f"{path}: ", message)


BAD_METADATA = [
    (lambda meta: meta.update({TIME: "time"}), f"{TIME}: expected an object, got 'time'"),
    (lambda meta: meta[TIME].update(param_names=[1, 2]), f"{TIME}/param_names/0: expected a string, got 1"),
    (lambda meta: meta[TIME].update(unit=["s"]), f"{TIME}/unit: expected a string, got list"),
    (lambda meta: meta.clear() or meta.update(x=1), "x: expected an object, got 1"),
]


@pytest.mark.parametrize(("change", "message"), BAD_METADATA)
def test_a_bad_benchmarks_json_is_one_line_naming_the_field(results_copy, tmp_path, capsys, change, message):
    metadata = results_copy / "benchmarks.json"
    edit_json(metadata, change)
    assert_one_line(capsys, main(["history", str(results_copy), "--output", str(tmp_path / "page.html")]),
                    f"{metadata}: {message}")
    assert_one_line(capsys, main(["asv-show", str(result_files(results_copy, "history-a")[0])]), f"{metadata}: ")


def test_a_parameter_python_cannot_parse_leaves_a_speedup_without_interval(results_copy):
    """track_speedup's capture key is built from the parameters' values: ast.literal_eval runs out of memory on
    100,000 minus signs, which must not end the command."""
    for path in result_files(results_copy, "history-a"):
        edit_json(path, lambda d: d["results"][SPEEDUP][column(d, "params")][0].__setitem__(1, "-" * 100_000 + "1"))
    (chart,) = [c for c in build_history(results_copy).charts if c.benchmark == SPEEDUP and "history-a" in c.series]
    assert chart.label.startswith("mode=----") and chart.label.endswith("1, length=64")
    (point, _) = chart.series["history-a"]
    assert point.value is not None and point.estimate is None and point.note == "no interval in the capture"


def test_a_time_that_is_not_positive_is_refused(results_copy, tmp_path, capsys):
    path = result_files(results_copy, "history-a")[-1]
    edit_json(path, lambda d: d["results"][TIME][column(d, "samples")][0].__setitem__(0, 0.0))
    assert_one_line(capsys, main(["history", str(results_copy), "--output", str(tmp_path / "page.html")]),
                    f"{path}: results/{TIME}/samples: expected positive seconds, got 0.0")


@pytest.mark.parametrize(("change", "field"), [
    (lambda entry: entry.update(low=entry["high"] * 2), "track_speedup/static@64: expected 0 < low <= speedup <= high"),
    (lambda entry: entry.update(speedup="1.5"), "track_speedup/static@64/speedup: expected a number, got '1.5'"),
    (lambda entry: entry.update(rotations=[1]), "track_speedup/static@64/rotations: expected a number or null"),
    (lambda entry: entry.update(low=-1.0), "track_speedup/static@64: expected 0 < low"),
])
def test_a_bad_speedup_interval_in_a_capture_is_a_note_naming_the_field(results_copy, change, field):
    path = capture_path_for_result(result_files(results_copy, "history-a")[-1])
    edit_json(path, lambda capture: change(capture["track_speedup"]["static@64"]))
    history = build_history(results_copy)
    (note,) = history.notes
    assert f"{path}: {field}" in note
    (chart,) = [c for c in history.charts if c.benchmark == SPEEDUP]
    assert [s.verdict for s in chart.steps if s.machine == "history-a"] == ["not judged"]


# -- special files: refused at once, named, never read (a child process, so a regression fails, not hangs) -----


def kvbench(*args) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "kvbench", *map(str, args)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return done, time.monotonic() - started


def oversize(path: Path) -> None:
    path.unlink()
    with open(path, "wb") as handle:
        handle.truncate(files.MAX_READ_BYTES + 1)  # sparse: nothing is written


SPECIAL = {
    "FIFO": (lambda path: (path.unlink(), os.mkfifo(path)), "is a FIFO, not a regular file"),
    "/dev/zero": (lambda path: (path.unlink(), path.symlink_to("/dev/zero")),
                  "is a symbolic link to a character device, not a regular file"),
    "oversize": (oversize, f"{files.MAX_READ_BYTES + 1:,} bytes, larger than the {files.MAX_READ_BYTES:,} bytes"),
}


@pytest.mark.parametrize("kind", SPECIAL)
@pytest.mark.parametrize("which", ["result", "benchmarks.json"])
@pytest.mark.subprocess  # a real interpreter: CI runs it (make test)
def test_a_special_or_oversize_file_is_refused_quickly_and_named(results_copy, tmp_path, kind, which):
    path = result_files(results_copy, "history-a")[-1] if which == "result" else results_copy / "benchmarks.json"
    shown = path if which == "result" else result_files(results_copy, "history-b")[0]  # asv-show reads both
    make, message = SPECIAL[kind]
    make(path)
    page = tmp_path / "page.html"
    for args in (["history", results_copy, "--output", page], ["asv-show", shown]):
        done, seconds = kvbench(*args)
        assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr[-2000:])
        assert done.stderr.startswith(f"kvbench: error: {path}: {message}"), done.stderr
        assert done.stderr.count("\n") == 1 and seconds < 30
    assert not page.exists()


@pytest.mark.subprocess  # a real interpreter: CI runs it (make test)
def test_a_special_capture_file_is_a_note(results_copy, tmp_path):
    path = capture_path_for_result(result_files(results_copy, "history-b")[-1])
    path.unlink()
    os.mkfifo(path)
    done, _ = kvbench("history", results_copy, "--output", tmp_path / "page.html")
    assert done.returncode == 0, done.stderr
    assert "is a FIFO" in (tmp_path / "page.html").read_text()


def test_asv_show_prints_hostile_strings_as_plain_text(hostile, capsys):
    """A terminal interprets escape sequences, not markup: asv-show shows both as text and never sends an ESC."""
    path = result_files(hostile, "history-a")[-1]
    edit_json(path, lambda document: document.update(env_name="env\x1b]0;pwned\x07\x1b[2J"))
    assert main(["asv-show", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"commit   {COMMIT}" in out and f"mode={PARAM}" in out and f"{BENCHMARK} [{UNIT}]" in out
    assert "\x1b" not in out and "\x07" not in out and "env\\x1b]0;pwned\\x07\\x1b[2J" in out
