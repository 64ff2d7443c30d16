"""Goodput and capacity (kvbench.serving.goodput, .sweep; kvbench.cli.goodput; kvbench.report.record.goodput): the
search on a synthetic monotone curve, the targets and rates as parsed, the share and its Wilson interval, the
options refused with one line, and one tiny sweep and search end to end through the record and every report."""

from __future__ import annotations

import contextlib
import io
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.cli import main
from kvbench.serving import goodput

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([str(a) for a in argv])
    return status, out.getvalue(), err.getvalue()


@settings(max_examples=200, deadline=None)
@given(capacity=st.floats(1e-3, 1e4), offset=st.floats(-math.log(63.9), math.log(63.9)))
def test_the_search_finds_a_monotone_curves_capacity_within_5_percent_in_8_probes(capacity, offset):
    """Any capacity, any start within 64x of it: the bracket holds the capacity and the reported one is within
    +-5% of it, in at most 8 probes."""
    calls = []
    found = goodput.capacity_search(lambda rate: calls.append(rate) or rate <= capacity, capacity * math.exp(offset))
    assert len(calls) == len(found.probes) <= goodput.MAX_PROBES
    assert found.low <= capacity < found.high
    assert abs(found.capacity / capacity - 1) <= goodput.TOLERANCE
    assert found.reason.startswith("bracketed")


def test_the_search_records_every_probe_and_says_when_it_could_not_bracket():
    found = goodput.capacity_search(lambda rate: rate <= 1.0, start=1000.0)  # 1000x above: 8 probes are not enough
    assert len(found.probes) == 8 and found.capacity is None and found.low is not None
    assert found.reason == "8 probes without a bracket within +-5%"
    low, high = 1000 / 4**5, 1000 / 4**4
    rates = [1000 / 4**k for k in range(6)] + [math.sqrt(low * high), low**0.75 * high**0.25]
    assert [rate for rate, _ in found.probes] == pytest.approx(rates)  # bracketing down by 4, then bisection
    assert [met for _, met in found.probes] == [False] * 5 + [True, False, False]
    never = goodput.capacity_search(lambda rate: True, start=1.0, max_rate=100.0)
    assert never.capacity is None and never.high is None and [r for r, _ in never.probes] == [1, 4, 16, 64]
    assert never.reason.startswith("every probe met")


def test_a_probe_that_stops_ends_the_search_with_its_reason():
    def probe(rate):
        if rate < 1:
            raise StopIteration("out of time")
        return False
    found = goodput.capacity_search(probe, start=2.0)
    assert found.probes == ((2.0, False),) and found.reason == "out of time" and found.capacity is None


def test_targets_parse_in_ms_or_as_multiples_of_the_unloaded_step():
    ttft, tbt = goodput.parse_slo("ttft_p99=500, tbt_p99=5x")
    assert (ttft.seconds(None), tbt.seconds(0.002)) == (0.5, 0.01)
    assert tbt.relative and not ttft.relative and tbt.text() == "tbt_p99=5x"
    with pytest.raises(ValueError, match="needs the unloaded decode step"):
        tbt.seconds(None)


@pytest.mark.parametrize("text,message", [
    ("ttft_p99=0", "finite number above 0"), ("tbt_p99=-5x", "finite number above 0"),
    ("ttft_p99=inf", "finite number above 0"), ("ttft_p99=nan", "finite number above 0"),
    ("tbt_p99=0x", "finite number above 0"), ("ttfb_p99=5", "unknown target 'ttfb_p99'"),
    ("ttft_p99", "NAME=MS or NAME=Nx"), ("ttft_p99=1,ttft_p99=2", "given twice")])
def test_a_bad_target_is_refused(text, message):
    with pytest.raises(ValueError, match=message):
        goodput.parse_slo(text)


def test_rates_parse_sorted_and_distinct_and_scale_one_pattern_of_arrivals():
    assert goodput.parse_rates("4,0.5,1") == (0.5, 1.0, 4.0)
    for bad in ("0", "-1", "inf", "nan", "1,1", "x"):
        with pytest.raises(ValueError):
            goodput.parse_rates(bad)
    gaps = goodput.unit_gaps(7, 50)
    assert gaps == goodput.unit_gaps(7, 50) and gaps != goodput.unit_gaps(8, 50)
    slow, fast = goodput.arrivals_at(gaps, 1.0), goodput.arrivals_at(gaps, 4.0)
    assert all(abs(s / 4 - f) <= 1e-6 for s, f in zip(slow, fast)) and slow == sorted(slow)


def replay_of(ttfts: list[float], gap: float) -> dict:
    """A replay's stamps: each request arrives at 0, its first token at its TTFT, then 3 more `gap` apart."""
    return {"requests": [{"arrival": 0.0, "token_times": [t + k * gap for k in range(4)]} for t in ttfts],
            "iterations": []}


def test_the_share_meeting_every_target_and_its_wilson_interval():
    replay = replay_of([0.1] * 8 + [0.5, 0.9], gap=0.01)  # 8 of 10 meet a 0.2 s TTFT
    met = goodput.attainment(replay, {"ttft_p99": 0.2, "tbt_p99": 0.02})
    assert (met["good"], met["requests"], met["share"], met["meets"]) == (8, 10, 0.8, False)
    z = 1.959963984540054  # the Wilson score interval, by its formula
    centre, half = (0.8 + z * z / 20) / (1 + z * z / 10), z / (1 + z * z / 10) * math.sqrt(0.8 * 0.2 / 10 + z * z / 400)
    assert met["share_low"] == pytest.approx(centre - half) and met["share_high"] == pytest.approx(centre + half)
    assert met["goodput"] == pytest.approx(8 / 0.93)  # good requests over the makespan (the last token, 0.9 + 0.03)
    assert met["goodput_low"] == pytest.approx(met["share_low"] * 10 / 0.93)
    assert goodput.attainment(replay, {"tbt_p99": 0.005})["good"] == 0  # every gap is 0.01 s
    assert goodput.attainment(replay, {"ttft_p99": 1.0})["meets"]


BASE = ("run", "--preset", "seed", "--trace", "fixed:8,6", "--requests", "6", "--modes", "paged", "--repeats", "1",
        "--control", "none", "--no-progress")


@pytest.mark.parametrize("extra,message", [
    (("--rate-sweep", "0"), "--rate-sweep 0: a rate must be a finite number above 0, got '0'"),
    (("--rate-sweep", "1,-2"), "got '-2'"), (("--rate-sweep", "inf"), "got 'inf'"),
    (("--rate-sweep", "1", "--slo", "ttft_p99=0"), "--slo ttft_p99=0: ttft_p99 must be a finite number above 0"),
    (("--rate-sweep", "1", "--slo", "ttfx=5"), "unknown target 'ttfx'"),
    (("--rate-sweep", "1", "--arrivals", "poisson:2"), "leave out --arrivals"),
    (("--capacity",), "--capacity searches for the highest rate that meets targets: give them with --slo"),
    (("--slo", "ttft_p99=5"), "--slo needs --rate-sweep or --capacity"),
])
def test_a_bad_sweep_is_refused_with_one_line_before_anything_runs(tmp_path, extra, message):
    output = tmp_path / "r.json"
    status, _, err = run(*BASE, *extra, "--output", output)
    assert status == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not output.exists()


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep") / "sweep.json"
    status, out, err = run(*BASE, "--modes", "static,paged", "--rate-sweep", "50,5000", "--capacity",
                           "--slo", "ttft_p99=50,tbt_p99=25x", "--output", path)
    assert status == 0, err
    return path, json.loads(path.read_text())


def test_a_sweep_and_a_search_are_recorded_replay_by_replay(swept):
    _, record = swept
    sweep = record["serving"]["sweep"]
    assert sweep["rates"] == [50.0, 5000.0] and sweep["kinds"] == ["static", "paged"]
    assert [(p["kind"], p["rate"]) for p in sweep["points"] if not p["search"]] == \
        [("static", 50.0), ("paged", 50.0), ("static", 5000.0), ("paged", 5000.0)]
    assert sweep["limits"]["ttft_p99"] == 0.05
    assert sweep["limits"]["tbt_p99"] == pytest.approx(25 * sweep["unloaded"]["step_seconds"])
    assert len(sweep["unloaded"]["gaps"]) == 3 * 5  # 3 replays of a request of 6 tokens
    for kind, search in sweep["searches"].items():
        probes = [(p["rate"], p) for p in sweep["points"] if p["search"] and p["kind"] == kind]
        assert [rate for rate, _ in probes] == [probe["rate"] for probe in search["probes"]]
        assert 1 <= len(probes) <= goodput.MAX_PROBES
        for (rate, point), probe in zip(probes, search["probes"]):  # each verdict is its replay's, as recorded
            assert goodput.attainment(point["replay"], sweep["limits"])["meets"] == probe["met"]
            arrivals = [request["arrival"] for request in point["replay"]["requests"]]
            assert arrivals == goodput.arrivals_at(goodput.unit_gaps(record["protocol"]["seed"], 6), rate)
        if search["capacity"] is not None:
            assert search["low"] <= search["capacity"] <= search["high"] <= search["low"] * goodput.SPAN


def test_every_report_shows_the_sweep_and_report_plots_its_throughput_latency_curve(swept, tmp_path):
    path, _ = swept
    status, out, _ = run("report", path, "--wide")
    assert status == 0 and "rate sweep" in out and "capacity" in out and "Wilson" in out
    status, _, _ = run("report", path, "--format", "markdown", "--output", tmp_path / "r.md", "--plot",
                       tmp_path / "curve.svg")
    markdown, svg = (tmp_path / "r.md").read_text(), (tmp_path / "curve.svg").read_text()
    assert status == 0 and "![kvbench: throughput-latency curve](curve.svg)" in markdown
    assert "achieved requests/s" in svg and "share meeting every target" in svg
    status, _, _ = run("report", path, "--format", "html", "--output", tmp_path / "r.html")
    assert status == 0 and 'alt="throughput-latency curve"' in (tmp_path / "r.html").read_text()


def test_a_sweep_that_cannot_finish_within_max_seconds_is_refused_and_says_why(tmp_path):
    output = tmp_path / "r.json"
    status, _, err = run(*BASE, "--rate-sweep", "1,2,4", "--max-seconds", "0.0001", "--output", output)
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "refused before its first replay: 3 replays" in err and "beyond --max-seconds 0.0001" in err
    sweep = json.loads(output.read_text())["serving"]["sweep"]
    assert sweep["points"] == [] and sweep["stopped"].startswith("refused")


def test_a_sweep_stops_before_a_replay_that_would_pass_its_deadline_and_says_so():
    """The stop rule inside the sweep (the CLI's estimate passed): time spent plus the next replay's estimate."""
    from kvbench.config import DecoderConfig
    from kvbench.model import build_model
    from kvbench.serving.sweep import run_sweep
    from kvbench.serving.trace import make_trace

    model = build_model(DecoderConfig(), seed=0)
    served = make_trace({"lengths": "fixed", "prompt": [4, 4], "output": [3, 3], "arrivals": "all", "requests": 3},
                        0, model.config.max_length)
    settings = {"paged": {"block_size": 16, "share_prefix": False, "max_batched_tokens": None}}
    sweep = run_sweep(model, served, ["paged"], 1 << 20, settings, rates=(), targets=goodput.parse_slo("tbt_p99=5x"),
                      search_starts={"paged": 10.0}, max_seconds=0.5, seconds_each={"paged": 0.6})
    assert sweep["points"] == [] and sweep["searches"]["paged"]["probes"] == []
    assert sweep["stopped"].startswith("stopped after 0 replays") and "would pass --max-seconds 0.5" in sweep["stopped"]
    assert sweep["unloaded"]["output"] == 3 and len(sweep["unloaded"]["gaps"]) == 3 * 2


def test_a_search_that_never_meets_stops_at_the_least_rate_a_trace_allows():
    found = goodput.capacity_search(lambda rate: False, start=1.0, min_rate=0.01)
    assert [rate for rate, _ in found.probes] == [1, 0.25, 0.0625, 0.015625] and found.capacity is None
    assert found.reason == "no probe met the targets, down to the least a trace allows (0.01/s)"
