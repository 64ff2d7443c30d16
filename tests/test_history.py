"""kvbench history: asv results across commits, judged by kvbench's rules, on a page that fetches nothing.

The committed set under results/history/ is a real asv run (scripts/asv_history.py: two commits,
machines history-a and history-b, the second commit on history-b pinned with --cpu-affinity 0).
Steps are checked against the medians of asv's raw samples and pinned intervals; copies of the set with
scaled samples make known steps (hostile copies are tests/test_history_hostile.py's). The page is read back by a real HTML
parser (no resource outside the file) and, where Debian's chromium is installed, rendered by it
headless behind a trap proxy that records any request.
"""

import base64
import dataclasses
import hashlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import threading
from html.parser import HTMLParser
from pathlib import Path

import pytest

from kvbench.asvtools import capture_path_for_result
from kvbench.cli import main
from kvbench.report.comparison.compare import FASTER, SLOWER, VERDICTS, WITHIN_NOISE
from kvbench.report.history.charts import build_history
from kvbench.report.history.page import render_page, step_text

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "results" / "history" / "asv"
TIME = "decode.TimeDecode.time_decode"
SPEEDUP = "speedup.TrackSpeedup.track_speedup"
CHROMIUM = shutil.which("chromium")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run")
# What Chromium asks for on its own even with those flags, for any page, a blank one included (network
# time, sign-in, the updater; Chromium 150 also www.google.com): the trap proxy receives these whatever the
# page is, so they say nothing of it. The test adds whatever this machine's Chromium asks for a blank page.
BROWSER_OWN_HOSTS = {"clients2.google.com", "accounts.google.com", "update.googleapis.com"}


@pytest.fixture(scope="module")
def history():
    return build_history(COMMITTED)


@pytest.fixture
def results_copy(tmp_path):
    """A writable copy of the committed asv results and captures."""
    target = tmp_path / "history"
    shutil.copytree(COMMITTED.parent, target)
    return target / "asv"


def result_files(results_dir: Path, machine: str) -> list[Path]:
    """The machine's result files, oldest commit first (the order the page draws)."""
    files = [p for p in (results_dir / machine).glob("*.json") if p.name != "machine.json"]
    return sorted(files, key=lambda p: json.loads(p.read_text())["date"])


def scale_time(path: Path, factor: float) -> None:
    """Multiply every time_decode median and sample in one asv result file by `factor`."""
    document = json.loads(path.read_text())
    columns = document["result_columns"]
    entry = document["results"][TIME]
    values, samples = entry[columns.index("result")], entry[columns.index("samples")]
    entry[columns.index("result")] = [v * factor if v == v else v for v in values]
    entry[columns.index("samples")] = [[s * factor for s in row] if row else row for row in samples]
    path.write_text(json.dumps(document))


def chart(history, benchmark, mode):
    return next(c for c in history.charts if c.benchmark == benchmark and f"mode='{mode}'" in c.label)


# -- the model -----------------------------------------------------------------------------------


def test_the_committed_run_has_both_machines_two_commits_and_intervals(history):
    assert history.machines == ["history-a", "history-b"]
    assert len(history.commits) == 2 and history.notes == []
    titles = {(c.benchmark, c.label) for c in history.charts}
    assert titles == {(TIME, f"mode='{m}', length=64") for m in ("full", "concat", "static")} | \
        {(SPEEDUP, "mode='static', length=64")}  # the benchmarks the run selected; skipped ones are left out
    for c in history.charts:
        assert set(c.series) == {"history-a", "history-b"}
        for points in c.series.values():
            assert [p.commit for p in points] == [commit.hash for commit in history.commits]
            for p in points:
                assert p.estimate is not None and p.estimate.low <= p.value <= p.estimate.high
        assert len(c.steps) == 2 and all(step.verdict in VERDICTS for step in c.steps)


# kvbench compare's judgement of the committed static samples, pinned: (verdict, low, high, MDE) of NEW/OLD.
STATIC_STEPS = {"history-a": (WITHIN_NOISE, 0.755075912, 1.279733629, 0.458005676),
                "history-b": (FASTER, 0.583640296, 0.878799457, 0.339783355)}


def test_time_steps_are_judged_on_asvs_samples(history):
    """The ratio is NEW/OLD of the medians of asv's raw samples, computed here from the JSON alone; the interval,
    MDE and verdict are the values kvbench compare gave when this test was written."""
    c = chart(history, TIME, "static")
    for step in c.steps:
        medians = []
        for commit in (step.old, step.new):
            path = next(p for p in result_files(COMMITTED, step.machine) if p.name.startswith(commit[:8]))
            document = json.loads(path.read_text())
            entry, columns = document["results"][TIME], document["result_columns"]
            modes, lengths = entry[columns.index("params")]
            assert lengths == ["64"]  # one length: the combination's index is the mode's
            medians.append(statistics.median(entry[columns.index("samples")][modes.index("'static'")]))
        assert step.judged.ratio == pytest.approx(medians[1] / medians[0], rel=1e-12)
        verdict, low, high, mde = STATIC_STEPS[step.machine]
        assert step.verdict == verdict
        assert (step.judged.low, step.judged.high, step.judged.mde) == pytest.approx((low, high, mde), rel=1e-8)


def test_the_environment_mark_is_the_pinned_run(history):
    (mark,) = history.marks
    assert (mark.machine, mark.old, mark.new) == ("history-b", history.commits[0].hash, history.commits[1].hash)
    (difference,) = mark.differences
    assert difference.key == "system.cpu_affinity" and difference.new == "[0]" and difference.old != "[0]"


def copy_old_into_new(old: Path, new: Path) -> None:
    """The newer commit's time_decode results become the older one's: a step of exactly 1 before scaling."""
    new_document = json.loads(new.read_text())
    new_document["results"][TIME] = json.loads(old.read_text())["results"][TIME]
    new.write_text(json.dumps(new_document))


def history_a_step(results_dir: Path, mode: str):
    (step,) = [s for s in chart(build_history(results_dir), TIME, mode).steps if s.machine == "history-a"]
    return step


def test_a_slowed_commit_is_slower_a_faster_one_faster_but_not_beyond_a_wide_interval(results_copy):
    old, new = result_files(results_copy, "history-a")
    copy_old_into_new(old, new)
    scale_time(new, 1.6)
    full = history_a_step(results_copy, "full")
    assert full.verdict == SLOWER and full.judged.ratio == pytest.approx(1.6) and full.judged.mde < 0.6
    concat = history_a_step(results_copy, "concat")  # its first samples were disturbed: the interval is wide
    assert concat.judged.ratio == pytest.approx(1.6) and concat.judged.mde > 0.6 and concat.verdict == WITHIN_NOISE
    scale_time(new, 1 / 1.6 / 1.6)
    assert history_a_step(results_copy, "full").verdict == FASTER


def test_a_change_inside_the_noise_is_within_noise_whatever_the_medians(results_copy):
    old, new = result_files(results_copy, "history-a")
    copy_old_into_new(old, new)
    scale_time(new, 1.03)  # 3% slower: a median-only tool would call it a change; it is less than the MDE
    step = history_a_step(results_copy, "full")
    assert step.verdict == WITHIN_NOISE and step.judged.ratio == pytest.approx(1.03) and step.judged.mde > 0.03


def test_a_lower_speedup_is_slower(results_copy):
    old, new = result_files(results_copy, "history-a")
    capture_path = capture_path_for_result(new)
    capture = json.loads(capture_path.read_text())
    entry = capture["track_speedup"]["static@64"]
    reference = json.loads(capture_path_for_result(old).read_text())["track_speedup"]["static@64"]
    for key in ("speedup", "low", "high"):
        entry[key] = reference[key] / 1.5
    capture_path.write_text(json.dumps(capture))
    (step,) = [s for s in chart(build_history(results_copy), SPEEDUP, "static").steps if s.machine == "history-a"]
    assert step.verdict == SLOWER and step.judged.ratio == pytest.approx(1.5)
    # the ratio is the old speedup over the new one: said, with both speedups, so 1.5 is not read as a rise
    old_speedup, new_speedup = step.values  # asv's values of the two commits
    assert step_text(step).startswith(f"slower: speedup old/new {step.judged.ratio:.3f} [")
    assert f"(speedup {old_speedup:.4g} → {new_speedup:.4g})" in step_text(step)


def test_a_time_verdict_names_its_quantity(results_copy):
    old, new = result_files(results_copy, "history-a")
    copy_old_into_new(old, new)
    scale_time(new, 1.6)
    step = history_a_step(results_copy, "full")
    assert step_text(step).startswith(f"slower: time new/old {step.judged.ratio:.3f} [")


def test_without_samples_a_step_is_not_judged(results_copy):
    for path in result_files(results_copy, "history-a"):
        document = json.loads(path.read_text())
        document["results"][TIME][document["result_columns"].index("samples")] = None
        path.write_text(json.dumps(document))
    steps = [s for s in chart(build_history(results_copy), TIME, "full").steps if s.machine == "history-a"]
    assert [s.verdict for s in steps] == ["not judged"] and "--record-samples" in steps[0].reason


def test_a_step_not_judged_has_its_own_mark_not_the_within_noise_circle(results_copy):
    for path in result_files(results_copy, "history-a"):
        document = json.loads(path.read_text())
        document["results"][TIME][document["result_columns"].index("samples")] = None
        path.write_text(json.dumps(document))
    history = build_history(results_copy)
    page = render_page(history)
    classes = [v for _, name, v in read_page(page).attributes if name == "class"]
    unjudged = sum(1 for c in history.charts for s in c.steps if s.judged is None)
    within = sum(1 for c in history.charts for s in c.steps if s.judged is not None and s.verdict not in (SLOWER, FASTER))
    assert unjudged >= 2 and classes.count("step not-judged") == unjudged and classes.count("step") == within
    assert "◌</span> not judged" in page


def test_a_torch_change_is_a_critical_mark(results_copy):
    _, new = result_files(results_copy, "history-a")
    path = capture_path_for_result(new)
    capture = json.loads(path.read_text())
    capture["environment"]["torch"]["version"] = "2.99.0+cpu"
    path.write_text(json.dumps(capture))
    marks = {m.machine: m for m in build_history(results_copy).marks}
    assert [(d.key, d.rank) for d in marks["history-a"].differences] == [("torch.version", "critical")]


def test_a_missing_capture_is_a_note_not_a_failure(results_copy):
    _, new = result_files(results_copy, "history-b")
    capture_path_for_result(new).unlink()
    rebuilt = build_history(results_copy)
    assert rebuilt.marks == [] and len(rebuilt.notes) == 1 and "no environment capture" in rebuilt.notes[0]


# -- the command -----------------------------------------------------------------------------------


def assert_one_line_error(capsys, code, fragment):
    _, err = capsys.readouterr()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("kvbench: error: ") and fragment in err, err


def test_history_writes_the_page_and_refuses_bad_input(capsys, tmp_path, results_copy):
    page = tmp_path / "page.html"
    assert main(["history", str(COMMITTED), "--output", str(page)]) == 0
    assert "4 chart(s), 2 machine(s), 2 commit(s)" in capsys.readouterr().out
    assert_one_line_error(capsys, main(["history", str(COMMITTED), "--output", str(page)]), "--force")
    bad = tmp_path / "nothing.html"
    for directory, fragment in ((tmp_path / "missing", "not a directory"), (tmp_path, "no asv result files")):
        assert_one_line_error(capsys, main(["history", str(directory), "--output", str(bad)]), fragment)
    _, new = result_files(results_copy, "history-a")
    new.write_text('{"commit_hash": "x", "result_columns": [')
    assert_one_line_error(capsys, main(["history", str(results_copy), "--output", str(bad)]), new.name)
    assert_one_line_error(capsys, main(["history", str(COMMITTED), "--output", str(bad), "--factor", "1"]),
                          "--factor")
    assert not bad.exists()


# -- the page, read by a real HTML parser ------------------------------------------------------------

FETCHING_ATTRIBUTES = {"src", "href", "srcset", "data", "poster", "action", "formaction", "background", "ping",
                       "manifest", "xlink:href", "longdesc", "cite", "codebase", "archive", "icon"}
FETCHING_TAGS = {"link", "img", "iframe", "object", "embed", "base", "audio", "video", "source", "track",
                 "image", "use", "frame", "applet", "portal"}


class PageReader(HTMLParser):
    """Every tag, attribute, script and style of a page, as the standard library's HTML parser reads it."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags, self.attributes, self.scripts, self.styles, self._inside = [], [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attributes += [(tag, name, value or "") for name, value in attrs]
        self._inside.append(tag)

    def handle_endtag(self, tag):
        if tag in self._inside:
            while self._inside.pop() != tag:
                pass

    def handle_data(self, data):
        if self._inside and self._inside[-1] == "script":
            self.scripts.append(data)
        elif self._inside and self._inside[-1] == "style":
            self.styles.append(data)


def read_page(text: str) -> PageReader:
    reader = PageReader()
    reader.feed(text)
    reader.close()
    return reader


def test_the_page_fetches_nothing_from_outside(history):
    page = render_page(history)
    reader = read_page(page)
    assert not FETCHING_TAGS & set(reader.tags), set(reader.tags)
    assert not [a for a in reader.attributes if a[1] in FETCHING_ATTRIBUTES], "an attribute that loads a resource"
    styles = " ".join(reader.styles + [v for _, name, v in reader.attributes if name == "style"])
    assert "url(" not in styles and "@import" not in styles
    scripts = " ".join(reader.scripts)
    for call in ("fetch(", "XMLHttpRequest", "import(", "WebSocket", "EventSource", "sendBeacon", ".src", "Worker("):
        assert call not in scripts, call
    assert "://" not in page and "//cdn" not in page
    policy = [v for tag, name, v in reader.attributes if tag == "meta" and name == "content" and "default-src" in v]
    (script,) = reader.scripts  # only the page's own script may run: the policy names its hash, not 'unsafe-inline'
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert policy == [f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{digest}'"]


def test_the_page_draws_both_lines_the_steps_and_the_mark(history):
    reader = read_page(render_page(history))
    assert reader.tags.count("svg") == len(history.charts) == 4
    assert reader.tags.count("polyline") == 2 * 4  # a line per machine per chart
    classes = [v for _, name, v in reader.attributes if name == "class"]
    assert classes.count("point") == 4 * 2 * 2
    assert classes.count("environment-mark") == 4  # the history-b mark, drawn on every chart
    judged = sum(1 for c in history.charts for s in c.steps if s.verdict in (SLOWER, FASTER))
    assert sum(c.startswith("step ") for c in classes) == judged
    assert reader.tags.count("title") >= 1 + 4 * (2 * 2 + 2 + 1)  # every point, step and mark has a tooltip


# -- the page, in a real browser ---------------------------------------------------------------------


class TrapProxy:
    """A loopback HTTP proxy that answers 404 and records every request line it receives."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.requests: list[str] = []
        self.running = True
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while self.running:
            try:
                connection, _ = self.server.accept()
            except TimeoutError:
                continue
            with connection:
                connection.settimeout(2)
                try:
                    line = connection.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace")
                    self.requests.append(line)
                    connection.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass

    def close(self) -> None:
        self.running = False
        self.thread.join(timeout=5)
        self.server.close()


def host_of(request_line: str) -> str:
    """The host of a proxy request line: "GET http://host/path HTTP/1.1" or "CONNECT host:443 HTTP/1.1"."""
    target = request_line.split(" ")[1] if " " in request_line else request_line
    return target.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]


def page_requests(proxy: TrapProxy, own: set[str] = BROWSER_OWN_HOSTS) -> list[str]:
    return [line for line in proxy.requests if host_of(line) not in own]


def blank_page_hosts(tmp_path: Path) -> set[str]:
    """The hosts this Chromium requests for a blank page, opened as the test opens the page (a DOM dump,
    then a screenshot): its own background traffic, which no page causes."""
    trap = TrapProxy()
    try:
        blank = tmp_path / "blank.html"
        blank.write_text("<!DOCTYPE html><html><body>blank</body></html>")
        chromium(tmp_path, trap, blank, "--dump-dom")
        chromium(tmp_path, trap, blank, "--hide-scrollbars", "--window-size=840,1400",
                 f"--screenshot={tmp_path / 'blank.png'}")
        return {host_of(line) for line in trap.requests}
    finally:
        trap.close()


def chromium(tmp_path: Path, proxy: TrapProxy, page: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    return subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                           f"--proxy-server=http://127.0.0.1:{proxy.port}", "--proxy-bypass-list=<-loopback>",
                           *args, page.as_uri()], capture_output=True, text=True, timeout=120)


@pytest.fixture
def proxy():
    trap = TrapProxy()
    yield trap
    trap.close()


SCREENSHOTS = "KVBENCH_SCREENSHOTS"  # a folder (make screenshots: docs/) where the browser tests keep their screenshots


def screenshot(tmp_path: Path, proxy: TrapProxy, page: Path, name: str, *args: str) -> Path:
    """Chromium's screenshot of the page, also kept as <$KVBENCH_SCREENSHOTS>/<name> when that is set."""
    shot = tmp_path / name
    done = chromium(tmp_path, proxy, page, "--hide-scrollbars", *args, f"--screenshot={shot}")
    assert done.returncode == 0 and shot.stat().st_size > 10_000, done.stderr[-2000:]
    if os.environ.get(SCREENSHOTS):
        shutil.copyfile(shot, Path(os.environ[SCREENSHOTS]) / name)
    return shot


def screenshot_colors(shot: Path) -> set[tuple[int, int, int]]:
    from matplotlib.image import imread

    pixels = (imread(shot)[..., :3] * 255).round().astype(int)
    return {tuple(p) for p in pixels.reshape(-1, 3)[::7]}


# Measures, in the page as Chromium lays it out, whether a chart's unit label touches any of its tick labels.
MEASURE = """
var touching = [];
document.querySelectorAll("svg").forEach(function (svg, i) {
  var unit = svg.querySelector("text.unit").getBoundingClientRect();
  svg.querySelectorAll("text.tick").forEach(function (tick) {
    var b = tick.getBoundingClientRect();
    if (b.left < unit.right && unit.left < b.right && b.top < unit.bottom && unit.top < b.bottom) {
      touching.push(i + ":" + tick.textContent);
    }
  });
});
document.body.dataset.units = String(document.querySelectorAll("text.unit").length);
document.body.dataset.touching = touching.join(",") || "none";
"""


def measured(page_text: str) -> str:
    """The page with MEASURE allowed by its CSP and run after the page's own script."""
    from kvbench.report.history.page import SCRIPT, content_security_policy, script_hash

    policy = content_security_policy(SCRIPT)
    assert policy in page_text
    return page_text.replace(policy, f"{policy} {script_hash(MEASURE)}").replace(
        "</body>", f"<script>{MEASURE}</script></body>")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium; "
                                              ".ci/run installs it)")
def test_chromium_lays_out_no_unit_label_on_the_ticks(tmp_path, proxy):
    """Long tick labels (bytes: 2.495e+08) beside the unit label, as Chromium lays them out."""
    from kvbench.report.history.charts import Chart, Point

    history = build_history(COMMITTED)
    machine, (first, second) = history.machines[0], (c.hash for c in history.commits)
    points = [Point(machine, first, 249_512_345.0, None), Point(machine, second, 251_034_567.0, None)]
    history.charts.append(Chart("decode.PeakMemDecode.peakmem_decode", "model='seed'", "bytes", False,
                                {machine: points}))
    page = tmp_path / "measured.html"
    page.write_text(measured(render_page(history)))
    dom = chromium(tmp_path, proxy, page, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert f'data-units="{len(history.charts)}"' in dom.stdout, "the measuring script did not run"
    assert 'data-touching="none"' in dom.stdout, re.findall(r'data-touching="[^"]*"', dom.stdout)


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium; "
                                              ".ci/run installs it)")
def test_chromium_renders_the_page_offline_and_requests_nothing(tmp_path, history, proxy):
    own = BROWSER_OWN_HOSTS | blank_page_hosts(tmp_path)
    assert "kvbench.invalid" not in own
    page = tmp_path / "history.html"  # named as `make history-page` names it, not by this checkout's path
    page.write_text(render_page(dataclasses.replace(history, results_dir=COMMITTED.relative_to(ROOT).as_posix())))
    dom = chromium(tmp_path, proxy, page, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-ready="yes"' in dom.stdout, "the inline script did not run"
    assert dom.stdout.count("<svg") == 4 and "history-b" in dom.stdout
    shot = screenshot(tmp_path, proxy, page, "history.png", "--window-size=840,1500")
    colors = screenshot_colors(shot)
    assert (0x1F, 0x77, 0xB4) in colors and (0xD6, 0x27, 0x28) in colors, "both machines' lines are drawn"
    assert page_requests(proxy, own) == [], proxy.requests
    # the trap works: a page that does load a resource is caught
    control = tmp_path / "control.html"
    control.write_text('<!DOCTYPE html><html><body><img src="http://kvbench.invalid/x.png"></body></html>')
    chromium(tmp_path, proxy, control, "--dump-dom", "--virtual-time-budget=3000")
    assert {host_of(line) for line in page_requests(proxy, own)} == {"kvbench.invalid"}, proxy.requests


# -- records, of any workload: a serving record as any other --------------------------------------------------------

SERVING = ROOT / "results" / "serving"  # five serving records of three commits, and three A/A pairs under aa/


def serving_views() -> list:
    from kvbench.record import RecordView

    return [RecordView.load(path) for path in sorted(SERVING.rglob("*.json"))]


def test_a_history_of_serving_records_charts_each_kind_as_export_reads_it():
    from kvbench.export.history import build_record_history, commit_of, created_ms
    from kvbench.export.serving import record_source

    history = build_record_history(SERVING)
    assert history.machines == ["vm"]
    views = serving_views()
    sources = [record_source(view) for view in views]
    # oldest first by when each run began (the source's created_utc; records of parallel branches interleave, and
    # two may begin in the same second: then by path), as read_sources orders them
    oldest_first = sorted(zip(views, sources), key=lambda pair: (created_ms(pair[1]), pair[1].path))
    assert [c.hash for c in history.commits] == list(dict.fromkeys(commit_of(source) for _, source in oldest_first))
    charts = {(chart.label, chart.benchmark): chart for chart in history.charts}
    newest = {}  # what stands for each (commit, cell): the newest record's value
    for view, source in oldest_first:
        for cell in source.cells:
            for quantity in cell.quantities:
                newest[(commit_of(source), cell.key, quantity.name)] = quantity.value
            for figure in cell.figures:
                newest[(commit_of(source), cell.key, figure.name)] = figure.seconds
    assert newest and {(key, name) for _, key, name in newest} == set(charts)  # every kind's every measure, no other
    for (commit, key, name), value in newest.items():
        (point,) = [p for p in charts[(key, name)].series["vm"] if p.commit == commit]
        assert point.value == value
    assert not any(chart.benchmark == "median seconds" for chart in history.charts)  # a replay's measures, as compare's


@pytest.mark.parametrize("pair", ["pair1", "pair2", "pair3"])
def test_an_aa_pair_of_serving_records_at_two_commits_steps_within_noise_as_compare_says(pair, tmp_path):
    from kvbench.export.history import build_record_history
    from kvbench.record import RecordView
    from kvbench.report.comparison.serving import compare_serving

    for side, commit in (("a", None), ("b", "f" * 40)):
        record = json.loads((SERVING / "aa" / f"{pair}-{side}.json").read_text())
        if commit:  # the same code, called another commit: every step is an A/A step
            record["environment"]["kvbench"]["git_commit"] = commit
        (tmp_path / f"{side}.json").write_text(json.dumps(record))
    history = build_record_history(tmp_path)
    steps = [step for chart in history.charts for step in chart.steps]
    assert len(history.commits) == 2 and len(steps) == len(history.charts) == 32
    assert not any(step.verdict in (SLOWER, FASTER) for step in steps)
    compared = compare_serving(RecordView.load(tmp_path / "a.json"), RecordView.load(tmp_path / "b.json"),
                               factor=1.1, alpha=0.05)
    judged = sorted(step.judged.ratio for step in steps if step.judged is not None)
    assert judged == sorted(c.change.ratio for c in compared.changes if c.change is not None)


def test_serving_and_loop_records_share_one_page_and_a_stray_file_is_noted(capsys, tmp_path):
    from kvbench.export.serving import record_source
    from kvbench.record import RecordView

    for path in (SERVING / "llama-mini-chat-16.json", ROOT / "results" / "real" / "quality-quantized.json"):
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "summary.json").write_text('{"not": "a record"}')
    page = tmp_path / "page.html"
    assert main(["history", str(tmp_path), "--output", str(page)]) == 0
    assert "1 machine(s), 2 commit(s)" in capsys.readouterr().out
    text = page.read_text()
    assert "output_tokens_per_second (llama-mini,serving=chat" in text  # a serving kind's measure
    static = next(cell for cell in record_source(RecordView.load(tmp_path / "quality-quantized.json")).cells
                  if cell.mode == "static")  # a loop's cell, by the key export names it by
    assert f"median seconds ({static.key})" in text and f"speedup over full ({static.key})" in text
    assert "summary.json" in text and "not a kvbench record" in text
