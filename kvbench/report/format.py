"""Formatting shared by every layout: numbers, bytes, checks, escaping, markdown tables, consoles.

The bottom of the report package: it imports nothing else of kvbench's, so every
renderer, the comparison and the CLI format a value the same way.
"""

from __future__ import annotations

import html
import io
import math
import os
import unicodedata

from markupsafe import Markup
from rich.console import Console
from rich.markup import escape as escape_rich_markup

__all__ = ["BEGIN_MARKER", "END_MARKER", "Html", "as_sentence", "capitalised", "check_text", "check_word", "escape_html",
           "escape_markdown", "format_bytes", "interval_name", "markdown_table", "ms", "plain", "ratio", "ratio_text",
           "render_plain", "rich_escape", "seconds_unit", "splice", "stdout_console", "visible"]


INTERVAL_NAMES = {"rerun": "rerun interval", "confidence": "confidence interval",
                  "within": "within-run confidence interval", "percentile": "percentile bootstrap interval"}


def interval_name(interval: str, confidence: float = 0.95) -> str:
    """An interval method a record names (kvbench.measure.stats.INTERVALS, or a schema-1 record's percentile
    bootstrap) in docs/statistics.md's words, at its level: every caption and header that names an interval takes
    it from here."""
    kind = interval.split()[0] if interval else ""
    return f"{confidence:.0%} {INTERVAL_NAMES.get(kind, interval)}"


def format_bytes(count: int | float | None) -> str:
    if count is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:,.0f} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def ms(seconds: float) -> str:
    """Milliseconds with three significant figures or more."""
    value = seconds * 1e3
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 10 else f"{value:,.1f}"


UNITS = ((1.0, "s"), (1e-3, "ms"), (0.0, "µs"))  # a time's unit: the largest its values reach


def plain(value: float, figures: int = 3) -> str:
    """A number with at least `figures` significant digits, never in scientific notation (1920, not 1.92e+03)."""
    size = abs(value)
    decimals = 0 if size >= 10 ** (figures - 1) else max(0, figures - 1 - math.floor(math.log10(size))) if size else 0
    return f"{value:.{min(decimals, 6)}f}"


def seconds_unit(values) -> tuple[float, str]:
    """The scale and unit (s, ms or µs) the largest of `values` reads best in, for all of them: every table and
    plot axis that shows times in one unit takes it from here."""
    largest = max((abs(value) for value in values), default=0.0)
    limit, unit = next((limit, unit) for limit, unit in UNITS if largest >= limit)
    return {"s": 1.0, "ms": 1e3, "µs": 1e6}[unit], unit


def ratio(value: float) -> str:
    return f"{value:.2f}"


def ratio_text(entry: dict | None, newline: str = "\n") -> str:
    """A ratio of medians with its interval (an entry's ratio, low and high), the interval under it where `newline`
    breaks the line (a terminal's or an HTML cell) and beside it where it is a space; "-" without one."""
    return "-" if not entry else f"{entry['ratio']:.2f}x{newline}[{entry['low']:.2f}, {entry['high']:.2f}]"


def check_text(check: dict | None) -> str:
    """One equivalence check in words: the largest difference, or where and how it failed."""
    if check is None:
        return "not checked"
    if check.get("error"):
        return f"FAILED: {check['error']}"
    if check.get("reference_non_finite"):  # the yardstick itself is broken: nothing was judged against it
        return (f"FAILED reference not finite ({check['reference_non_finite']} full-prefix logits) "
                f"@ {check.get('first_reference_non_finite')}")
    if check.get("exact", True) is False:  # a lossy kind is never "ok": its drift, against its own limits
        drift = f"drift KL {check['kl_mean']:.1e}, top-1 {check['top1_agreement']:.1%}, |Δ| {check['max_abs_diff']:.1e}"
        return drift if check["passed"] else f"FAILED {drift} (limits {limits_text(check['limits'])})"
    if check["passed"]:
        return f"ok {check['max_abs_diff']:.1e}"
    if check.get("non_finite"):
        return f"FAILED {check['non_finite']} non-finite @ {check['first_divergent_position']}"
    return f"FAILED {check['max_abs_diff']:.1e} @ {check['first_divergent_position']}"


def check_word(check: dict | None) -> str:
    """The equivalence check in one word, for a narrow table (check_text has its numbers)."""
    if check is None:
        return "unchecked"
    if not check["passed"]:
        return "FAILED"
    return "drift ok" if check.get("exact", True) is False else "exact"


def limits_text(limits: dict) -> str:
    names = {"max_abs_diff": "|Δ| ≤", "kl_mean": "KL mean ≤", "kl_max": "KL max ≤", "top1_agreement": "top-1 ≥"}
    return ", ".join(f"{names.get(name, name)} {value:g}" for name, value in limits.items())


LOWER_CASE_NAMES = ("kvbench", "asv", "llama.cpp", "transformers", "torch")  # names written in lower case


def capitalised(text: str) -> str:
    """A phrase (as the terminal prints it) as a heading: its first letter upper case, unless it opens with a
    name that is written in lower case (kvbench, transformers, ...)."""
    if text.startswith(LOWER_CASE_NAMES) or text[:1] in ("`", "-"):
        return text
    return text[:1].upper() + text[1:]


def as_sentence(text: str) -> str:
    """A phrase (as the terminal prints it) as a sentence: capitalised, with a full stop."""
    return capitalised(text) + "."


def visible(text: object) -> str:
    """Control characters from a record (an ESC that would clear a terminal, a bell) written
    as escapes, so a record can never drive the terminal it is shown on. Newlines and tabs stay."""
    return "".join(char if char in "\n\t" or unicodedata.category(char) != "Cc" else repr(char)[1:-1]
                   for char in str(text))


def rich_escape(text: object) -> str:
    """Text from a record for rich: no markup interpreted, no control character sent."""
    return escape_rich_markup(visible(text))


def escape_markdown(text: object) -> str:
    """Text from a record (a mode name, a path) as literal markdown: no markup, no HTML.

    Table pipes are escaped by markdown_table, for every cell alike.
    """
    text = visible(text).replace("\\", "\\\\")
    for char in "*_`[]#!~":
        text = text.replace(char, "\\" + char)
    return html.escape(text, quote=False).replace("\n", " ")


def escape_html(text: object) -> str:
    return html.escape(visible(text), quote=True)


class Html(Markup):
    """Markup that escapes everything else: a str formatted into it, joined with it or added to it is
    escaped (control characters shown as escapes, as escape_html does). Every HTML page kvbench writes is
    built of it, so text from a record or a file cannot become markup."""

    __slots__ = ()

    @classmethod
    def escape(cls, text: object) -> "Html":
        return cls(text.__html__()) if hasattr(text, "__html__") else cls(escape_html(text))


def markdown_table(header: tuple[str, ...] | list[str], rows: list[list[str]],
                   left: tuple[str, ...] = ("mode", "equivalence", "marks")) -> list[str]:
    """GitHub table lines; cells are markdown already (escape plain text with escape_markdown)."""
    align = ["---" if name in left else "--:" for name in header]
    # a header's pipe too ("max |Δ|"): unescaped, it split the header into more cells than the rows have
    lines = ["| " + " | ".join(name.replace("|", "\\|") for name in header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines


def stdout_console(wide: bool = False) -> Console:
    """The console for stdout: the terminal's width (or $COLUMNS); piped output (CI logs, files), which
    would otherwise be cut to 80 columns, 200 unless $COLUMNS says; `wide`: wide enough for every column."""
    console = Console()
    if wide:
        return Console(width=max(console.width, 400))
    if console.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return console
    return Console(width=200)


def render_plain(renderables, width: int = 150) -> str:
    """rich renderables as plain text (no colour codes), for files and pipes."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, force_terminal=False, highlight=False)
    for item in renderables:
        console.print(item)
    return buffer.getvalue()


BEGIN_MARKER = "<!-- kvbench report: begin (generated by `make report`; do not edit) -->"
END_MARKER = "<!-- kvbench report: end -->"


def splice(document: str, block: str, source: str, begin: str = BEGIN_MARKER, end: str = END_MARKER) -> str:
    """Replace what lies between the `begin` and `end` markers in `document` with `block`."""
    begins, ends = document.count(begin), document.count(end)
    if begins != 1 or ends != 1:
        raise ValueError(f"{source}: expected the markers {begin!r} and {end!r} once each, "
                         f"found {begins} and {ends}")
    if document.index(end) < document.index(begin):
        raise ValueError(f"{source}: the end marker {end!r} comes before the begin marker {begin!r}")
    head, rest = document.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{block.rstrip()}\n{end}{tail}"
