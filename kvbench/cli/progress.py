"""`kvbench run`'s progress on stderr: a bar per stage that moves, the estimate of a long stage, and a warning
up front when the minimum rotations cannot fit in the time budget; and the one line of every other stage that can
take minutes (a real model's load, --quality, a serving run's gates and replays): its elapsed clock, or its count and
an estimate once it has one."""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING

from kvbench.measure.timing import Protocol

if TYPE_CHECKING:  # kvbench.workloads.benchmark imports torch; a cheap command must not
    from kvbench.workloads.benchmark import Progress

UNTIMED = ("reference", "check")  # stages that time nothing: the display may redraw itself while they run


def duration_text(seconds: float) -> str:
    """52 s, 3 min 40 s, 2 h 05 min: rounded as an estimate deserves."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{max(seconds, 1)} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def count_text(event: Progress) -> str:
    unit = f" {event.unit}" if event.unit else ""
    return f"{event.done:.0f}/{event.total:.0f}{unit}"


def estimate_text(event: Progress) -> str:
    if event.estimate is None:
        return ""
    if event.stage == "time" and event.unit == "s":  # sampling until precise: the minimum rotations' time
        return f"at least about {duration_text(event.estimate)}"
    return f"about {duration_text(event.estimate)}"


class Ticking:
    """What both progress lines share: a thread that redraws the elapsed clock every TICK_SECONDS while nothing is
    timed (`untimed` set), and an exit that stops it and closes the bars."""

    TICK_SECONDS = 1.0

    def tick(self) -> None:
        while not self.stopped.wait(self.TICK_SECONDS):
            if self.untimed.is_set():
                self.progress.refresh()

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        if self.progress is not None:
            self.progress.__exit__(*exc)


class ProgressBar(Ticking):
    """A rich progress bar per stage on stderr, fed by run_benchmark's Progress events; with `disabled`, only
    the warnings.

    While a stage times something it is redrawn only from those events, which come between samples, at most
    REFRESH_SECONDS apart: rich's own refresh thread would take the interpreter lock in the middle of timed
    loops (it put a third of a run's samples off CPU by more than 2%). During the untimed stages (the gate's
    reference and checks, which can take minutes at long lengths) a thread redraws it every TICK_SECONDS, so
    the elapsed time moves."""

    REFRESH_SECONDS = 0.25

    def __init__(self, console, disabled: bool, protocol: Protocol | None = None) -> None:
        from rich.progress import BarColumn, Progress as Bars, TextColumn, TimeElapsedColumn

        self.console, self.protocol = console, protocol
        self.progress = None if disabled else Bars(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[count]}"), TimeElapsedColumn(),
            TextColumn("{task.fields[estimate]}"), console=console, transient=True, auto_refresh=False,
        )
        self.tasks: dict[str, int] = {}
        self.drawn = 0.0
        self.warned = False
        self.untimed, self.stopped = threading.Event(), threading.Event()

    def __enter__(self):
        if self.progress is not None:
            self.progress.__enter__()
            threading.Thread(target=self.tick, daemon=True, name="kvbench-progress").start()
        return self.update

    def update(self, event: Progress) -> None:
        self.warn_beyond_budget(event)
        if self.progress is None:
            return
        if event.stage in UNTIMED:
            self.untimed.set()
        else:  # from here until the next untimed stage only events redraw
            self.untimed.clear()
        fields = {"count": count_text(event), "estimate": estimate_text(event)}
        if event.stage not in self.tasks:
            self.tasks[event.stage] = self.progress.add_task(event.stage, total=event.total, **fields)
        self.progress.update(self.tasks[event.stage], completed=event.done, total=event.total, **fields)
        now = time.monotonic()
        if now - self.drawn >= self.REFRESH_SECONDS or event.done >= event.total:
            self.progress.refresh()
            self.drawn = now

    def warn_beyond_budget(self, event: Progress) -> None:
        """One line, once, before the first sample: the minimum rotations' estimate beyond --max-seconds."""
        protocol = self.protocol
        if (self.warned or event.stage != "time" or event.estimate is None or protocol is None
                or protocol.precision is None or event.estimate <= protocol.max_seconds):
            return
        self.warned = True
        self.warn(f"kvbench: warning: the minimum {protocol.repeats} rotations per length should take about "
                  f"{duration_text(event.estimate)} (from the gate's timings), beyond --max-seconds "
                  f"{protocol.max_seconds:g}: the run will take that long; fewer lengths or modes, or a lower "
                  "--min-repeats, would fit")

    def warn(self, line: str) -> None:
        if self.progress is None:
            print(line, file=sys.stderr, flush=True)
        else:  # above the bars, which stay drawn below it
            self.progress.console.print(line, markup=False, highlight=False, soft_wrap=True)


KEEP = object()  # Stage.update's default: the total stays what it was


class Stage(Ticking):
    """One stage that can take minutes outside run_benchmark's bars (a real model's load, the quality measurement,
    a serving run's gates and replays) on stderr: its elapsed clock, and once it has a count, a bar, the count and
    an estimate of what is left from the pace so far. Nothing is drawn with `disabled` (--no-progress) or when the
    console is not a terminal: a log or a pipe gets no redrawn lines.

    As in ProgressBar, a thread redraws the clock every TICK_SECONDS only while nothing is timed; an update with
    `timed=True` (a serving replay, which the sampler times) stops it until an untimed update, and from then on
    the line moves with the updates, which come between samples."""

    def __init__(self, console, description: str, total: float | None = None, disabled: bool = False) -> None:
        from rich.progress import BarColumn, Progress as Bars, TextColumn, TimeElapsedColumn

        class CountedBar(BarColumn):  # no pulsing bar while there is nothing to count: the clock says enough
            def render(self, task):
                return "" if task.total is None else super().render(task)

        self.progress = None if disabled or not console.is_terminal else Bars(
            TextColumn("{task.description}"), CountedBar(), TextColumn("{task.fields[count]}"), TimeElapsedColumn(),
            TextColumn("{task.fields[estimate]}"), console=console, transient=True, auto_refresh=False,
        )
        self.description, self.total, self.done = description, total, 0.0
        self.untimed, self.stopped = threading.Event(), threading.Event()
        self.untimed.set()
        self.started, self.task = time.monotonic(), None

    def __enter__(self):
        if self.progress is not None:
            self.progress.__enter__()
            self.task = self.progress.add_task(self.description, total=self.total, **self.fields())
            self.progress.refresh()
            threading.Thread(target=self.tick, daemon=True, name="kvbench-stage").start()
        return self.update

    def fields(self) -> dict:
        if self.total is None:
            return {"count": "", "estimate": ""}
        count = f"{self.done:.0f}/{self.total:.0f}"
        if not 0 < self.done < self.total:
            return {"count": count, "estimate": ""}
        left = (time.monotonic() - self.started) / self.done * (self.total - self.done)  # at the pace so far
        return {"count": count, "estimate": f"about {duration_text(left)} left"}

    def update(self, done: float, total=KEEP, description: str | None = None, timed: bool = False) -> None:
        """`done` of `total` (None: a count with no end known; left out: as before), under a new description."""
        self.done = done
        self.total = self.total if total is KEEP else total
        self.description = description or self.description
        if timed:
            self.untimed.clear()
        else:
            self.untimed.set()
        if self.progress is not None:
            self.progress.update(self.task, completed=done, total=self.total, description=self.description,
                                 **self.fields())
            self.progress.refresh()


def stage(console, description: str, total: float | None = None, disabled: bool = False) -> Stage:
    """`with stage(console, "loading smollm2-135m") as update:` an elapsed clock; `update(k, n)` a count and an
    estimate."""
    return Stage(console, description, total, disabled)
