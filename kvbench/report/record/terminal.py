"""Terminal layouts (rich) of one record: the quick table of `run`/`show`, and the report.

Every text that comes from a record or a file name is escaped before rich sees it, so
a mode name cannot smuggle markup into the terminal.
"""

from __future__ import annotations

import io

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvbench.report.format import RERUN_INTERVAL, as_sentence, render_plain, rich_escape
from kvbench.report.record import columns
from kvbench.report.record.latency import (
    CONTEXT_COLUMNS,
    context_cells,
    LATENCY_COLUMNS,
    LATENCY_COMPACT,
    LIMIT_COLUMNS,
    peer_columns,
    PEER_NOTE,
    latency_cells,
    latency_compact_cells,
    limit_cells,
    peer_cells,
)
from kvbench.report.record.model import MARKS, Report, Row, environment_line
from kvbench.report.record.precision import CLOCK_TEXTS, clock_note, length_label, stop_text
from kvbench.report.record.quality import QUALITY_COLUMNS, quality_cells

STYLES = {"failed": "bold red", "invalid": "red", "noisy": "yellow", "unchecked": "yellow"}
MARK_STYLES = {"failed": "bold red", "noisy": "yellow", "partial": "magenta", "trend": "yellow", "disturbed": "yellow"}


def _cell(column: columns.Column, row: Row) -> str:
    style = column.style(row)
    if style == "marks":
        return " ".join(f"[{MARK_STYLES[m]}]{MARKS[m][0]}[/]" for m in row.marks)
    text = rich_escape(column.text(row))
    return f"[{STYLES[style]}]{text}[/]" if style in STYLES else text


WIDE = 132  # below this many columns the tables drop what --wide shows


def natural_width(table: Table) -> int:
    """The columns a table takes when nothing is cut."""
    return Console(width=100_000, file=io.StringIO()).measure(table).maximum


def rows_table(rows: list[Row], shown: tuple[columns.Column, ...], **options) -> Table:
    """One line per row; a length is printed only where it changes. No value is cut or wrapped."""
    table = Table(**options)
    for column in shown:
        table.add_column(column.name, justify="left" if column.left else "right", no_wrap=True)
    previous = None
    for row in rows:
        cells = [_cell(column, row) for column in shown]
        if row.length == previous:
            cells[0] = ""
        table.add_row(*cells, end_section=False)
        previous = row.length
    return table


def timing_tables(report: Report, width: int, wide: bool, **options) -> list[Table]:
    """The timing table, one per clock (each header names it): the widest layout that fits (with `wide`, the
    wide one), the compact one dropping the gate, then the per-workload time, until the table fits."""
    out = []
    clocks = report.clocks()
    for clock in clocks:
        rows = [row for row in report.rows if row.clock == clock]
        if len(clocks) > 1:
            lengths = ", ".join(str(n) for n in dict.fromkeys(r.length for r in rows))
            options.update(title=f"length {lengths}: times and speedups on {CLOCK_TEXTS[clock]}", title_justify="left")
        for layout in columns.LAYOUTS[:1] if wide else columns.LAYOUTS:
            shown = list(columns.row_columns(report, clock, layout))
            table = rows_table(rows, tuple(shown), **options)
            if natural_width(table) <= width:
                break
        for dropped in (columns.GATE, shown[2]) if not wide else ():
            if natural_width(table) <= width:
                break
            shown.remove(dropped)
            table = rows_table(rows, tuple(shown), **options)
        if layout != "wide":
            table.caption, table.caption_justify = "--wide shows every column", "left"
        out.append(table)
    return out


def quick_table(report: Report, width: int = 200, wide: bool = False) -> Table:
    """`kvbench run` and `kvbench show`: timings, speedups, bytes and checks at a glance (the first clock's)."""
    return next(item for item in quick_tables(report, width, wide) if isinstance(item, Table))


def quick_tables(report: Report, width: int, wide: bool) -> list:
    """The timing tables under the run's title (its own line when each clock has a table)."""
    title = rich_escape(report.title)
    if not report.complete:
        title += " [bold yellow](INCOMPLETE: interrupted run)[/]"
    tables = timing_tables(report, width, wide, title=title, title_justify="left")
    if len(tables) > 1:
        return [title, *tables]
    return tables


def plain_table(title: str, names: tuple[str, ...], left: tuple[str, ...], rows: list[list[str]],
                width: int | None = None, drop: tuple[str, ...] = ()) -> Table:
    """A table of already formatted texts (latency, limits, peers, sampling, ...): where it is wider than
    `width`, the columns named in `drop` go, in that order, until it fits; its caption names them."""
    shown, hidden = list(names), []
    while True:
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for name in shown:
            table.add_column(name, justify="left" if name in left else "right", no_wrap=True)
        for cells in rows:
            table.add_row(*(rich_escape(text) for name, text in zip(names, cells) if name in shown))
        candidates = [name for name in drop if name in shown]
        if width is None or not candidates or natural_width(table) <= width:
            break
        shown.remove(candidates[0])
        hidden.append(candidates[0])
    if hidden:
        table.caption, table.caption_justify = f"not shown at this width: {', '.join(hidden)} (--wide)", "left"
    return table


def latency_table(report: Report, width: int | None = None, wide: bool = True) -> Table:
    title = f"request: {report.latency[0].prompt} prompt tokens, {report.latency[0].generate} generated · wall time"
    compact = not wide and width is not None and width < WIDE
    names, cells = (LATENCY_COMPACT, latency_compact_cells) if compact else (LATENCY_COLUMNS, latency_cells)
    return plain_table(title, (*names, "marks"), ("mode", "equivalence", "gate", "marks"),
                       [[*cells(row), columns.marks_of(row)] for row in report.latency], None if wide else width,
                       ("n", "tokens/s", "E2E ms", "TTFT ×", "ITL p50 / p90 / p99 ms", "TPOT ×", "ITL p50/p99 ms"))


def limits_table(report: Report, width: int | None = None) -> Table:
    return plain_table("against the machine's limits", LIMIT_COLUMNS, ("mode", "step"),
                       [limit_cells(row) for row in report.limits], width,
                       ("reads", "GFLOP/s", "matmul floor ms", "GB/s", "% of matmul"))


def contexts_table(report: Report, width: int | None = None) -> Table:
    return plain_table("steps at a context: the steady-state step and the first after the prefill",
                       (*CONTEXT_COLUMNS, "marks"), ("mode", "equivalence", "marks"),
                       [[*context_cells(row), columns.marks_of(row)] for row in report.context_steps], width,
                       ("n", "equivalence", "first / step", "first step ms [95% interval]"))


def peers_table(report: Report, width: int | None = None) -> Table:
    return plain_table("against transformers' caches, same weights, same rotations",
                       peer_columns(bool(report.context_steps)),
                       ("kvbench", "transformers"), [peer_cells(row) for row in report.peers], width,
                       ("pairs", RERUN_INTERVAL))


def workload_renderables(report: Report, width: int | None) -> list:
    """What a request or contexts run shows before (a request: instead of) the timing table."""
    out: list = []
    if report.latency:
        out += [latency_table(report, width, wide=width is None), rich_escape(report.latency_note)]
    if report.context_steps:
        out += [contexts_table(report, width), rich_escape(report.context_note)]
    return out


def quick_renderables(report: Report, width: int = 200, wide: bool = False, verdict: bool = True) -> list:
    """The quick table (a request run: its latency table instead), then how each length was sampled, how
    noisy the machine was and the run's verdict (`verdict`: `kvbench run` prints it last, after the path)."""
    fit = None if wide else width
    out = workload_renderables(report, fit)
    if report.kind != "request":
        out += quick_tables(report, width, wide)
    out += quality_renderables(report, fit)
    if report.peers:
        out += [peers_table(report, fit), rich_escape(PEER_NOTE)]
    if report.sampling:
        out.append("sampled: " + "; ".join(
            f"{length_label(report.workload, row.length)}: {row.rotations} rotations, {stop_text(row)}"
            + (f" (A/A ±{row.control.half_width:.1%})" if row.control else "")
            + (f", {CLOCK_TEXTS.get(row.clock, row.clock)}" if row.clock != "wall" else "")
            for row in report.sampling))
    out += legend_renderables(report)
    if report.sampling and clock_note(report.sampling) and report.kind != "request":
        out.append(rich_escape(clock_note(report.sampling)))
    if report.noise is not None:
        out.append(rich_escape(columns.noise_sentence(report.noise)))
    if verdict and report.verdict:
        out.append(verdict_line(report))
    return out


def verdict_line(report: Report) -> str:
    return f"[bold]{rich_escape(as_sentence(report.verdict))}[/]"


def quality_renderables(report: Report, width: int | None = None) -> list:
    """What each mode did to a real model's text: the table, then each mode's greedy sample."""
    if not report.quality:
        return []
    out: list = [plain_table("quality on text", QUALITY_COLUMNS, ("mode", "greedy departs at"),
                             [quality_cells(row) for row in report.quality], width,
                             ("beyond window (full's)", "KL", "greedy departs at", "top-1")),
                 rich_escape(as_sentence(report.quality_note))]
    for row in report.quality:
        out.append(Text(f"  {row.label}: {row.sample!r}"))
    return out


def legend_renderables(report: Report) -> list:
    """The legends of what the tables show: the speedup column's (not a request's, which has none), the marks."""
    out: list = [f"  {MARKS[name][0]} {MARKS[name][1]}" for name in report.marks_used()]
    if report.kind != "request":
        out.append(rich_escape(columns.speedup_legend(report)))
    return out


def sampling_table(report: Report, width: int | None = None) -> Table:
    return plain_table("sampling: rotations per length, why they stopped, the A/A noise floor",
                       columns.sampling_columns(report), ("stopped",),
                       [columns.sampling_cells(row, report.workload) for row in report.sampling], width,
                       ("A/A ratio", columns.SAMPLING_COLUMNS[5], "rotations"))


def report_renderables(report: Report, width: int = 150, wide: bool = False) -> list:
    fit = None if wide else width
    out: list = []
    status = "" if report.complete else " [bold yellow](INCOMPLETE: interrupted run)[/]"
    out.append(f"[bold]{rich_escape(report.title)}[/]{status}")
    out.append(f"record {rich_escape(report.source)} · created {rich_escape(report.created_utc)}")
    out.append(rich_escape(environment_line(report.environment)))
    if report.verdict:
        out.append(verdict_line(report))
    if report.model_note:
        out.append(rich_escape(as_sentence(report.model_note)))
    out += quality_renderables(report, fit)
    out += workload_renderables(report, fit)
    if report.limits:
        out += [limits_table(report, fit), rich_escape(report.limits_note)]
    if report.peers:
        out += [peers_table(report, fit), rich_escape(PEER_NOTE)]
    if report.kind != "request":
        tables = timing_tables(report, width, wide, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        out += tables
        shown = {column.header for table in tables for column in table.columns}
        if "KV bytes" in shown and any(row.memory and row.memory["reserved_bytes"] != row.memory["measured_bytes"]
                                       for row in report.rows):
            out.append("  KV bytes a/b: a retained, b reserved (allocated) by the cache")
    out += legend_renderables(report)
    for note in report.notes:
        out.append(f"[yellow]{rich_escape(note)}[/]")
    if report.sampling:
        out += [sampling_table(report, fit), rich_escape(columns.sampling_sentence(report))]
    if report.noise is not None:
        out.append(rich_escape(columns.noise_sentence(report.noise)))
    if report.tradeoffs:
        out += [plain_table("trade-off: bytes, drift, time", columns.TRADEOFF_COLUMNS, ("mode", "judged"),
                            [columns.tradeoff_cells(entry) for entry in report.tradeoffs], fit,
                            ("of float", "KL mean", "max |Δ|", "µs/token")), rich_escape(columns.TRADEOFF_SENTENCE)]
    if report.fits:
        out.append(plain_table("scaling fit: time ≈ a · T^b (least squares on log-log medians)", columns.FIT_COLUMNS,
                               ("mode",), [[mode, *columns.fit_cells(fit)] for mode, fit in report.fits.items()],
                               fit, ("a (s)", "± SE", "b, two longest", "R²")))
    if report.profile is not None:
        out.extend(Text(line) for line in columns.profile_sentences(report.profile, report.baseline))
    elif report.kind == "loop":
        out.append("no per-step profile in this record (kvbench run --per-step LENGTH records one)")
    return out


def render_report(report: Report, width: int = 150, wide: bool = True) -> str:
    """The text report for a file: no terminal to fit, so every column (`wide`), each table whole."""
    renderables = report_renderables(report, width, wide)
    tables = [natural_width(item) for item in renderables if isinstance(item, Table)]
    return render_plain(renderables, max([width, *tables]) if wide else width)
