"""The record views (`run`'s table, `show`, `report` as text, markdown and HTML) on committed records: tables
that fit 80, 100 and 132 columns with every value whole, one clock per table, "precise" meaning one thing,
per-workload columns, the run's verdict and what it reached, and one name for the interval."""

import dataclasses
import io
import json
import re
import statistics
from pathlib import Path

import pytest
from records import scaling_seconds, synthetic_record, view
from rich.console import Console

from kvbench.cli import main
from kvbench.record import RecordView
from kvbench.report.record import columns, html, markdown, terminal
from kvbench.report.format import as_sentence, capitalised, escape_html, escape_markdown, ms
from kvbench.report.record.model import build_report
from kvbench.report.record.precision import TOO_WIDE, stop_text
from kvbench.report.record.sections import peers_section, sections

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = "results/reference.json"  # a loop on wall time; every length reached ±5%
CPU = "results/sampler/busy-25-head.json"  # contended: every length's speedups on CPU time, most spreads too wide
MIXED = "results/contention/memory/run-00.json"  # lengths 16-256 on wall time, 512 on CPU time
LOSSY = "results/layouts/medium-quantized.json"  # long drift texts in the equivalence column
REQUEST = "results/latency/llama-mini-request.json"  # one request: 512 prompt tokens, 128 generated
CONTEXTS = "results/latency/llama-mini-contexts.json"  # three contexts, stopped on the budget at up to ±71%
LEGACY = "results/layouts/seed.json"  # schema 1
RECORDS = (REFERENCE, CPU, MIXED, LOSSY, REQUEST, CONTEXTS, LEGACY)


def report_of(name: str):
    return build_report(RecordView.load(ROOT / name))


def printed(renderables, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    for item in renderables:
        console.print(item)
    return console.export_text()


def assert_whole(report, text: str) -> None:
    """Every row's mode, its per-workload time and its speedup on one line of `text`, none of them cut."""
    assert "…" not in text
    lines = text.splitlines()
    if report.kind == "request":
        for row in report.latency:
            assert any(f" {row.mode} " in line and ms(row.figures["ttft"]["median"]) in line
                       and ms(row.figures["tpot"]["median"]) in line for line in lines), row.mode
        return
    for row in report.rows:
        unit = columns.unit_column(report.kind, row.clock).text(row)
        speedup = columns.speedup_text(row) if row.speedup is None else f"{row.speedup.ratio:.2f}x"
        assert any(f" {row.mode} " in line and f" {unit} " in line and speedup in line for line in lines), \
            (row.mode, row.length, unit, speedup)


@pytest.mark.parametrize("width", [80, 100, 132])
@pytest.mark.parametrize("name", RECORDS)
def test_terminal_tables_fit_the_width_with_every_value_whole(name, width):
    report = report_of(name)
    for text in (printed(terminal.quick_renderables(report, width), width),
                 printed(terminal.report_renderables(report, width), width)):
        assert max(len(line) for line in text.splitlines()) <= width
        assert_whole(report, text)


def test_the_widths_choose_compact_standard_and_wide_columns():
    report = report_of(REFERENCE)
    texts = {width: printed(terminal.quick_renderables(report, width), width) for width in (80, 132, 200)}
    headers = {width: next(line for line in text.splitlines() if "┃ length" in line) + text.split("└")[1][:200]
               for width, text in texts.items()}  # the header line and the caption below the table
    assert "gate" in headers[80] and "wall median ms" not in headers[80] and "--wide shows every column" in headers[80]
    assert "wall median ms" in headers[132] and "95% rerun interval" not in headers[132]
    assert "95% rerun interval" in headers[200] and "equivalence" in headers[200] and "--wide" not in headers[200]


def test_show_honours_columns_and_wide_shows_everything(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["show", str(ROOT / LOSSY)]) == 0
    narrow = capsys.readouterr().out
    assert max(len(line) for line in narrow.splitlines()) <= 80 and "drift KL" not in narrow
    assert "quantized-int8" in narrow and "drift ok" in narrow  # the mode whole, its check in a word
    assert main(["show", str(ROOT / LOSSY), "--wide"]) == 0
    wide = capsys.readouterr().out
    assert "drift KL" in wide and "95% rerun interval" in wide and "…" not in wide


# -- one clock per table -----------------------------------------------------------------------------------------

def cpu_medians(name: str) -> dict:
    record = json.loads((ROOT / name).read_text())
    seconds = {}
    for rep in record["repetitions"]:
        seconds.setdefault((rep["mode"], rep["length"]), []).append(rep["cpu_seconds"])
    return {cell: statistics.median(values) for cell, values in seconds.items()}


def test_times_beside_a_cpu_time_speedup_are_cpu_time_and_say_so():
    report, medians = report_of(CPU), cpu_medians(CPU)
    assert {row.clock for row in report.rows} == {"cpu"}
    for row in report.rows:
        assert row.timed.median == pytest.approx(medians[(row.mode, row.length)])
        assert row.unit_seconds == pytest.approx(medians[(row.mode, row.length)] / row.length)
    concat = next(row for row in report.rows if (row.mode, row.length) == ("concat", 512))
    assert concat.median > 1.2 * concat.timed.median  # wall time carried the waits: not what the speedup is on
    text = printed(terminal.quick_renderables(report, 132), 132)
    assert "CPU median ms" in text and "CPU µs/token" in text and "wall µs/token" not in text
    line = next(line for line in text.splitlines() if " concat " in line and "6.10x" in line)
    assert ms(concat.timed.median) in line and ms(concat.median) in line  # CPU time, and wall time labelled beside
    assert "and so are the times beside them" in text
    md = markdown.render_report(report)
    assert "| length | mode | n | CPU median ms | CPU q1–q3 ms | IQR % | wall median ms | CPU µs/token |" in md


REAL = ("results/real/quality-quantized.json", "results/real/quality-window.json", "results/real/contexts-hf.json",
        "results/llama/qwen2.5-0.5b.json")  # a real model's runs (on CPU time, and on wall time), a published shape
TIME_UNITS = re.compile(r"(^|\s)(ms|µs|s)(/token|/step)?(\s|$)")
NO_CLOCK = ("matmul floor ms",)  # FLOPs over the measured matmul rate: a floor computed, not a time read off a clock


def test_every_time_column_names_its_clock():
    for name in RECORDS + REAL:
        for section in sections(report_of(name)):
            for column in section.names:
                if TIME_UNITS.search(column) and column not in NO_CLOCK:
                    assert re.search(r"\b(wall|CPU)\b", column) or "wall time" in (section.title or ""), \
                        (name, section.name, column)


def test_a_real_models_trade_off_table_is_on_its_timing_tables_clock():
    report = report_of(REAL[0])
    assert report.clocks() == ["cpu"]
    shown = {section.name: section for section in sections(report)}
    timing, tradeoff = shown["timings"], shown["tradeoff"]
    assert "CPU µs/token" in timing.names and "CPU µs/token" in tradeoff.names
    assert not any("wall" in column for column in tradeoff.names)
    per_token = {}
    for row in timing.rows:  # grouped by length: a row's length cell is blank where it repeats
        per_token[row[1].text] = row[timing.names.index("CPU µs/token")].text
    for row in tradeoff.rows:
        assert row[tradeoff.names.index("CPU µs/token")].text == per_token[row[1].text], row[1].text
    static = next(r for r in report.rows if r.mode == "static")
    assert per_token["static"] == f"{static.unit_seconds * 1e6:,.1f}"
    assert static.median / static.length > 2 * static.unit_seconds  # the wall time it once showed here: the waits


def test_a_trade_off_over_two_clocks_is_two_tables_each_naming_its_own():
    report = report_of(REAL[0])
    report.tradeoffs = [dataclasses.replace(entry, length=16, clock="wall") for entry in report.tradeoffs] + \
        report.tradeoffs
    tables = [section for section in sections(report) if section.name == "tradeoff"]
    assert [section.title for section in tables] == ["length 16: trade-off on wall", "length 8: trade-off on CPU time"]
    assert "wall µs/token" in tables[0].names and "CPU µs/token" in tables[1].names
    assert [row[0].text for row in tables[0].rows] == ["16"] * 4 and [row[0].text for row in tables[1].rows] == ["8"] * 4


def test_a_record_with_two_clocks_gets_one_table_for_each():
    report = report_of(MIXED)
    assert report.clocks() == ["wall", "cpu"]
    md = markdown.render_report(report)
    wall = md.index("**Length 16, 32, 64, 128, 256: times and speedups on wall**")
    cpu = md.index("**Length 512: times and speedups on CPU time**")
    assert wall < cpu and "| 512 |" not in md[wall:cpu] and "| 512 |" in md[cpu:]
    text = printed(terminal.quick_renderables(report, 100), 100)
    assert "length 16, 32, 64, 128, 256: times and speedups on wall" in text
    assert "length 512: times and speedups on CPU time" in text


# -- "precise" means one thing ------------------------------------------------------------------------------------

def test_a_length_whose_spread_is_too_wide_is_never_called_precise():
    report = report_of(CPU)
    noisy = {row.length for row in report.rows if "noisy" in row.marks}
    assert noisy == {16, 64, 128, 256, 512}  # 32 alone has every cell within 10%
    assert {row.length: stop_text(row) for row in report.sampling} == {
        n: f"target reached, {TOO_WIDE}" if n in noisy else "precise" for n in (16, 32, 64, 128, 256, 512)}
    shown = printed(terminal.quick_renderables(report, 200), 200)
    assert "16: 118 rotations, target reached, ~ spread too wide" in shown and "32: 71 rotations, precise" in shown
    assert "not precise" in report.verdict and "16, 64, 128, 256, 512" in report.verdict
    for layout in (markdown.render_report(report), html.render_report(report, {})):
        assert layout.count("| precise |") + layout.count(">precise<") == 1  # length 32's row of the sampling table


@pytest.mark.parametrize("name", [REFERENCE, CPU, MIXED, CONTEXTS, "results/sampler/quiet-head.json"])
def test_precise_rows_carry_no_too_wide_mark(name):
    report = report_of(name)
    for length_row in report.sampling:
        if stop_text(length_row) == "precise":
            assert not any("noisy" in row.marks for row in report.rows if row.length == length_row.length)


# -- per-workload columns ------------------------------------------------------------------------------------------

def test_a_request_shows_ttft_tpot_and_itl_only():
    report = report_of(REQUEST)
    assert report.fits == {}
    texts = [printed(terminal.quick_renderables(report, width), width) for width in (80, 200)]
    texts += [printed(terminal.report_renderables(report, 200), 200), markdown.render_report(report),
              html.render_report(report, {})]
    for text in texts:
        assert "TTFT" in text and "TPOT" in text and "ITL p50" in text
        for absent in ("639", "µs/token", "us/token", "speedup =", "KV bytes a/b", "caling fit", "26.21x"):
            assert absent not in text, absent
    assert "request 512+128: 8 rotations" in texts[0]


def test_a_contexts_run_shows_milliseconds_per_step_at_each_context():
    report = report_of(CONTEXTS)
    record = json.loads((ROOT / CONTEXTS).read_text())
    cells = {(c["mode"], c["length"]): c["median"] for c in record["summary"]["cells"]}
    for row in report.rows:
        assert row.unit_seconds == pytest.approx(cells[(row.mode, row.length)])  # one timed step per sample
    text = printed(terminal.quick_renderables(report, 80), 80)
    assert "context" in text and "wall ms/step" in text and "µs/token" not in text
    assert any(" concat " in line and " 4.03 " in line and "30.57x" in line for line in text.splitlines())
    md = markdown.render_report(report)
    assert "| context | mode | n | wall median ms |" in md and "wall ms/step" in md and "µs/token |" not in md


def test_the_scaling_fit_needs_three_lengths():
    two = build_report(view(synthetic_record(scaling_seconds(lengths=(16, 32)))))
    three = build_report(view(synthetic_record(scaling_seconds(lengths=(16, 32, 64)))))
    assert two.fits == {} and set(three.fits) == {"full", "concat"}
    assert "caling fit" not in markdown.render_report(two) and "caling fit" not in terminal.render_report(two)
    assert "Scaling fit" not in html.render_report(two, {}) and "Scaling fit" in html.render_report(three, {})


# -- the verdict, the title, the interval's name -------------------------------------------------------------------

def test_the_verdict_and_what_the_run_reached_are_in_every_view(capsys):
    report = report_of(CONTEXTS)
    assert report.title.endswith("±71% reached, target ±5%")
    assert report.verdict.startswith("the samples disagreed more than this machine's counters explain")
    assert "intervals up to ±71% (length 256; 3 length(s) stopped short of ±5%: 256, 1024, 4095)" in report.verdict
    for argv in (["show"], ["report"], ["report", "--format", "markdown"], ["report", "--format", "html"]):
        assert main([*argv, str(ROOT / CONTEXTS)]) == 0
        out = capsys.readouterr().out
        assert "±71% reached, target ±5%" in out and "intervals up to ±71% (length 256" in out, argv
    reference = report_of(REFERENCE)
    assert reference.title.endswith("±4.9% reached, target ±5%")
    assert reference.verdict == "6 of 6 length(s) reached ±5%: precise"
    assert f"**{as_sentence(reference.verdict)}**" in markdown.render_report(reference)


@pytest.mark.parametrize("name", [REFERENCE, CPU, CONTEXTS])
def test_the_interval_has_one_name(name):
    report = report_of(name)
    page = html.render_report(report, {"speedup": (b"\x89PNG", "image/png")})
    for text in (printed(terminal.quick_renderables(report, 200), 200), terminal.render_report(report),
                 markdown.render_report(report), page):
        assert "95% rerun interval" in text
        assert "bootstrap" not in text and "95% CI" not in text
        # the A/A control's interval is from the run's samples alone (docs/statistics.md): named so, and only there
        assert "confidence interval" not in text.replace("A/A 95% within-run confidence interval", "")
    assert "are the 95% rerun interval" in page


@pytest.mark.parametrize("interval, name", [("confidence", "95% confidence interval"),
                                            ("within", "95% within-run confidence interval")])
def test_every_caption_names_the_interval_the_record_used(interval, name):
    """The timing table's header, the legend, the plot's caption and the peers' header say the record's interval."""
    record = json.loads((ROOT / "results/latency/llama-mini-contexts-steady.json").read_text())
    record["summary"]["interval"] = interval
    report = build_report(RecordView(record, "rec.json"))
    assert report.peers and report.interval_name == name
    page = html.render_report(report, {"speedup": (b"\x89PNG", "image/png")})
    for text in (terminal.render_report(report), markdown.render_report(report), page):
        assert "rerun interval" not in text and "bootstrap" not in text
        assert text.count(name) >= 3  # the speedups' column, the peers' column and the legend (the page: its plot)
    assert f"are the {name}" in page
    del record["summary"]["between_run"]  # no allowance recorded: the A/A control shares the speedups' interval
    assert f"A/A {name}" in markdown.render_report(build_report(RecordView(record, "rec.json")))


def test_a_fresh_contexts_run_divides_its_timed_window_into_steps(tmp_path, monkeypatch, capsys):
    """A sample of a contexts run times 16 steps: the table's ms/step is its median over 16, on the table's clock."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    output = tmp_path / "contexts.json"
    try:
        assert main(["run", "--contexts", "8,16", "--modes", "full,static", "--repeats", "3", "--control", "none",
                     "--output", str(output), "--no-progress"]) == 0
    finally:
        torch.set_num_threads(threads)
    capsys.readouterr()
    report = report_of(output)
    record = json.loads(output.read_text())
    assert record["run"]["workload"]["timed_steps"] == 16
    for row in report.rows:
        clock_field = "seconds" if row.clock == "wall" else "cpu_seconds"
        samples = [rep[clock_field] for rep in record["repetitions"]
                   if (rep["mode"], rep["length"]) == (row.mode, row.length)]
        assert row.unit_seconds == pytest.approx(statistics.median(samples) / 16)
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["show", str(output)]) == 0
    text = capsys.readouterr().out
    assert max(len(line) for line in text.splitlines()) <= 80 and "ms/step" in text and "µs/token" not in text
    assert "steps at a context" in text and "marks" in text
    assert_whole(report, text)


def test_the_peers_table_of_a_contexts_run_is_keyed_by_context_in_every_layout():
    report = build_report(RecordView.load(ROOT / "results/latency/llama-mini-contexts-steady.json"))
    assert report.peers
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(terminal.section_renderables(peers_section(report), 200)[0])
    assert console.export_text().splitlines()[2].split()[:2] == ["context", "kvbench"]
    assert "| context | kvbench | transformers |" in markdown.render_report(report)
    assert ">context</th>" in html.render_report(report, {})


# -- one list of sections, rendered by every layout -----------------------------------------------------------------

@pytest.mark.parametrize("name", [*RECORDS, "results/real/quality-window.json",
                                  "results/latency/llama-mini-contexts-steady.json"])
def test_every_layout_renders_every_section_of_the_one_list(name):
    """Each section's title, columns, note and items, from sections(report), in the terminal, markdown and HTML,
    in the list's order: no layout keeps a list of its own."""
    report = report_of(name)
    found = sections(report)
    text, md, page = terminal.render_report(report), markdown.render_report(report), html.render_report(report, {})
    assert any(s.columns for s in found) and ("timings" in {s.name for s in found}) == (report.kind != "request")
    places = {"terminal": [], "markdown": [], "html": []}
    for section in found:
        if section.title:
            places["terminal"].append(text.index(section.title))
            places["markdown"].append(md.index(f"**{escape_markdown(capitalised(section.title))}**"))
            places["html"].append(page.index(f"<h2>{escape_html(capitalised(section.title))}</h2>"))
        if section.columns:
            assert "| " + " | ".join(name.replace("|", "\\|") for name in section.names) + " |" in md
            assert all(f">{escape_html(column)}</th>" in page for column in section.names)
        if section.note:
            assert escape_markdown(as_sentence(section.note)) in md and escape_html(as_sentence(section.note)) in page
        for item in section.items:
            assert f"- {escape_markdown(item)}" in md and f"<li>{escape_html(item)}</li>" in page
    assert all(where == sorted(where) for where in places.values()), places


def test_a_heading_keeps_a_name_written_in_lower_case():
    assert capitalised("sampling: rotations per length") == "Sampling: rotations per length"
    assert capitalised("kvbench / transformers = median over rotations") == "kvbench / transformers = median over rotations"
    assert capitalised("transformers' caches") == "transformers' caches" and capitalised("") == ""


def quantized_record(lengths=(8, 256), recorded=None):
    """full and quantized-int8 at these lengths (the default G = 32, R = 128); `recorded`: the cache's own counts."""
    from records import check

    seconds = {(mode, n): [1.0 if mode == "full" else 0.5] * 3 for n in lengths for mode in ("full", "quantized-int8")}
    drift = {"exact": False, "kl_mean": 1e-11, "kl_max": 2e-11, "top1_agreement": 1.0,
             "limits": {"max_abs_diff": 5e-3, "kl_mean": 5e-8, "kl_max": 1e-7, "top1_agreement": 0.99}}
    checks = [{**check(mode, n), **(drift if mode != "full" else {})} for mode, n in seconds]
    record = synthetic_record(seconds, checks=checks)
    for entry in record["memory"]:
        if recorded is not None and entry["mode"] != "full":
            entry["quantized_positions"] = recorded[entry["length"]]
    return record


def test_a_quantized_kind_inside_its_residual_is_marked_and_said():
    """At length 8 the default residual of 128 holds every position in float: "of float 1.00" and a KL of 1e-11
    say nothing about int8. At 256, 128 of 256 are quantized: not marked."""
    report = build_report(view(quantized_record()))
    rows = {(row.mode, row.length): row for row in report.rows}
    assert rows[("quantized-int8", 8)].quantized == 0 and "unquantized" in rows[("quantized-int8", 8)].marks
    assert rows[("quantized-int8", 256)].quantized == 128 and "unquantized" not in rows[("quantized-int8", 256)].marks
    assert rows[("full", 8)].quantized is None and "unquantized" not in rows[("full", 8)].marks
    tradeoff = {cells[0]: cells for cells in map(columns.tradeoff_cells, report.tradeoffs)}
    assert tradeoff["8"][3:5] == ["1.00", "0% ∅"] and tradeoff["256"][4] == "50%"
    page = markdown.render_report(report)
    assert "| ∅ |" in page and "∅ a quantized kind that held under 50% of its positions quantized" in page
    assert columns.unquantized_sentences(report) == [
        "quantized-int8 held 0 of 8 positions quantized at length 8 (below 50%): the rest sat in its full-precision "
        "residual, so its bytes and drift there are mostly float's; longer lengths or a smaller --quant-residual "
        "measure the format"]


def test_what_the_cache_counted_outranks_the_formula():
    """A count the cache recorded (transformers' caches have no formula) is what the mark reads."""
    report = build_report(view(quantized_record(recorded={8: 8, 256: 100})))
    marks = {row.length: row.marks for row in report.rows if row.mode == "quantized-int8"}
    assert "unquantized" not in marks[8] and "unquantized" in marks[256]


def test_run_warns_on_stderr_of_a_quantized_kind_that_quantized_nothing(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    try:
        assert main(["run", "--lengths", "8", "--modes", "full,quantized-int4", "--repeats", "3", "--control", "none",
                     "--output", str(tmp_path / "q.json"), "--no-progress"]) == 0
    finally:
        torch.set_num_threads(threads)
    captured = capsys.readouterr()
    assert "warning: quantized-int4 held 0 of 8 positions quantized at length 8 (below 50%)" in " ".join(
        captured.err.split())
    assert "∅" in captured.out
    record = json.loads((tmp_path / "q.json").read_text())
    assert [m.get("quantized_positions") for m in record["memory"]] == [None, 0]


def test_every_markdown_table_has_as_many_header_cells_as_row_cells():
    """The trade-off table's "max |Δ|" header split into two cells, shifting every column after it."""
    page = markdown.render_report(build_report(view(quantized_record())))
    cells = lambda line: len(re.split(r"(?<!\\)\|", line)) - 2  # noqa: E731  (unescaped pipes, less the two ends)
    tables = [block.splitlines() for block in page.split("\n\n") if block.startswith("| ")]
    assert any("max \\|Δ\\|" in table[0] for table in tables)
    for table in tables:
        assert {cells(line) for line in table} == {cells(table[0])}, table[0]
