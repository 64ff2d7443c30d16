"""kvbench.report layouts and `kvbench report`: marks, CIs, fits, profile, self-contained HTML."""

import base64
import json
import os
import statistics
from html.parser import HTMLParser

import pytest
from records import scaling_seconds, synthetic_record, view

from kvbench.cli import main
from kvbench.config import preset_config
from kvbench.measure import stats
from kvbench.record import write_record
from kvbench.report.format import BEGIN_MARKER, END_MARKER, splice
from kvbench.report.record import html, markdown, plots, terminal
from kvbench.report.record.model import build_report

PNG = b"\x89PNG\r\n\x1a\n"


def per_step_profile(length=40):
    full = [1e-4 + 1e-5 * t for t in range(length)]
    cached = [1.55e-4] * length
    return [{"mode": "full", "length": length, "seconds": full},
            {"mode": "concat", "length": length, "seconds": cached}]


@pytest.fixture(scope="module")
def record():
    seconds = scaling_seconds(modes=("full", "concat", "static"), lengths=(16, 32, 64, 128))
    seconds[("static", 32)] = [6.4e-4 * f for f in (1.0, 0.7, 1.4, 1.0, 0.8, 1.3, 1.1)]  # too wide to trust
    return synthetic_record(seconds, failed={("static", 64)}, per_step=per_step_profile())


@pytest.fixture(scope="module")
def report(record):
    return build_report(view(record))


@pytest.fixture(scope="module")
def record_file(tmp_path_factory, record):
    return write_record(record, tmp_path_factory.mktemp("records") / "rec.json")


def row(report, mode, length):
    (found,) = [r for r in report.rows if (r.mode, r.length) == (mode, length)]
    return found


# --- the report model ------------------------------------------------------------------------

def test_rows_follow_the_run_grid_with_speedups_and_intervals(report, record):
    report_view = view(record)
    assert [(r.length, r.mode) for r in report.rows[:3]] == [(16, "full"), (16, "concat"), (16, "static")]
    full, concat = row(report, "full", 128), row(report, "concat", 128)
    assert full.is_baseline and full.speedup is None
    # full ~ 1e-6 T^2, concat ~ 2e-5 T: at T = 128 a speedup of 6.4, the median over rotations of full / concat
    full_seconds, concat_seconds = report_view.samples("full", 128), report_view.samples("concat", 128)
    ratios = [full_seconds[r] / concat_seconds[r] for r in full_seconds]
    assert concat.speedup.ratio == pytest.approx(statistics.median(ratios))
    assert concat.speedup.contains(6.4) and concat.speedup.high - concat.speedup.low < 0.6
    assert concat.marks == ()


def test_marks_on_failed_noisy_and_partial_cells(report, record):
    assert row(report, "static", 64).marks == ("failed",)
    assert not row(report, "static", 64).speedup_valid
    assert "noisy" in row(report, "static", 32).marks and row(report, "static", 32).spread > stats.NOISY_SPREAD
    partial = {k: v[:3] for k, v in scaling_seconds(lengths=(16, 32)).items()}
    partial[("concat", 32)] = partial[("concat", 32)][:2]
    incomplete = build_report(view(synthetic_record(partial, status="incomplete", repeats=7, lengths=[16, 32, 64])))
    assert "partial" in incomplete.rows[0].marks
    assert incomplete.missing == [("full", 64), ("concat", 64)]
    assert incomplete.notes[0].startswith("INCOMPLETE")
    # the speedup at 32 pairs only the 2 repetitions both modes completed
    assert row(incomplete, "concat", 32).speedup.pairs == 2


def test_fits_recover_the_synthetic_exponents(report):
    assert report.fits["full"].b_low < 2.0 < report.fits["full"].b_high
    assert report.fits["concat"].b == pytest.approx(1.0, abs=0.05)


def test_profile_crossover(report):
    # full step 100 + 10 t us against a flat 155 us cached step: cheaper from step 6 on
    assert report.profile.crossovers == {"concat": 6}
    assert report.profile.final_speedups["concat"] == pytest.approx((100 + 10 * 35) / 155)


def test_report_is_deterministic(record):
    assert markdown.render_report(build_report(view(record))) == markdown.render_report(build_report(view(record)))


# --- text and markdown -------------------------------------------------------------------------

def test_text_layout(report):
    text = terminal.render_report(report, width=120, wide=False)  # what `COLUMNS=120 kvbench report | less` gets
    assert "…" not in text  # nothing truncated to fit
    lines = text.splitlines()
    (failed,) = [l for l in lines if "FAILED" in l]
    assert "static" in failed and "invalid" in failed and "✗" in failed
    assert any(" concat " in l and "x " in l and " ±" in l for l in lines)  # speedup with its precision
    assert "✗ equivalence check failed" in text and "~ IQR/median above 10%" in text
    assert "scaling fit" in text and "cheaper than full from step 6 on" in text
    assert max(len(l) for l in lines) <= 120


def test_markdown_layout(report):
    md = markdown.render_report(report, image="img/plot.svg")
    table = [l for l in md.splitlines() if l.startswith("| ") and l.split("|")[1].strip().isdigit()
             and l.split("|")[2].strip() in ("full", "concat", "static")]
    assert len(table) == 12
    static64 = [l for l in table if "| static |" in l and l.startswith("| 64 ")][0]
    assert "**FAILED" in static64 and "invalid" in static64 and "✗" in static64
    assert "![kvbench: time, speedup, per-token cost and per-step profile](img/plot.svg)" in md
    assert "| full | 2." in md  # the fit table starts with full's b


def test_incomplete_record_is_marked_in_every_layout(tmp_path, capsys):
    partial = {k: v[:3] for k, v in scaling_seconds(lengths=(16, 32)).items()}
    path = write_record(synthetic_record(partial, status="incomplete", repeats=7), tmp_path / "part.json")
    assert main(["report", str(path)]) == 0
    assert "INCOMPLETE" in capsys.readouterr().out
    assert main(["report", str(path), "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "**INCOMPLETE: interrupted run**" in out and "3/7" in out and "†" in out


def test_splice_replaces_only_the_marked_block():
    doc = f"# Title\n\nintro\n\n{BEGIN_MARKER}\nold table\n{END_MARKER}\n\nafter\n"
    out = splice(doc, "new table\n", "README.md")
    assert out == f"# Title\n\nintro\n\n{BEGIN_MARKER}\nnew table\n{END_MARKER}\n\nafter\n"
    assert splice(out, "new table\n", "README.md") == out  # idempotent
    with pytest.raises(ValueError, match="README.md: expected the markers"):
        splice("no markers", "x", "README.md")


# --- html ------------------------------------------------------------------------------------------

class Resources(HTMLParser):
    """Every tag and every attribute that can pull in something from elsewhere."""

    def __init__(self):
        super().__init__()
        self.tags, self.images, self.links = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        for name in ("src", "href", "srcset", "data", "action", "poster"):
            if name in attrs:
                self.links.append(attrs[name])


@pytest.fixture(scope="module")
def html_report(record_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("html") / "report.html"
    assert main(["report", str(record_file), "--format", "html", "--output", str(out)]) == 0
    return out.read_text()


def test_html_is_self_contained(html_report):
    parser = Resources()
    parser.feed(html_report)
    assert "script" not in parser.tags and "link" not in parser.tags and "iframe" not in parser.tags
    assert len(parser.images) == 4  # time, speedup, per-token, per-step
    for src in parser.links:
        assert src.startswith("data:image/png;base64,"), src[:60]
        assert PNG == base64.b64decode(src.split(",", 1)[1])[:8]
    assert "http://" not in html_report and "https://" not in html_report
    assert "@import" not in html_report and "url(" not in html_report


def test_html_content(html_report):
    assert html_report.startswith("<!DOCTYPE html>")
    assert "<table>" in html_report and 'class="l failed">FAILED' in html_report
    assert "cheaper than full from step 6 on" in html_report
    assert "Scaling fit" in html_report and "Test CPU 9000" in html_report


def test_html_without_profile_has_three_plots_and_says_why(tmp_path):
    path = write_record(synthetic_record(scaling_seconds(lengths=(16, 32))), tmp_path / "r.json")
    out = tmp_path / "r.html"
    assert main(["report", str(path), "--format", "html", "--output", str(out)]) == 0
    parser = Resources()
    parser.feed(out.read_text())
    assert len(parser.images) == 3
    assert "No per-step profile in this record" in out.read_text()


# --- the command: outputs, plots, bad input ----------------------------------------------------------

def test_plot_files_and_overwrite_protection(record_file, tmp_path, capsys):
    svg, png = tmp_path / "plot.svg", tmp_path / "plot.png"
    assert main(["report", str(record_file), "--plot", str(svg), "--output", str(tmp_path / "r.txt")]) == 0
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()
    assert "95% rerun interval" in (tmp_path / "r.txt").read_text()  # a file has every column
    assert main(["report", str(record_file), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == PNG
    capsys.readouterr()
    assert main(["report", str(record_file), "--plot", str(png)]) == 2
    assert capsys.readouterr().err == f"kvbench: error: {png} already exists; pass --force to overwrite it\n"
    assert main(["report", str(record_file), "--plot", str(tmp_path / "plot.pdf")]) == 2
    assert "must end in .png or .svg" in capsys.readouterr().err


def test_into_splices_the_markdown_block_with_a_relative_image_link(record_file, tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(f"# kvbench\n\n{BEGIN_MARKER}\nstale\n{END_MARKER}\n\nmore\n")
    readme.chmod(0o640)
    plot = tmp_path / "docs" / "results.svg"
    argv = ["report", str(record_file), "--format", "markdown", "--plot", str(plot), "--into", str(readme), "--force"]
    assert main(argv) == 0
    text = readme.read_text()
    assert "stale" not in text and text.endswith(f"{END_MARKER}\n\nmore\n")
    assert "](docs/results.svg)" in text and plot.exists()
    assert readme.stat().st_mode & 0o777 == 0o640  # the atomic rewrite keeps the file's mode
    assert main(["report", str(record_file), "--into", str(readme)]) == 2
    assert "use --format markdown" in capsys.readouterr().err
    readme.write_text("no markers here\n")
    assert main(["report", str(record_file), "--format", "markdown", "--into", str(readme)]) == 2
    assert "expected the markers" in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [
    ('{"schema": "kvbench.record/1", "stat', "not valid JSON (truncated or corrupt?)"),
    ('{"machine": "asv"}', "not a kvbench record"),
    ('{"schema": "kvbench.record/9"}', "unsupported schema version 'kvbench.record/9'; this kvbench reads "
                                       "'kvbench.record/1', 'kvbench.record/2', 'kvbench.record/3' and "
                                       "'kvbench.record/4'"),
])
def test_bad_records_exit_2_with_one_precise_line(tmp_path, capsys, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert main(["report", str(bad), "--format", "html"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"kvbench: error: {bad}: ") and message in err


def test_a_record_with_a_broken_per_step_entry_is_rejected(record_file, tmp_path, capsys):
    data = json.loads(record_file.read_text())
    data["per_step"][0]["seconds"] = data["per_step"][0]["seconds"][:-1]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    assert main(["report", str(bad)]) == 2
    assert "has 39 step durations, expected 40" in capsys.readouterr().err


@pytest.mark.parametrize("args, fragment", [
    (["--output", "same.svg", "--plot", "same.svg"], "--output and --plot both name same.svg"),
    (["--format", "markdown", "--plot", "doc.svg", "--into", "doc.svg"], "--plot and --into both name doc.svg"),
    (["--output", "a.md", "--into", "b.md", "--format", "markdown"], "--output and --into are exclusive"),
])
def test_report_refuses_one_file_for_two_outputs(record_file, tmp_path, monkeypatch, capsys, args, fragment):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "doc.svg").write_text("<!-- kvbench report: begin --><!-- kvbench report: end -->")
    assert main(["report", str(record_file), *args]) == 2
    assert fragment in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["doc.svg"]


# -- the client-visible workloads -----------------------------------------------------------


def contexts_record():
    from records import LIMITS, scaling_seconds

    return synthetic_record(scaling_seconds(modes=("full", "static", "paged"), lengths=(64, 256), repeats=7),
                            workload={"kind": "contexts"}, limits=LIMITS)


def test_a_contexts_report_puts_every_step_against_the_machines_limits():
    report = build_report(view(contexts_record()))
    rows = {(row.mode, row.what): row for row in report.limits}
    assert set(rows) == {(m, f"decode @ {n}") for m in ("static", "paged") for n in (64, 256)}
    step = rows[("static", "decode @ 256")]
    cache = 2 * 4 * 256 * 8 * 4  # the memory entry's bytes at that context
    assert step.bytes_read == 67968 + cache and step.bandwidth == 10e9 and step.compute == 40e9
    assert step.achieved_bandwidth == pytest.approx(step.bytes_read / step.seconds)
    assert "triad 10.0 GB/s on 1 thread(s)" in report.limits_note
    assert set(plots.drawn_panels(report)) == {"context", "speedup", "roofline"}
    assert plots.render_overview(report, ".png").startswith(b"\x89PNG")


def test_a_request_report_shows_what_a_client_sees_in_every_layout():
    from records import LIMITS, request_record

    record = request_record()
    record["limits"] = LIMITS
    report = build_report(view(record))
    assert [row.mode for row in report.latency] == ["full", "static", "paged"]
    static = report.latency[1]
    assert static.figures["tpot"]["median"] == pytest.approx(2.5e-4, rel=0.02)
    assert static.ratios["tpot"]["ratio"] == pytest.approx(4.0, rel=0.03)
    assert {row.what for row in report.limits} == {"prefill 16", "decode @ 20 (TPOT)"}
    assert set(plots.drawn_panels(report)) == {"context", "roofline"}
    markdown_text = markdown.render_report(report)
    assert "| static | 15 | 2.00 [2.00, 2.01] | 0.250 [0.250, 0.251] |" in markdown_text
    assert "TPOT = (E2E - TTFT) / (N - 1)" in markdown_text and "| static | decode @ 20 (TPOT) |" in markdown_text
    text = terminal.render_report(report)
    assert "request: 16 prompt tokens, 9 generated" in text and "against the machine's limits" in text
    page = html.render_report(report, plots.render_panels(report))
    assert "What a client sees, one request: 16 prompt tokens" in page and page.count("data:image/png") == 2


# -- kvbench's caches against transformers' on the same weights ------------------------------


def peers_record():
    """hf-dynamic at 2x static's time, hf-static at 1.25x, in every rotation; concat a little slower than static."""
    seconds = {}
    for length in (16, 32):
        static = [0.010 * length / 16 * (1 + 0.02 * ((r * 7) % 5)) for r in range(9)]
        seconds[("full", length)] = [s * 3 for s in static]
        seconds[("concat", length)] = [s * 1.1 for s in static]
        seconds[("static", length)] = static
        seconds[("hf-dynamic", length)] = [s * 2.0 for s in static]
        seconds[("hf-static", length)] = [s * 1.25 for s in static]
    # transformers' twins exist for the llama family only: a gpt2 record naming them is refused
    return synthetic_record(seconds, config=preset_config("llama-tiny").to_dict(), preset="llama-tiny")


def test_the_fastest_exact_kind_is_set_against_each_transformers_cache_paired_by_rotation():
    from kvbench.report.record.latency import peer_rows

    rows = peer_rows(view(peers_record()))
    assert [(r.length, r.mode, r.peer) for r in rows] == [(16, "static", "hf-dynamic"), (16, "static", "hf-static"),
                                                        (32, "static", "hf-dynamic"), (32, "static", "hf-static")]
    for row in rows:
        expected = 0.5 if row.peer == "hf-dynamic" else 0.8
        assert row.ratio.ratio == pytest.approx(expected) and row.ratio.low <= expected <= row.ratio.high
        assert row.ratio.pairs == 9 and row.valid


def test_the_peers_table_is_in_every_layout_and_absent_without_a_transformers_mode(tmp_path, capsys):
    path = tmp_path / "peers.json"
    write_record(peers_record(), path)
    assert main(["report", str(path), "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    assert "| 16 | static | hf-dynamic | 0.50x |" in text and "kvbench / transformers" in text
    assert main(["show", str(path)]) == 0
    assert "against transformers' caches" in capsys.readouterr().out
    assert main(["report", str(path), "--format", "html", "--output", str(tmp_path / "p.html")]) == 0
    assert "Against transformers&#x27; caches" in (tmp_path / "p.html").read_text() or \
        "Against transformers' caches" in (tmp_path / "p.html").read_text()
    plain = tmp_path / "plain.json"
    write_record(synthetic_record(scaling_seconds()), plain)
    assert main(["report", str(plain), "--format", "markdown"]) == 0
    assert "kvbench / transformers" not in capsys.readouterr().out
