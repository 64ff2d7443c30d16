"""Contention you can produce on any machine: a process that competes with the timed thread.

    python scripts/antagonist.py busy --cpu 0 --duty 0.25 [--period-ms 10]
    python scripts/antagonist.py memory --cpu 1 [--mib 256] [--duty 1.0]

`busy` spins on one CPU for `duty` of every period and sleeps the rest: pinned to the CPU the
benchmark is pinned to (`kvbench run --cpu 0`), the timed thread waits for its CPU about that
share of the time, as when a neighbour shares a core. `memory` streams copies of a buffer far
larger than the last-level cache: from another core it competes for memory bandwidth and the
shared cache, which no scheduler counter shows. It runs until killed (SIGTERM or SIGINT) or for
`--seconds`; scripts/contention_study.py and scripts/reproducibility.py start and stop it around
their runs (`contended`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# condition -> the antagonist's arguments (None: nothing else started); the run is pinned to CPU 0
CONDITIONS = {"quiet": None, "busy-25": ["busy", "--cpu", "0", "--duty", "0.25"],
              "busy-50": ["busy", "--cpu", "0", "--duty", "0.5"],
              "memory": ["memory", "--cpu", "1", "--duty", "1.0", "--mib", "256"]}


@contextlib.contextmanager
def contended(condition: str):
    """The condition's antagonist running for the length of the block (nothing for "quiet")."""
    if CONDITIONS[condition] is None:
        yield
        return
    antagonist = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *CONDITIONS[condition]])
    time.sleep(0.5)  # let it settle into its period
    try:
        yield
    finally:
        antagonist.terminate()
        antagonist.wait()


def busy(period: float, duty: float, deadline: float) -> None:
    while time.monotonic() < deadline:
        start = time.monotonic()
        while time.monotonic() - start < duty * period:
            pass
        rest = period - (time.monotonic() - start)
        if rest > 0:
            time.sleep(rest)


def memory(mib: int, period: float, duty: float, deadline: float) -> None:
    source = np.ones(mib << 18, dtype=np.float32)  # mib MiB
    target = np.empty_like(source)
    while time.monotonic() < deadline:
        start = time.monotonic()
        while time.monotonic() - start < duty * period:
            np.copyto(target, source)
        rest = period - (time.monotonic() - start)
        if rest > 0:
            time.sleep(rest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("busy", "memory"))
    parser.add_argument("--cpu", type=int, help="pin to this CPU (default: wherever the scheduler puts it)")
    parser.add_argument("--duty", type=float, default=0.25, help="share of each period spent working")
    parser.add_argument("--period-ms", type=float, default=10.0)
    parser.add_argument("--mib", type=int, default=256, help="memory: buffer size")
    parser.add_argument("--seconds", type=float, default=float("inf"), help="stop after this long")
    args = parser.parse_args(argv)
    if not 0 < args.duty <= 1:
        parser.error(f"--duty must be in (0, 1], got {args.duty}")
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    deadline = time.monotonic() + args.seconds
    period = args.period_ms / 1000
    try:
        if args.kind == "busy":
            busy(period, args.duty, deadline)
        else:
            memory(args.mib, period, args.duty, deadline)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
