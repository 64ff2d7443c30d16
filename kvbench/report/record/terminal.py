"""Terminal layouts (rich) of one record: the quick table of `run`/`show`, and the report.

Both render kvbench.report.record.sections with one table renderer; what is the terminal's own is
fitting a table to the width (the timing table's layouts, then dropping the columns a section names)
and rich's styles. Every text that comes from a record or a file name is escaped before rich sees
it, so a mode name cannot smuggle markup into the terminal.
"""

from __future__ import annotations

import io

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvbench.report.format import as_sentence, render_plain, rich_escape
from kvbench.report.record import columns
from kvbench.report.record.model import MARKS, Report, environment_line
from kvbench.report.record.precision import CLOCK_TEXTS, clock_note, length_label, stop_text
from kvbench.report.record.sections import (
    Cell,
    Section,
    latency_section,
    legend_section,
    needle_section,
    peers_section,
    quality_section,
    sections,
    timing_section,
    timing_title,
    workload_sections,
)

STYLES = {"failed": "bold red", "invalid": "red", "noisy": "yellow", "unchecked": "yellow"}
MARK_STYLES = {"failed": "bold red", "noisy": "yellow", "partial": "magenta", "trend": "yellow", "disturbed": "yellow",
               "unquantized": "magenta"}
PLAIN = {"box": box.SIMPLE_HEAD, "pad_edge": False}  # a section's table in the report
WIDE = 132  # below this many columns the tables drop what --wide shows
INCOMPLETE = " [bold yellow](INCOMPLETE: interrupted run)[/]"


def cell_markup(cell: Cell) -> str:
    if cell.marks:
        return " ".join(f"[{MARK_STYLES[m]}]{MARKS[m][0]}[/]" for m in cell.marks)
    text = rich_escape(cell.text)
    return f"[{STYLES[cell.style]}]{text}[/]" if cell.style in STYLES else text


def natural_width(table: Table) -> int:
    """The columns a table takes when nothing is cut."""
    return Console(width=100_000, file=io.StringIO()).measure(table).maximum


def filled_table(section: Section, shown: list[str], **options) -> Table:
    """The section's rows in the columns named `shown`; a grouped section prints its first cell where it changes.
    No value is cut or wrapped."""
    table = Table(**({"title": section.title, "title_justify": "left"} if section.title else {}), **options)
    for column in section.columns:
        if column.name in shown:
            table.add_column(column.name, justify="left" if column.left else "right", no_wrap=True)
    previous = None
    for row in section.rows:
        cells = [cell_markup(cell) for column, cell in zip(section.columns, row) if column.name in shown]
        if section.grouped and row[0].text == previous:
            cells[0] = ""
        table.add_row(*cells, end_section=False)
        previous = row[0].text
    return table


def section_table(section: Section, width: int | None = None, **options) -> Table:
    """One section's table: where it is wider than `width`, the columns the section names as `narrow` go, in that
    order, until it fits; its caption names them."""
    shown, hidden = list(section.names), []
    while True:
        table = filled_table(section, shown, **options)
        candidates = [name for name in section.narrow if name in shown]
        if width is None or not candidates or natural_width(table) <= width:
            break
        shown.remove(candidates[0])
        hidden.append(candidates[0])
    if hidden:
        table.caption, table.caption_justify = f"not shown at this width: {', '.join(hidden)} (--wide)", "left"
    return table


def section_renderables(section: Section, width: int | None = None, **options) -> list:
    """Any section: its table (titled) or its title, its note as a sentence, its items, the marks it explains,
    its warnings."""
    out: list = []
    if section.columns:
        out.append(section_table(section, width, **(options or PLAIN)))
    elif section.title:
        out.append(rich_escape(section.title))
    if section.note:
        out.append(rich_escape(as_sentence(section.note)))
    out += [Text(f"  {item}") for item in section.items]
    out += [f"  {MARKS[name][0]} {MARKS[name][1]}" for name in section.marks]
    out += [f"[yellow]{rich_escape(warning)}[/]" for warning in section.warnings]
    return out


def timing_tables(report: Report, width: int, wide: bool, title: str | None = None, **options) -> list[Table]:
    """The timing table, one per clock (each titled with it): the widest layout that fits (with `wide`, the
    wide one), the compact one dropping the gate, then the per-workload time, until the table fits. `title`
    stands for a single clock's."""
    out = []
    for clock in report.clocks():
        heading = title if title and len(report.clocks()) == 1 else timing_title(report, clock)
        for layout in columns.LAYOUTS[:1] if wide else columns.LAYOUTS:
            section = timing_section(report, clock, layout, heading)
            table = section_table(section, **options)
            if natural_width(table) <= width:
                break
        if not wide:
            table = section_table(section, width, **options)
        if layout != "wide":
            table.caption, table.caption_justify = "--wide shows every column", "left"
        out.append(table)
    return out


def quick_table(report: Report, width: int = 200, wide: bool = False) -> Table:
    """`kvbench run` and `kvbench show`: timings, speedups, bytes and checks at a glance (the first clock's)."""
    return next(item for item in quick_tables(report, width, wide) if isinstance(item, Table))


def quick_tables(report: Report, width: int, wide: bool) -> list:
    """The timing tables under the run's title (its own line when each clock has a table)."""
    title = rich_escape(report.title) + ("" if report.complete else INCOMPLETE)
    tables = timing_tables(report, width, wide, title)
    if len(tables) > 1:
        return [title, *tables]
    return tables


def quick_renderables(report: Report, width: int = 200, wide: bool = False, verdict: bool = True) -> list:
    """The quick table (a request run: its latency table instead), then how each length was sampled, how
    noisy the machine was and the run's verdict (`verdict`: `kvbench run` prints it last, after the path)."""
    fit = None if wide else width
    out = []
    for section in workload_sections(report, compact=not wide and width < WIDE):
        out += section_renderables(section, fit)
    if report.kind != "request":
        out += quick_tables(report, width, wide)
    for section in ([quality_section(report)] if report.quality else []) + \
            ([needle_section(report)] if report.needle else []) + ([peers_section(report)] if report.peers else []):
        out += section_renderables(section, fit)
    if report.sampling:
        out.append("sampled: " + "; ".join(
            f"{length_label(report.workload, row.length)}: {row.rotations} rotations, {stop_text(row)}"
            + (f" (A/A ±{row.control.half_width:.1%})" if row.control else "")
            + (f", {CLOCK_TEXTS.get(row.clock, row.clock)}" if row.clock != "wall" else "")
            for row in report.sampling))
    out += section_renderables(legend_section(report))
    if report.sampling and clock_note(report.sampling) and report.kind != "request":
        out.append(rich_escape(clock_note(report.sampling)))
    if report.noise is not None:
        out.append(rich_escape(columns.noise_sentence(report.noise)))
    if verdict and report.verdict:
        out.append(verdict_line(report))
    return out


def verdict_line(report: Report) -> str:
    return f"[bold]{rich_escape(as_sentence(report.verdict))}[/]"


def bytes_note(report: Report, tables: list[Table]) -> list[str]:
    """What "a/b" in the terminal's KV bytes column means, when a cache reserved more than it kept."""
    shown = {column.header for table in tables for column in table.columns}
    if "KV bytes" in shown and any(row.memory and row.memory["reserved_bytes"] != row.memory["measured_bytes"]
                                   for row in report.rows):
        return ["  KV bytes a/b: a retained, b reserved (allocated) by the cache"]
    return []


def report_renderables(report: Report, width: int = 150, wide: bool = False) -> list:
    """Every section, fitted to `width` (`wide`: every column); the timing tables take the widest layout that fits."""
    fit = None if wide else width
    out: list = [f"[bold]{rich_escape(report.title)}[/]" + ("" if report.complete else INCOMPLETE),
                 f"record {rich_escape(report.source)} · created {rich_escape(report.created_utc)}",
                 rich_escape(environment_line(report.environment))]
    if report.verdict:
        out.append(verdict_line(report))
    timed = False
    for section in sections(report):
        if section.name == "timings":
            if not timed:  # every clock's table at once: they share the width's choice of layout
                tables = timing_tables(report, width, wide, None, **PLAIN, collapse_padding=True)
                out += tables + bytes_note(report, tables)
                timed = True
            continue
        if section.name == "latency" and not wide and width < WIDE:
            section = latency_section(report, compact=True)
        out += section_renderables(section, fit)
    return out


def render_report(report: Report, width: int = 150, wide: bool = True) -> str:
    """The text report for a file: no terminal to fit, so every column (`wide`), each table whole."""
    renderables = report_renderables(report, width, wide)
    tables = [natural_width(item) for item in renderables if isinstance(item, Table)]
    return render_plain(renderables, max([width, *tables]) if wide else width)
