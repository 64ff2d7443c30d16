"""kvbench.report.record.terminal's quick table (run, show) and the rows behind it, from hand-built records."""

import dataclasses
import io
from pathlib import Path

import pytest
from records import synthetic_record, view
from rich.console import Console

from kvbench.cli import main
from kvbench.report.format import format_bytes, render_plain
from kvbench.report.record.model import MARKS, build_report
from kvbench.report.record.terminal import quick_table, report_renderables

SECONDS = {("full", 4): [1.0, 2.0, 3.0, 4.0], ("concat", 4): [0.5, 0.25, 1.0, 0.75],
           ("full", 8): [4.0, 4.0, 8.0, 6.0], ("concat", 8): [2.0, 1.0, 1.5, 3.0]}


def render(table) -> str:
    console = Console(width=200, record=True, color_system=None, file=io.StringIO())
    console.print(table)
    return console.export_text()


def line_of(text: str, *words: str) -> str:
    (line,) = [line for line in text.splitlines() if all(word in line for word in words)]
    return line


def summary_table(record):
    return quick_table(build_report(view(record)))


def rows_of(record):
    return build_report(view(record)).rows


def test_rows_in_run_order_join_everything(make_record):
    record = make_record(SECONDS, failed={("concat", 8)})
    rows = rows_of(record)
    assert [(r.length, r.mode) for r in rows] == [(4, "full"), (4, "concat"), (8, "full"), (8, "concat")]
    by_key = {(r.mode, r.length): r for r in rows}
    assert by_key[("full", 4)].median == 2.5
    assert by_key[("full", 4)].speedup is None and by_key[("full", 4)].is_baseline
    assert by_key[("concat", 4)].speedup.ratio == pytest.approx((3 + 16 / 3) / 2)  # pairs 2, 8, 3, 5.33
    assert by_key[("concat", 8)].check["passed"] is False
    assert by_key[("concat", 8)].speedup_valid is False
    assert by_key[("concat", 8)].memory["measured_bytes"] == 256 * 8


def test_rows_skip_cells_an_interrupted_run_never_reached(make_record):
    record = make_record({("full", 4): [1.0, 2.0], ("concat", 4): [0.5]}, status="incomplete", repeats=2,
                         lengths=[4, 8])
    assert [(r.length, r.mode) for r in rows_of(record)] == [(4, "full"), (4, "concat")]


def test_summary_table_values(make_record):
    text = render(summary_table(make_record(SECONDS)))
    assert "kvbench seed: batch 1, float32, 1 thread(s), 4 repetitions" in text
    assert "INCOMPLETE" not in text
    for header in ("length", "mode", "wall median ms", "IQR %", "wall µs/token", "speedup", "95% rerun interval",
                   "KV bytes", "equivalence", "marks"):
        assert header in text
    full4 = line_of(text, " full ", "baseline", "2,500.0")
    assert " 60% " in full4  # IQR (3.25 - 1.75) / 2.5 = 60 %
    assert "625,000.0" in full4  # 2.5 s / 4 tokens in microseconds
    assert "1.0/2.0 KiB" in full4  # measured 256 * 4, reserved 512 * 4
    assert "ok 1.0e-07" in full4 and "~" in full4  # its spread is too wide to trust the median
    concat4 = line_of(text, " concat ", " 625.0 ")
    assert "4.17x" in concat4 and "invalid" not in concat4  # the median of 2, 8, 3, 5.33
    concat8 = line_of(text, " concat ", "1,750.0")
    assert "3.00x" in concat8  # the median of 2, 4, 5.33, 2


def test_summary_table_marks_failed_check_and_invalid_speedup(make_record):
    text = render(summary_table(make_record(SECONDS, failed={("concat", 8)})))
    concat8 = line_of(text, " concat ", "1,750.0")
    assert "FAILED 5.0e-01 @ 2" in concat8 and "✗" in concat8
    assert "(3.00x invalid)" in concat8 and "[" not in concat8  # no interval for an invalid speedup
    concat4 = line_of(text, " concat ", " 625.0 ")
    assert "4.17x" in concat4 and "FAILED" not in concat4 and "invalid" not in concat4
    assert text.count("FAILED") == 1 and text.count("invalid") == 1


def test_summary_table_marks_incomplete_and_unchecked(make_record):
    record = make_record({("full", 4): [1.0, 2.0], ("concat", 4): [0.5]}, status="incomplete", repeats=2)
    record["checks"] = [c for c in record["checks"] if c["mode"] != "concat"]
    text = render(summary_table(record))
    assert "INCOMPLETE" in text
    assert "not checked" in line_of(text, " concat ")


def test_format_bytes():
    assert format_bytes(None) == "-"
    assert format_bytes(0) == "0 B"
    assert format_bytes(1023) == "1,023 B"
    assert format_bytes(1024) == "1.0 KiB"
    assert format_bytes(3 * 1024 * 1024) == "3.0 MiB"
    assert format_bytes(5 * 1024**4) == "5,120.0 GiB"


@pytest.mark.parametrize("mark", list(MARKS))
def test_every_mark_has_a_terminal_style(mark):
    """A mark the model can set but the terminal cannot style would crash `kvbench report`."""
    report = build_report(view(synthetic_record(SECONDS)))
    row = dataclasses.replace(report.rows[1], marks=(mark,), undisturbed=report.rows[1].speedup)
    text = render_plain(report_renderables(dataclasses.replace(report, rows=[report.rows[0], row])))
    assert MARKS[mark][0] in text


def test_a_disturbed_speedup_is_shown_beside_the_undisturbed_one():
    report = build_report(view(synthetic_record(SECONDS)))
    cached = report.rows[1]
    row = dataclasses.replace(cached, marks=("disturbed",), undisturbed=dataclasses.replace(cached.speedup, ratio=3.5))
    text = render_plain(report_renderables(dataclasses.replace(report, rows=[report.rows[0], row])))
    assert f"{cached.speedup.ratio:.2f}x (3.50x undisturbed)" in text


def test_the_committed_reference_record_reports_in_every_layout(capsys):
    """It carries a trend mark (↗): every layout must show it."""
    reference = Path(__file__).resolve().parent.parent / "results" / "reference.json"
    for layout in ("text", "markdown", "html"):
        assert main(["report", str(reference), "--format", layout]) == 0
        assert "↗" in capsys.readouterr().out


def budget_record(steal_share: float, wait_share: float):
    """A run whose lengths stopped on the budget, short of ±5%, with this much of the time stolen or waited."""
    record = synthetic_record(SECONDS)
    record["protocol"]["precision"] = 0.05
    record["sampling"]["lengths"] = [{"length": 4, "rotations": 4, "stop": "budget", "half_width": 0.31},
                                     {"length": 8, "rotations": 4, "stop": "precise", "half_width": 0.04}]
    for rep in record["repetitions"]:
        rep.update(steal_seconds=rep["seconds"] * steal_share, runqueue_seconds=rep["seconds"] * wait_share)
    return record


@pytest.mark.parametrize("steal, wait, opening", [
    (0.24, 0.0, "this machine was contended: 12% of the machine's CPU time stolen by the hypervisor"),  # 2 CPUs
    (0.0, 0.21, "this machine was contended: 21% of the timed time spent waiting for a CPU"),
    (0.02, 0.0, "the samples disagreed more than this machine's counters explain (1% of the machine's CPU time"),
])
def test_a_run_that_ran_out_of_time_says_why_in_words(steal, wait, opening):
    from kvbench.report.record.model import contention_sentence

    record = view(budget_record(steal, wait))
    sentence = contention_sentence(record, build_report(record))
    assert sentence.startswith(opening)
    assert sentence.endswith("intervals up to ±31% (length 4; 1 length(s) stopped short of ±5%: 4); "
                             "rerun on a quieter machine or raise --max-seconds")


def test_a_run_that_reached_its_precision_says_nothing_of_contention():
    from kvbench.report.record.model import contention_sentence

    record = budget_record(0.3, 0.3)
    record["sampling"]["lengths"][0].update(stop="precise", half_width=0.04)
    assert contention_sentence(view(record), build_report(view(record))) is None
