"""The clock every timed sample and step reads: one object, so that a device's clock is a new class, not an edit
of every timer.

A timer reads ``now_ns()`` before the work, calls ``synchronize()`` when the work is issued, then reads
``now_ns()`` again: on the host the work is done when the call returns, so synchronize does nothing; a device
that queues work (a GPU stream) must wait for it there, or the sample would time the queueing. ``cpu_ns()`` is
the calling thread's CPU time, which the serving replay stamps beside each token's wall time. Integer
nanoseconds, as perf_counter_ns gives them, so that a sample's seconds are one division from the clock.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["HOST", "Clock", "HostClock"]


class Clock(Protocol):
    name: str  # what the record's protocol names as its clock

    def now_ns(self) -> int:
        """Wall time in nanoseconds from an arbitrary origin, monotonic."""

    def cpu_ns(self) -> int:
        """The calling thread's CPU time in nanoseconds."""

    def synchronize(self) -> None:
        """Return once the work issued so far has finished."""


class HostClock:
    """The host's clocks: perf_counter_ns and thread_time_ns; the work is done when a call returns."""

    name = "time.perf_counter_ns"
    # The builtins themselves, not methods that call them: a one-token step is timed in microseconds.
    now_ns = staticmethod(time.perf_counter_ns)
    cpu_ns = staticmethod(time.thread_time_ns)

    def synchronize(self) -> None:
        """Nothing is queued on the host."""

    def __repr__(self) -> str:
        return "HostClock()"


HOST = HostClock()
