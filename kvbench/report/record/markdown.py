"""The markdown layout (GitHub-flavoured) of one record's report: kvbench.report.record.sections, each
rendered by one table renderer.

Text that comes from a record (mode names, paths, notes, the columns a section marks as the
record's) is escaped; the numbers and words kvbench generates are written as they are.
"""

from __future__ import annotations

from kvbench.report.format import as_sentence, capitalised, escape_markdown, markdown_table
from kvbench.report.record.model import MARKS, Report, environment_line
from kvbench.report.record.sections import Cell, Column, Section, sections


def cell_markdown(column: Column, cell: Cell) -> str:
    text = escape_markdown(cell.text) if column.from_record else cell.text
    return f"**{text}**" if cell.style == "failed" else text


def section_lines(section: Section) -> list[str]:
    """Any section: its title in bold, its table, its note as a sentence, its items as a list, the marks it
    explains, its warnings as quotes; a blank line after each."""
    lines = [f"**{escape_markdown(capitalised(section.title))}**", ""] if section.title else []
    if section.columns:
        lines += markdown_table(section.names, [[cell_markdown(column, cell) for column, cell in zip(section.columns, row)]
                                                for row in section.rows],
                                left=tuple(column.name for column in section.columns if column.left))
        lines.append("")
    if section.note:
        lines += [escape_markdown(as_sentence(section.note)), ""]
    if section.items:
        lines += [f"- {escape_markdown(item)}" for item in section.items] + [""]
    if section.marks:
        lines += ["Marks: " + "; ".join(f"{MARKS[name][0]} {MARKS[name][1]}" for name in section.marks) + ".", ""]
    for warning in section.warnings:
        lines += [f"> **Note:** {escape_markdown(warning)}", ""]
    return lines


def render_report(report: Report, image: str | None = None) -> str:
    """The report as markdown; `image` is a relative link to the plot, if one was written."""
    lines = [f"**{escape_markdown(report.title)}**" + ("" if report.complete else " — **INCOMPLETE: interrupted run**"), ""]
    lines += [f"Record `{report.source}`, created {report.created_utc}. "
              f"{escape_markdown(environment_line(report.environment))}.", ""]
    if report.verdict:
        lines += [f"**{escape_markdown(as_sentence(report.verdict))}**", ""]
    for section in sections(report):
        lines += section_lines(section)
    if image:
        lines += [f"![kvbench: time, speedup, per-token cost and per-step profile]({image})", ""]
    return "\n".join(lines).rstrip("\n") + "\n"
