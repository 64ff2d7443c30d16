"""Progress that shows life: kvbench.cli.progress driven by Progress events directly (no sleeping), and the
estimates kvbench.workloads.benchmark puts in them, from a real run of the lab model."""

import io

import pytest
from rich.console import Console

from kvbench.cli.progress import ProgressBar, duration_text
from kvbench.measure.timing import Protocol
from kvbench.model import DecoderConfig, build_model
from kvbench.workloads.benchmark import Progress, run_benchmark, span_seconds


def bar(protocol=None, disabled=False):
    out = io.StringIO()
    return ProgressBar(Console(file=out, width=120, force_terminal=True), disabled, protocol), out


def drawn(progress_bar) -> str:
    """The bars as they are drawn now."""
    out = io.StringIO()
    Console(file=out, width=120, color_system=None).print(progress_bar.progress.make_tasks_table(
        progress_bar.progress.tasks))
    return out.getvalue()


def test_duration_text_rounds_as_an_estimate_deserves():
    assert [duration_text(s) for s in (0.2, 52.4, 59.6, 220, 3725)] == ["1 s", "52 s", "1 min 00 s", "3 min 40 s",
                                                                        "1 h 02 min"]


def test_the_reference_stage_shows_its_estimate_before_it_starts():
    progress_bar, _ = bar()
    with progress_bar as update:
        update(Progress("reference", 0, 1, estimate=52.4))
        line = next(line for line in drawn(progress_bar).splitlines() if "reference" in line)
        assert "0/1" in line and "about 52 s" in line
        assert progress_bar.untimed.is_set()  # nothing is timed: the elapsed clock may redraw itself
        update(Progress("time", 0, 75, "s", 20.0))
        assert not progress_bar.untimed.is_set()  # samples are timed: only events redraw


def test_the_time_bar_moves_with_the_budget_instead_of_sitting_full():
    """Until precise, the bar is the budget's seconds: half the budget gone is half a bar, however many samples
    the growing plan holds (the old bar counted samples against a plan that grew with them: always full)."""
    progress_bar, _ = bar(Protocol())
    with progress_bar as update:
        update(Progress("time", 0, 75, "s", 20.0))
        update(Progress("time", 37.5, 75, "s", 20.0))
        (task,) = progress_bar.progress.tasks
        assert task.percentage == pytest.approx(50)
        line = drawn(progress_bar)
        assert "38/75 s" in line and "at least about 20 s" in line


def test_a_minimum_beyond_the_budget_warns_once_on_stderr_before_the_first_sample(capsys):
    progress_bar, _ = bar(Protocol(max_seconds=30), disabled=True)
    with progress_bar as update:
        update(Progress("reference", 0, 1, estimate=12.0))
        update(Progress("time", 0, 224, "s", 224.0))
        update(Progress("time", 5, 224, "s", 224.0))
    err = capsys.readouterr().err
    assert err == ("kvbench: warning: the minimum 7 rotations per length should take about 3 min 44 s (from the "
                   "gate's timings), beyond --max-seconds 30: the run will take that long; fewer lengths or modes, "
                   "or a lower --min-repeats, would fit\n")


@pytest.mark.parametrize("protocol, estimate", [(Protocol(max_seconds=30), 29.0), (Protocol.fixed(7), 500.0)])
def test_no_warning_within_the_budget_or_without_one(capsys, protocol, estimate):
    progress_bar, _ = bar(protocol, disabled=True)
    with progress_bar as update:
        update(Progress("time", 0, 30, "s", estimate))
    assert capsys.readouterr().err == ""


def test_span_seconds_adds_the_forwards_on_the_line_through_the_two_measured():
    forward = (0.001, 0.101, 101)  # 1 ms for one token, 101 ms for 101: 1 ms more per token
    assert span_seconds(forward, 1, 101) == pytest.approx(sum(0.001 * n for n in range(1, 102)))
    assert span_seconds(forward, 50, 60) == pytest.approx(sum(0.001 * n for n in range(50, 61)))


@pytest.fixture(scope="module")
def lab():
    return build_model(DecoderConfig(max_length=64), seed=0)


def test_a_run_estimates_its_reference_and_its_minimum_rotations_before_they_start(lab):
    """The events of a real run: the reference's estimate comes with its first event, the minimum rotations'
    with the first time event, before any sample; the time bar's total is the budget and it never shrinks."""
    events = []
    protocol = Protocol(repeats=3, max_repeats=3, max_seconds=0.001, warmup=0)
    outcome = run_benchmark(lab, [8, 16], ["full", "static"], protocol, on_progress=events.append)
    stages = [event.stage for event in events]
    reference = events[stages.index("reference")]
    assert (reference.done, reference.total) == (0, 1) and reference.estimate > 0
    assert events[stages.index("reference") + 1] == Progress("reference", 1, 1)
    first_time = events[stages.index("time")]
    assert (first_time.done, first_time.unit) == (0, "s") and first_time.estimate > protocol.max_seconds
    assert first_time.total == pytest.approx(first_time.estimate)  # the minimum is beyond the budget
    timed = [event for event in events if event.stage == "time"]
    assert len(timed) == 1 + len(outcome.repetitions) and {e.total for e in timed} == {first_time.total}
    assert [e.done for e in timed] == sorted(e.done for e in timed)  # the bar moves one way


def test_the_minimum_estimate_is_of_the_order_of_what_the_rotations_took(lab):
    """The estimate comes from the gate's timings (each check ran its mode once). The gate and the rotations run
    seconds apart, and on this shared 2-core machine (load 13 while this was written) the same loop's time moved
    by 2x between them: the estimate is held to a factor of 8 of the rotations' measured seconds, which a
    wrong unit (milliseconds, a rotation per run instead of per length and repetition) would still break."""
    events = []
    outcome = run_benchmark(lab, [8, 24], ["full", "static"], Protocol.fixed(4, warmup=1), on_progress=events.append)
    estimate = next(event.estimate for event in events if event.stage == "time")
    took = sum(repetition["seconds"] for repetition in outcome.repetitions)
    assert took / 8 < estimate < took * 8


def test_a_rotation_adds_the_loops_full_and_the_control_as_an_average_mode():
    from kvbench.workloads.benchmark import rotation_seconds

    assert rotation_seconds(0.3, 0.0, 3, False) == pytest.approx(0.3)
    assert rotation_seconds(0.3, 0.3, 3, True) == pytest.approx(0.8)  # (gate + full) * (1 + 1/3)
