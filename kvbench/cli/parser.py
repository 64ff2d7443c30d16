"""The parser's class and its one error type: argparse's messages as one line, with the closest valid
word named when a user mistyped a choice or an option; `integer`, the one argparse type of a count, and
`finite_float`, of a number."""

from __future__ import annotations

import argparse
import difflib
import math
import re

INT64_MAX = 2**63 - 1  # no tensor dimension or seed is larger
DIGITS = re.compile(r"[0-9]+")  # ASCII digits only: int() would also take "8_0" and "٨"


def integer(lowest: int, highest: int = INT64_MAX):
    """An argparse type: a plain decimal integer in [lowest, highest]."""
    expected = f"an integer >= {lowest}" if highest == INT64_MAX else f"an integer in [{lowest}, {highest}]"

    def parse(text: str) -> int:
        stripped = text.strip()
        negative = stripped.startswith("-") and DIGITS.fullmatch(stripped[1:])
        if not (DIGITS.fullmatch(stripped) or negative):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        value = int(stripped)
        if value < lowest:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        if value > highest:
            raise argparse.ArgumentTypeError(f"expected an integer in [{lowest}, {highest}], got {value}")
        return value

    return parse


DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")  # float() would take "1_1" and "١"


def finite_float(text: str) -> float:
    stripped = text.strip()
    if stripped.lower().lstrip("+-") in ("inf", "infinity", "nan"):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    if not DECIMAL.fullmatch(stripped):
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
    value = float(stripped)
    if not math.isfinite(value):  # 1e400
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


class CliError(Exception):
    """A user error: reported as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints usage too; one line is the rule here
        command = self.prog.removeprefix("kvbench").strip()  # main() says "kvbench: error:" once
        message = with_suggestion(message, self.known_options())
        raise CliError(f"{command}: {message}" if command else message)

    def actions(self) -> list[argparse.Action]:
        """The parser's arguments, --help included."""
        return list(self._actions)  # argparse offers no public list of a parser's options

    def known_options(self) -> list[str]:
        """Every option string of this parser and its subcommands' (the top parser reports an unknown one)."""
        found = set()
        for action in self.actions():
            found.update(action.option_strings)
            if isinstance(action.choices, dict):
                found.update(option for sub in action.choices.values() if isinstance(sub, Parser)
                             for option in sub.known_options())
        return sorted(found)


CHOICE = re.compile(r"argument (?P<option>\S+): invalid choice: '(?P<given>[^']*)' \(choose from (?P<choices>.*)\)")
UNRECOGNIZED = re.compile(r"unrecognized arguments: (?P<given>\S+)")


def did_you_mean(given: str, known: list[str] | tuple[str, ...]) -> str:
    """ "; did you mean 'x'?" for the closest known word, or nothing when none is close."""
    close = difflib.get_close_matches(given, list(known), n=1, cutoff=0.75)
    return f"; did you mean {close[0]!r}?" if close else ""


def with_suggestion(message: str, options: list[str]) -> str:
    """argparse's message for a typo, with the closest valid word named."""
    choice = CHOICE.fullmatch(message)
    if choice:
        choices = re.findall(r"'([^']*)'", choice["choices"])
        return (f"argument {choice['option']}: invalid choice: {choice['given']!r}"
                f"{did_you_mean(choice['given'], choices)} (choose from {', '.join(choices)})")
    unrecognized = UNRECOGNIZED.match(message)
    if unrecognized and unrecognized["given"].startswith("--"):
        return message + did_you_mean(unrecognized["given"], options)
    return message
