"""SIGINT and SIGTERM end every command the same way, and never cost what was completed.

The first signal raises :class:`Interrupted` (a KeyboardInterrupt, so the measurement loop
keeps its completed repetitions the way it does for Ctrl-C) wherever the program is.
Every later signal is only counted: a second Ctrl-C or a `timeout` that follows up
cannot interrupt the saving of the record. Inside :meth:`SignalGuard.deferred` even the
first signal is only counted, and the command exits with its status afterwards.
"""

from __future__ import annotations

import contextlib
import signal
import threading

HANDLED = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A signal ended the command; its exit status is 128 + the signal number (130, 143)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class SignalGuard:
    def __init__(self) -> None:
        self.received: list[int] = []
        self._deferring = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is threading.main_thread():  # only the main thread may install handlers
            for signum in HANDLED:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        # Once a signal came, the command is ending with its status: more of them (a storm of
        # Ctrl-C, a follow-up SIGTERM) must not turn that end into a traceback or a kill.
        for signum, handler in self._previous.items():
            signal.signal(signum, signal.SIG_IGN if self.received else handler)

    def _handle(self, signum: int, frame) -> None:
        self.received.append(signum)
        if len(self.received) == 1 and not self._deferring:
            raise Interrupted(signum)

    @contextlib.contextmanager
    def deferred(self):
        """Signals inside only count: what runs here (saving a record) runs to its end."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False

    @property
    def first(self) -> Interrupted | None:
        return Interrupted(self.received[0]) if self.received else None

    def exit_status(self, status: int) -> int:
        """128 + the first signal's number once any arrived, else `status`."""
        return 128 + self.received[0] if self.received else status
