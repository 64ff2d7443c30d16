"""A serving record's report and compare on narrow and wide terminals, and compare's discipline on runs of the
same code (the A/A check): no false "worse" among the many measures it judges."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from kvbench.cli import main
from kvbench.report.comparison.significance import holm, incomplete_beta, welch_p

ROOT = Path(__file__).resolve().parents[1]
CHAT = ROOT / "results/serving/llama-mini-chat-16.json"
QUIET = ROOT / "results/serving/llama-mini-chat-16-quiet.json"
PEER = ROOT / "results/serving/llama-mini-chat-16-peer.json"
TIME = re.compile(r"\d e\+|\de\+\d")  # 1.92e+03: a time in scientific notation
# a row's verdict, after its ratio (and its MDE where the width shows it)
VERDICT = re.compile(r"\dx\s+(?:±[\d.]+%\s+)?(better|worse|within noise|unchanged)\s*$", re.M)


def run(monkeypatch, *argv, columns: int | None = None) -> tuple[int, str, str]:
    if columns is not None:
        monkeypatch.setenv("COLUMNS", str(columns))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([str(a) for a in argv])
    return status, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("columns", [80, 100, 132])
@pytest.mark.parametrize("path", [CHAT, PEER])
def test_a_serving_report_cuts_no_value_and_writes_no_time_in_scientific_notation(monkeypatch, columns, path):
    for command in ("report", "show"):
        status, out, err = run(monkeypatch, command, path, columns=columns)
        assert status == 0, err
        assert "…" not in out and not TIME.search(out), out
        assert max(len(line) for line in out.splitlines()) <= columns
        # one clock per table, named in its title
        assert out.count("wall clock") == 2 and out.count("(time.perf_counter_ns)") == 2, out
        assert re.search(r"\d (ms|s) ", out)  # times carry a scaled unit


# this round's sections: the prefix cache's table (with and without the cache), the sweep's and the capacity's
PREFIX = ROOT / "results/serving/prefix-multi-turn-lpf.json"
SWEEP = ROOT / "results/serving/goodput/llama-mini-chat-16-capacity-512-1.json"


@pytest.mark.parametrize("columns", [80, 100, 132])
@pytest.mark.parametrize("path", [PREFIX, SWEEP])
def test_the_prefix_cache_and_sweep_tables_cut_no_value_at_any_width(monkeypatch, columns, path):
    status, out, err = run(monkeypatch, "report", path, columns=columns)
    assert status == 0, err
    assert "…" not in out and not TIME.search(out), out
    assert max(len(line) for line in out.splitlines()) <= columns
    table = "prefix cache: token hit rate" if path == PREFIX else "rate sweep: throughput and latency"
    assert table in out
    if columns == 80:
        assert "not shown at this width" in out


@pytest.mark.parametrize("columns", [80, 100, 132])
def test_a_serving_compare_keeps_its_verdicts_whole_at_any_width(monkeypatch, columns):
    status, out, err = run(monkeypatch, "compare", CHAT, QUIET, columns=columns)
    assert status == 0, err
    assert "…" not in out and not TIME.search(out), out
    assert max(len(line) for line in out.splitlines()) <= columns
    header = next(line for line in out.splitlines() if "NEW / OLD" in line and "verdict" in line)
    assert header.rstrip().endswith("verdict")
    verdicts = VERDICT.findall(out)
    # the quiet machine's replays are about 3.3x faster: judged better, on nearly every measure, at every width
    assert len(verdicts) == 31 and verdicts.count("better") >= 25 and "worse" not in verdicts
    assert "A/A floor per measure" in out and "Holm–Bonferroni over 31 measures" in out
    if columns == 80:
        assert "not shown at this width: MDE" in out


def test_welch_and_holm_are_what_the_textbooks_give():
    # scipy.stats.ttest_ind(log(a), log(b), equal_var=False).pvalue, computed once (scipy is not a reader's import)
    assert welch_p([0.92, 0.98, 1.02], [1.26, 7.71, 8.48]) == pytest.approx(0.1366867658475822, rel=1e-9)
    assert welch_p([1, 1.1, 1.2, 1.05, 0.99], [1.3, 1.4, 1.2, 1.5, 1.35]) == pytest.approx(0.0018404820376149741,
                                                                                           rel=1e-9)
    assert welch_p([1.0], [2.0, 3.0]) == 1.0 and welch_p([2.0, 2.0], [2.0, 2.0]) == 1.0
    assert incomplete_beta(2.0, 3.0, 0.4) == pytest.approx(0.5248, rel=1e-9)  # 1 - sum of the binomial terms
    # Holm: 0.01 <= 0.05/4, 0.012 <= 0.05/3, 0.04 > 0.05/2 stops, so 0.03... is not rejected though <= 0.05
    assert holm([0.04, 0.01, 0.03, 0.012], 0.05) == [False, True, False, True]
    assert holm([0.013, 0.014, 0.015], 0.05) == [True, True, True]  # Bonferroni (0.05/3) would reject them too
    assert holm([0.02, 0.04], 0.05) == [True, True] and holm([0.026, 0.04], 0.05) == [False, False]


def test_two_runs_of_the_same_code_compare_without_a_worse_verdict(monkeypatch, tmp_path):
    """The A/A check, in process: two short serving runs of the seed model, then compare --fail-on-regression."""
    import torch

    threads = torch.get_num_threads()
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    try:
        for path in paths:
            status, _, err = run(monkeypatch, "run", "--trace", "fixed:32,8", "--requests", "8", "--repeats", "3",
                                 "--output", path)
            assert status == 0, err
    finally:
        torch.set_num_threads(threads)
    status, out, err = run(monkeypatch, "compare", *paths, "--fail-on-regression", columns=132)
    assert status == 0 and "regression" not in err, out + err
    verdicts = VERDICT.findall(out)
    assert verdicts and "worse" not in verdicts and "better" not in verdicts
