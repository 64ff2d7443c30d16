"""The clock every timed sample and step reads: one object, so that a device's clock is a new class, not an edit
of every timer.

A timer takes a ``mark()`` before the work and another when the work is issued, calls ``synchronize()``, then asks
``elapsed_ns(start, end)``: on the host a mark is perf_counter_ns and the work is done when a call returns, so
synchronize does nothing. A device that queues work (a GPU stream) records an event with each mark and waits for
its stream in synchronize; the elapsed time is then the device's, between the two events, and
``host_elapsed_ns`` the host's between the same marks, recorded beside it: a step whose host time is far above its
device time is launch-bound. ``now_ns()`` is host wall time (the sampler's deadline, the serving replay's
stamps); ``cpu_ns()`` the calling thread's CPU time. Integer nanoseconds, as perf_counter_ns gives them.

Which clock a device times on is a registration (``register_clock``), read by ``clock_for(device)``.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol

__all__ = ["CLOCKS", "HOST", "Clock", "EventClock", "HostClock", "clock_for", "register_clock"]


class Clock(Protocol):
    name: str  # what the record's protocol names as its clock
    host_beside: bool  # whether elapsed_ns is another clock than the host's, so host_elapsed_ns is recorded too

    def now_ns(self) -> int:
        """Host wall time in nanoseconds from an arbitrary origin, monotonic."""

    def cpu_ns(self) -> int:
        """The calling thread's CPU time in nanoseconds."""

    def mark(self) -> object:
        """A point in time, taken when the work issued so far is issued (not necessarily done)."""

    def synchronize(self) -> None:
        """Return once the work issued so far has finished."""

    def elapsed_ns(self, start: object, end: object) -> int:
        """Nanoseconds between two marks on this clock, once synchronize() has returned after `end`."""

    def host_elapsed_ns(self, start: object, end: object) -> int:
        """Nanoseconds between two marks on the host's wall clock."""


class HostClock:
    """The host's clocks: perf_counter_ns and thread_time_ns; the work is done when a call returns."""

    name = "time.perf_counter_ns"
    host_beside = False
    # The builtins themselves, not methods that call them: a one-token step is timed in microseconds.
    now_ns = mark = staticmethod(time.perf_counter_ns)
    cpu_ns = staticmethod(time.thread_time_ns)

    def synchronize(self) -> None:
        """Nothing is queued on the host."""

    @staticmethod
    def elapsed_ns(start: int, end: int) -> int:
        return end - start

    host_elapsed_ns = elapsed_ns

    def __repr__(self) -> str:
        return "HostClock()"


class EventClock:
    """A device stream's clock: each mark records an event (``event()`` makes one with timing enabled, ``record()``
    puts it on the current stream) beside the host's perf_counter_ns; ``synchronize`` waits for the device.
    Built from the two callables, so that its logic runs on a CPU with a fake event (tests/test_gpu_clock.py)."""

    host_beside = True
    cpu_ns = staticmethod(time.thread_time_ns)
    now_ns = staticmethod(time.perf_counter_ns)

    def __init__(self, name: str, event: Callable[[], object], synchronize: Callable[[], None]) -> None:
        self.name, self.event, self.synchronize = name, event, synchronize

    def mark(self) -> tuple[int, object]:
        event = self.event()
        event.record()
        return time.perf_counter_ns(), event

    @staticmethod
    def elapsed_ns(start: tuple[int, object], end: tuple[int, object]) -> int:
        """The events' milliseconds (torch.cuda.Event.elapsed_time) in nanoseconds."""
        return round(start[1].elapsed_time(end[1]) * 1e6)

    @staticmethod
    def host_elapsed_ns(start: tuple[int, object], end: tuple[int, object]) -> int:
        return end[0] - start[0]

    def __repr__(self) -> str:
        return f"EventClock({self.name!r})"


def cuda_clock() -> EventClock:
    import torch

    return EventClock("torch.cuda.Event", lambda: torch.cuda.Event(enable_timing=True), torch.cuda.synchronize)


HOST = HostClock()
CLOCKS: dict[str, Callable[[], Clock]] = {"cpu": lambda: HOST, "cuda": cuda_clock}  # device type -> its clock
_made: dict[str, Clock] = {}


def register_clock(device_type: str, make: Callable[[], Clock]) -> None:
    """The clock a device type's samples and steps are timed on (made once, when first asked for)."""
    CLOCKS[device_type] = make
    _made.pop(device_type, None)


def clock_for(device: object = "cpu") -> Clock:
    """The clock of a device (a torch.device, or its type or name: "cpu", "cuda", "cuda:0")."""
    kind = str(getattr(device, "type", device)).partition(":")[0]
    if kind not in CLOCKS:
        raise ValueError(f"expected a device type with a clock, one of {sorted(CLOCKS)}, got {kind!r}")
    if kind not in _made:
        _made[kind] = CLOCKS[kind]()
    return _made[kind]
