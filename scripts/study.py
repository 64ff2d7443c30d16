"""What every one-off study in scripts/ shares: its command line's common options, the output
checked before anything is measured, and the record written atomically with the machine beside it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvbench.files import check_output, write_json_atomic
from kvbench.measure import capture
from kvbench.record import utc_now


def study_parser(description: str, output: Path, preset: str | list[str] = "llama-mini") -> argparse.ArgumentParser:
    """A parser with --preset (several, where the default is a list), --output and --force; the study adds
    its own options."""
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("--preset", default=preset, nargs="+" if isinstance(preset, list) else None)
    parser.add_argument("--output", type=Path, default=output)
    parser.add_argument("--force", action="store_true")
    return parser


def parse_study(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The parsed options, with the output checked first, so that a refused file wastes no measuring."""
    args = parser.parse_args(argv)
    check_output(args.output, args.force)
    return args


def save_study(kind: str, args: argparse.Namespace, threads: dict, **fields) -> None:
    """The study's record: its kind, when and how it ran, the threads in effect and the environment."""
    record = {"kind": kind, "created": utc_now(), "command": sys.argv, "threads": threads, "preset": args.preset,
              **fields, "environment": capture.collect_environment()}
    write_json_atomic(record, args.output, args.force)
    print(args.output)
