"""kvbench's command line: `build_parser` builds it, `main` runs it, one `cmd_*` per subcommand.

The package owns what is about the command line: options and their conflicts
(``options``), paths and exit codes; each command turns arguments into typed values and
calls the library (``run`` for `kvbench run`, ``commands`` for the others). Every error a
user can cause ends the same way: one line on stderr, exit status 2.
"""

from __future__ import annotations

import os
import sys
from signal import SIGINT

from kvbench import files
from kvbench.cli.commands import (
    cmd_asv_machine,
    cmd_asv_show,
    cmd_budget,
    cmd_env,
    cmd_export,
    cmd_history,
)
from kvbench.cli.options import build_parser
from kvbench.cli.parser import CliError
from kvbench.cli.run import cmd_run
from kvbench.cli.serve import cmd_compare_any, cmd_report_any, cmd_show_any
from kvbench.files import OutputExistsError
from kvbench.report.format import visible
from kvbench.measure.signals import Interrupted, SignalGuard

__all__ = ["COMMANDS", "CliError", "build_parser", "main"]

COMMANDS = {"run": cmd_run, "show": cmd_show_any, "report": cmd_report_any, "compare": cmd_compare_any, "export": cmd_export,
            "history": cmd_history, "env": cmd_env, "budget": cmd_budget, "asv-machine": cmd_asv_machine, "asv-show": cmd_asv_show}


class StdoutError(OSError):
    """Standard output cannot be written (a full disk, a closed pipe)."""


class GuardedStdout:
    """sys.stdout for the length of a command: a failed write becomes a StdoutError, told apart
    from the errors of files kvbench writes, and reported once instead of at interpreter exit."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError as error:
            raise StdoutError(error.errno, error.strerror) from None

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as error:
            raise StdoutError(error.errno, error.strerror) from None

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def main(argv: list[str] | None = None) -> int:
    real, sys.stdout = sys.stdout, GuardedStdout(sys.stdout)
    try:
        status = run_command(argv)
        sys.stdout.flush()
        return status
    except StdoutError as error:
        real = open(os.devnull, "w")  # nothing more can reach it; interpreter exit must not try again
        written = written_files()
        return fail(f"cannot write to standard output: {error.strerror or error}"
                    + (f"; {written} was written" if written else ""))
    finally:
        sys.stdout = real


def run_command(argv: list[str] | None) -> int:
    with SignalGuard() as signals:
        try:
            args = build_parser().parse_args(argv)
            args.argv = [str(a) for a in (sys.argv[1:] if argv is None else argv)]  # recorded with each run
            args.signals = signals
            return signals.exit_status(COMMANDS[args.command](args))
        except OutputExistsError as error:
            return fail(f"{first_line(error)}; pass --force to overwrite it")
        except StdoutError:
            raise
        except (CliError, ValueError, OSError) as error:  # RecordError is a ValueError
            return fail(first_line(error))
        except MemoryError:
            return fail("out of memory: the machine could not allocate what the command needed")
        except RuntimeError as error:
            if "allocate" not in str(error) and "bad_alloc" not in str(error):  # the allocator failing is the user's size
                raise
            return fail(f"out of memory: {first_line(error)}")
        except KeyboardInterrupt as interrupt:  # the first SIGINT or SIGTERM (Interrupted), or a bare Ctrl-C
            signal = interrupt if isinstance(interrupt, Interrupted) else Interrupted(SIGINT)
            written = written_files()
            print(f"kvbench: interrupted by {signal.name}; "
                  + (f"wrote {written} before it" if written else "nothing was written"), file=sys.stderr)
            return 128 + signal.signum


def written_files() -> str:
    """The files this command has written so far, for a message about what is on disk."""
    return ", ".join(str(path) for path in files.WRITTEN)


def fail(message: str) -> int:
    print(f"kvbench: error: {visible(message)}", file=sys.stderr)  # a message may quote a hostile record
    return 2


def first_line(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__
