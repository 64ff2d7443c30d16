"""The tables' columns: a name, an alignment, a text and a style per row, defined once.

A column's ``text`` is plain text (``from_record`` when it carries a record's own strings,
which layouts escape); its ``style`` names what the cell means ("failed",
"invalid", "noisy", "marks"), and each renderer turns that into its own markup (rich
styles, markdown emphasis, CSS classes). The layouts differ only in which columns they
list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kvbench.report.format import check_text, format_bytes, ms, ratio
from kvbench.report.model import MARKS, Profile, Row
from kvbench.stats import PowerFit


@dataclass(frozen=True)
class Column:
    name: str
    text: Callable[[Row], str]
    left: bool = False  # alignment: numbers right, words left
    style: Callable[[Row], str | None] = lambda row: None
    from_record: bool = False  # the text carries a record's own strings: layouts must escape it


def speedup_text(row: Row) -> str:
    if row.is_baseline:
        return "baseline"
    if row.speedup is None:
        return "-"
    text = f"{ratio(row.speedup.ratio)}x"
    return f"({text} invalid)" if row.invalid_speedup else text


def interval_text(row: Row) -> str:
    if row.speedup is None:
        return ""
    return f"[{ratio(row.speedup.low)}, {ratio(row.speedup.high)}]"


def speedup_with_interval(row: Row) -> str:
    """The terminal's one column for both: an invalid speedup has no interval worth printing."""
    if row.invalid_speedup:
        return speedup_text(row)
    return f"{speedup_text(row)} {interval_text(row)}".strip()


def repetitions_text(row: Row) -> str:
    return f"{row.samples}" if row.samples == row.planned else f"{row.samples}/{row.planned}"


def bytes_pair(row: Row) -> str:
    """Retained bytes, or "retained/reserved" in one unit when the cache allocated more."""
    if row.memory is None:
        return "-"
    kept, reserved = format_bytes(row.memory["measured_bytes"]), format_bytes(row.memory["reserved_bytes"])
    if kept == reserved:
        return kept
    (kept_number, kept_unit), reserved_unit = kept.split(" "), reserved.split(" ")[1]
    return f"{kept_number}/{reserved}" if kept_unit == reserved_unit else f"{kept}/{reserved}"


def memory_bytes(key: str) -> Callable[[Row], str]:
    return lambda row: format_bytes(row.memory and row.memory[key])


def marks_text(row: Row) -> str:
    return " ".join(MARKS[name][0] for name in row.marks)


def _check_style(row: Row) -> str | None:
    if row.check is None:
        return "unchecked"
    return "failed" if row.failed else None


def _invalid(row: Row) -> str | None:
    return "invalid" if row.invalid_speedup else None


def _noisy(row: Row) -> str | None:
    return "noisy" if "noisy" in row.marks else None


LENGTH = Column("length", lambda row: str(row.length))
MODE = Column("mode", lambda row: row.mode, left=True, from_record=True)
EQUIVALENCE = Column("equivalence", lambda row: check_text(row.check), left=True, style=_check_style,
                     from_record=True)
MARKS_COLUMN = Column("marks", marks_text, left=True, style=lambda row: "marks")

N = Column("n", repetitions_text)
MEDIAN = Column("median ms", lambda row: ms(row.median))
QUARTILES = Column("q1–q3 ms", lambda row: f"{ms(row.q1)}–{ms(row.q3)}")


def spread_column(name: str) -> Column:
    return Column(name, lambda row: f"{row.spread:.0%}", style=_noisy)


def per_token_column(name: str) -> Column:
    return Column(name, lambda row: f"{row.per_token * 1e6:.1f}")


# kvbench report (markdown and HTML): every number in its own column.
TABLE_COLUMNS = (
    LENGTH, MODE, N, MEDIAN, QUARTILES, spread_column("IQR/med"), per_token_column("µs/token"),
    Column("speedup", speedup_text, style=_invalid), Column("95% CI", interval_text, style=_invalid),
    Column("KV bytes", memory_bytes("measured_bytes")), Column("reserved", memory_bytes("reserved_bytes")),
    EQUIVALENCE, MARKS_COLUMN,
)

# kvbench report in a terminal: speedup and CI, retained and reserved bytes folded to fit 120 columns.
TEXT_COLUMNS = (
    LENGTH, MODE, N, MEDIAN, QUARTILES, spread_column("IQR%"), per_token_column("µs/tok"),
    Column("speedup [95% CI]", speedup_with_interval, style=_invalid), Column("KV bytes", bytes_pair),
    EQUIVALENCE, Column("", marks_text, left=True, style=lambda row: "marks"),
)

# kvbench run and kvbench show: the quick table.
QUICK_COLUMNS = (
    LENGTH, MODE, Column("median ms", lambda row: f"{row.median * 1e3:.2f}"),
    Column("IQR %", lambda row: f"{row.spread * 100:.1f}"), per_token_column("us/token"),
    Column("speedup", speedup_text, style=_invalid), Column("KV bytes", memory_bytes("measured_bytes")),
    Column("reserved", memory_bytes("reserved_bytes")), EQUIVALENCE,
)

FIT_COLUMNS = ("mode", "b", "± SE", "95% CI of b", "a (s)", "R²", "b, two longest")


def fit_cells(fit: PowerFit | None) -> list[str]:
    """b, its standard error, the CI on b, a, R^2, and the slope between the two longest lengths."""
    if fit is None:
        return ["-", "", "", "", "", ""]
    if fit.b_stderr is None:
        return [f"{fit.b:.2f}", "n/a", "n/a (2 lengths)", f"{fit.a:.3g}", "", f"{fit.tail_b:.2f}"]
    return [f"{fit.b:.2f}", f"{fit.b_stderr:.2f}", f"[{fit.b_low:.2f}, {fit.b_high:.2f}]",
            f"{fit.a:.3g}", f"{fit.r_squared:.3f}", f"{fit.tail_b:.2f}"]


def profile_sentences(profile: Profile, baseline: str) -> list[str]:
    lines = [f"per-step profile of one loop at length {profile.length} "
             f"(running median over {profile.window} steps):"]
    if not profile.crossovers:
        lines.append(f"  no {baseline!r} profile to compare against: no crossover")
    for mode, step in profile.crossovers.items():
        last_full, last_mine = profile.smoothed[baseline][-1], profile.smoothed[mode][-1]
        tail = (f"last step {last_full * 1e6:,.0f} µs {baseline} vs {last_mine * 1e6:,.0f} µs {mode} "
                f"({profile.final_speedups[mode]:.1f}x)")
        if step is None:
            lines.append(f"  {mode}: caching does not pay within {profile.length} steps; {tail}")
        else:
            lines.append(f"  {mode}: cheaper than {baseline} from step {step} on; {tail}")
    return lines
