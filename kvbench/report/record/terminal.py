"""Terminal layouts (rich): the quick table of `run`/`show`, the report, the comparison, the budget.

Every text that comes from a record or a file name is escaped before rich sees it, so
a mode name cannot smuggle markup into the terminal.
"""

from __future__ import annotations

import io

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvbench.report import columns, machines
from kvbench.report.compare import (
    CHECK_COLUMN,
    COMPARE_HEADER,
    FASTER,
    LATENCY_HEADER,
    SLOWER,
    VERDICT_COLUMN,
    WITHIN_NOISE,
    Comparison,
    cell_texts,
    latency_texts,
    summary_line,
)
from kvbench.report.differences import CRITICAL, INFORMATIONAL, NOTABLE
from kvbench.report.format import RERUN_INTERVAL, as_sentence, format_bytes, render_plain, rich_escape
from kvbench.report.latency import (
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
from kvbench.report.model import MARKS, Report, Row, environment_line
from kvbench.report.precision import CLOCK_TEXTS, clock_note, length_label, stop_text
from kvbench.report.quality import QUALITY_COLUMNS, quality_cells

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


RANK_STYLES = {CRITICAL: "bold red", NOTABLE: "yellow", INFORMATIONAL: "dim"}
VERDICT_STYLES = {SLOWER: "bold red", FASTER: "bold green", WITHIN_NOISE: "dim"}


def _differences_table(title: str, diffs) -> Table | str:
    if not diffs:
        return f"{title}: identical"
    critical = sum(d.rank == CRITICAL for d in diffs)
    table = Table(title=f"{title} differences ({critical} critical, {len(diffs)} in all), ranked by how much "
                        "they can move a timing", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("rank", "key", "OLD", "NEW"):
        table.add_column(name, overflow="fold")
    for d in diffs:
        table.add_row(f"[{RANK_STYLES[d.rank]}]{d.rank}[/]", rich_escape(d.key), rich_escape(d.old), rich_escape(d.new))
    return table


def compare_renderables(c: Comparison) -> list:
    out: list = [f"[bold]kvbench compare[/]  OLD {rich_escape(c.old_source)} ({c.old_status})  →  "
                 f"NEW {rich_escape(c.new_source)} ({c.new_status})"]
    out.append(_differences_table("environment", c.environment))
    out.append(_differences_table("run settings", c.config))
    if c.skipped:
        out.append(f"[yellow]skipped (not in both records): {rich_escape(', '.join(c.skipped))}[/]")
    for note in c.notes:
        out.append(f"[yellow]note: {rich_escape(note)}[/]")

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for name in COMPARE_HEADER[:-1]:  # notes go below the table
        table.add_column(name, justify="left" if name in ("mode", "verdict", "max |Δ| old → new") else "right",
                         no_wrap=True)
    previous = None
    for cell in c.cells:
        texts = [rich_escape(t) for t in cell_texts(cell)][:-1]  # notes go below the table
        texts[0] = texts[0] if cell.length != previous else ""
        if cell.verdict in VERDICT_STYLES:
            texts[VERDICT_COLUMN] = f"[{VERDICT_STYLES[cell.verdict]}]{texts[VERDICT_COLUMN]}[/]"
        if cell.new_check is not None and not cell.new_check["passed"]:
            texts[CHECK_COLUMN] = f"[bold red]{texts[CHECK_COLUMN]}[/]"
        table.add_row(*texts)
        previous = cell.length
    out.append(table)
    for cell in c.cells:
        if cell.notes:
            out.append(f"  {rich_escape(cell.mode)} at {cell.length}: " + rich_escape("; ".join(cell.notes)))
    if c.latency:
        latency = Table(title="what a client sees: TTFT and TPOT, NEW / OLD", title_justify="left",
                        box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        for name in LATENCY_HEADER:
            latency.add_column(name, justify="left" if name in ("mode", "figure", "verdict") else "right", no_wrap=True)
        for change in c.latency:
            texts = [rich_escape(t) for t in latency_texts(change)]
            if change.verdict in VERDICT_STYLES:
                texts[-1] = f"[{VERDICT_STYLES[change.verdict]}]{texts[-1]}[/]"
            latency.add_row(*texts)
        out.append(latency)
    out.append(summary_line(c))
    out.append(COMPARE_LEGEND)
    return out


COMPARE_LEGEND = ("time new/old: median seconds NEW / OLD; vs full new/old: OLD speedup / NEW speedup, the cost "
                  "relative to the full-prefix path measured in the same rotations (above 1: NEW is slower); "
                  "95% CI from both runs' intervals; MDE: the smallest change these records detect with 80% power")


def render_comparison(c: Comparison, width: int = 170) -> str:
    return render_plain(compare_renderables(c), width)


def budget_renderables(result) -> list:
    """`kvbench budget`: bytes per token, then how many requests fit in each layout."""
    table = Table(title=f"{result.tokens} tokens per request, {format_bytes(result.kv_memory_bytes)} for KV caches",
                  title_justify="left")
    for name in ("layout", "bytes per request", "wasted per request", "requests that fit"):
        table.add_column(name, justify="left" if name == "layout" else "right")
    exact = "exact (no slack; a sliding layer keeps W)" if result.sliding_layers and not result.quantize else \
        "exact (no slack)"
    table.add_row(exact, format_bytes(result.request_bytes), "0 B", f"{result.exact_requests:,}")
    table.add_row(f"contiguous ({result.max_length} positions)", format_bytes(result.contiguous_request_bytes),
                  format_bytes(result.contiguous_request_bytes - result.request_bytes),
                  f"{result.contiguous_requests:,}")
    if result.paged_request_bytes is not None:
        every = ", every position" if result.sliding_layers else ""
        table.add_row(f"paged ({result.block_size}-position blocks{every})", format_bytes(result.paged_request_bytes),
                      format_bytes(result.paged_waste_bytes), f"{result.paged_requests:,}")
    representation = result.quantize or result.dtype
    out: list = []
    if result.preset is not None:
        out.append(f"{result.preset}: {result.parameters / 1e9:.2f}B parameters, weights {format_bytes(result.weights_bytes)} "
                   f"in {result.dtype} ({result.weights_bytes:,} bytes), taken off {format_bytes(result.memory_bytes)}")
    out.append(f"bytes per token: {result.bytes_per_token:,.0f} ({representation}: {result.assumptions})")
    if result.quantize or result.sliding_layers:
        out.append(f"{result.request_bytes / result.full_precision_bytes:.2f} of the {result.dtype} cache keeping "
                   f"every position ({format_bytes(result.full_precision_bytes)} per request, "
                   f"{result.full_precision_bytes / result.tokens:,.0f} bytes per token)")
    out.append(table)
    out.append("Counts key/value storage" + (" and the weights" if result.preset else "")
               + ": activations and allocator slack need --reserved.")
    return out


def across_renderables(views: list) -> list:
    """`kvbench compare --across-machines`: each cached cell's speedup on every machine."""
    labels, cells, differences = machines.across(views)
    out: list = [f"[bold]kvbench compare --across-machines[/]: {len(views)} records"]
    for index, (label, view) in enumerate(zip(labels, views)):
        out.append(f"  [{index + 1}] {rich_escape(label)}: {rich_escape(view.source)}")
    for index, found in enumerate(differences, start=2):
        if found:
            out.append(f"[yellow]environment of [{index}] against [1]: {rich_escape('; '.join(found))}[/]")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for name in machines.header(labels):
        table.add_column(rich_escape(name), justify="left" if name in ("mode", "intervals") else "right")
    for cell in cells:
        table.add_row(*(rich_escape(text) for text in machines.cell_texts(cell, labels)))
    out += [table, MACHINES_LEGEND]
    return out


MACHINES_LEGEND = ("each speedup is its own run's full-prefix time over the cached time, measured in the same rotations, "
                   "with its 95% rerun interval; raw seconds from different machines are not compared. spread: max / "
                   "min - 1; intervals: overlap when one value lies in all of them (these records cannot tell the "
                   "machines apart), apart when not")
