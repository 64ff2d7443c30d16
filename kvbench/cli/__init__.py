"""kvbench's command line: `build_parser` builds it, `main` runs it, one `cmd_*` per subcommand.

The package owns what is about the command line: options and their conflicts
(``options``), paths and exit codes; each command turns arguments into typed values and
calls the library (``run`` for `kvbench run`, ``commands`` for the others). Every error a
user can cause ends the same way: one line on stderr, exit status 2.
"""

from __future__ import annotations

import sys

from kvbench.cli.commands import (
    cmd_asv_machine,
    cmd_asv_show,
    cmd_budget,
    cmd_compare,
    cmd_env,
    cmd_report,
    cmd_show,
)
from kvbench.cli.options import CliError, build_parser
from kvbench.cli.run import cmd_run
from kvbench.files import OutputExistsError

__all__ = ["COMMANDS", "CliError", "build_parser", "main"]

COMMANDS = {"run": cmd_run, "show": cmd_show, "report": cmd_report, "compare": cmd_compare, "env": cmd_env,
            "budget": cmd_budget, "asv-machine": cmd_asv_machine, "asv-show": cmd_asv_show}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        args.argv = [str(a) for a in (sys.argv[1:] if argv is None else argv)]  # recorded with each run
        return COMMANDS[args.command](args)
    except OutputExistsError as error:
        print(f"kvbench: error: {first_line(error)}; pass --force to overwrite it", file=sys.stderr)
        return 2
    except (CliError, ValueError, OSError) as error:  # RecordError is a ValueError
        print(f"kvbench: error: {first_line(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # run keeps completed repetitions itself; elsewhere nothing is half-written
        print("kvbench: interrupted; nothing was written", file=sys.stderr)
        return 130


def first_line(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__
