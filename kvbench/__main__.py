"""`python -m kvbench` and the `kvbench` script.

Importing the command line imports torch, numpy and scipy, which takes seconds. A
signal in that time must not interrupt an import halfway: a half-imported numpy makes
the next import of it fail in ways no handler can clean up (a RecursionError, "cannot
load module more than once"). So SIGINT and SIGTERM are held until the imports are
done, then obeyed: nothing has been measured or written yet, and the message says so.
"""

import signal
import sys

HELD = (signal.SIGINT, signal.SIGTERM)


def main() -> int:
    received: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: received.append(signum)) for signum in HELD}
    try:
        from kvbench.cli import main as run_cli
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        name = signal.Signals(received[0]).name
        print(f"kvbench: interrupted by {name} while starting; nothing was written", file=sys.stderr)
        return 128 + received[0]
    return run_cli()


if __name__ == "__main__":
    raise SystemExit(main())
