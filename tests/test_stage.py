"""The line of a long stage (kvbench.cli.progress.stage): an elapsed clock while there is nothing to count, then a
count, a bar and an estimate; silent with --no-progress and off a terminal. Driven by updates, no sleeping."""

import io

from rich.console import Console

from kvbench.cli.progress import stage


def terminal():
    out = io.StringIO()
    return Console(file=out, width=120, force_terminal=True, color_system=None), out


def drawn(line) -> str:
    out = io.StringIO()
    Console(file=out, width=120, color_system=None).print(line.progress.make_tasks_table(line.progress.tasks))
    return out.getvalue()


def test_a_stage_without_a_count_shows_its_elapsed_clock_only():
    console, out = terminal()
    line = stage(console, "loading smollm2-135m")
    with line:
        shown = drawn(line)
        assert "loading smollm2-135m" in shown and "0:00:00" in shown
        assert "/" not in shown and "about" not in shown and "━" not in shown  # no count, no estimate, no bar
    assert "loading smollm2-135m" in out.getvalue() and "0:00:00" in out.getvalue()  # it was drawn on the console


def test_a_stage_with_a_count_shows_it_a_bar_and_an_estimate_at_the_pace_so_far():
    console, out = terminal()
    line = stage(console, "quality")
    with line as update:
        line.started -= 10.0  # 10 s gone: 2 of 8 steps at 5 s each leave about 30 s
        update(2, 8, "quality: int8 chunk 2 of 4")
        (task,) = line.progress.tasks
        assert (task.completed, task.total, task.description) == (2, 8, "quality: int8 chunk 2 of 4")
        shown = drawn(line)
        assert "2/8" in shown and "about 30 s left" in shown and "━" in shown
        update(3, description="replay 3")  # the total stays
        assert line.progress.tasks[0].total == 8 and "3/8" in drawn(line)
    assert "about 30 s left" in out.getvalue()


def test_a_timed_update_stops_the_clock_thread_until_an_untimed_one():
    console, _ = terminal()
    line = stage(console, "serving")
    with line as update:
        assert line.untimed.is_set()
        update(1, 6, "replay 1 of 6: paged", timed=True)
        assert not line.untimed.is_set()
        update(1, 6, "gate static")
        assert line.untimed.is_set()


def test_no_progress_and_a_non_terminal_draw_nothing():
    console, out = terminal()
    with stage(console, "loading", disabled=True) as update:
        update(1, 2)
    plain = io.StringIO()
    with stage(Console(file=plain, width=120), "loading") as update:  # a pipe or a log: not a terminal
        update(1, 2)
    assert out.getvalue() == "" and plain.getvalue() == ""
