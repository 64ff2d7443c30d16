"""`python -m kvbench` and the `kvbench` script.

Importing the command line imports torch, numpy and scipy, which takes seconds. A
signal in that time must not interrupt an import halfway: a half-imported numpy makes
the next import of it fail in ways no handler can clean up (a RecursionError, "cannot
load module more than once"). So SIGINT and SIGTERM are held until the imports are
done, then obeyed: nothing has been measured or written yet, and the message says so.
"""

import sys

from kvbench.measure.signals import SignalGuard


def main() -> int:
    with SignalGuard() as held, held.deferred():
        from kvbench.cli import main as run_cli
    if held.received:
        print(f"kvbench: interrupted by {held.first.name} while starting; nothing was written", file=sys.stderr)
        return held.exit_status(0)
    return run_cli()


if __name__ == "__main__":
    raise SystemExit(main())
