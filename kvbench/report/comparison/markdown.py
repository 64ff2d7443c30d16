"""Markdown layouts (GitHub-flavoured) of a comparison: two records, several machines. Text from a record
is escaped; the numbers and words kvbench generates are written as they are."""

from __future__ import annotations

from kvbench.report.comparison import machines
from kvbench.report.comparison.compare import (
    FASTER,
    LATENCY_HEADER,
    COMPARE_HEADER,
    SLOWER,
    VERDICT_COLUMN,
    Comparison,
    cell_texts,
    latency_texts,
    summary_line,
)
from kvbench.report.comparison.differences import CRITICAL
from kvbench.report.format import escape_markdown, markdown_table


def render_comparison(c: Comparison) -> str:
    lines = [f"**kvbench compare** OLD `{c.old_source}` ({c.old_status}) → NEW `{c.new_source}` ({c.new_status})", ""]
    for title, diffs in (("Environment", c.environment), ("Run settings", c.config)):
        if not diffs:
            lines += [f"{title}: identical.", ""]
            continue
        lines += [f"{title} differences, ranked by how much they can move a timing:", ""]
        lines += markdown_table(("rank", "key", "OLD", "NEW"),
                                [[f"**{d.rank}**" if d.rank == CRITICAL else d.rank, f"`{d.key}`",
                                  escape_markdown(d.old), escape_markdown(d.new)] for d in diffs])
        lines.append("")
    if c.skipped:
        lines += [f"Skipped (not in both records): {escape_markdown(', '.join(c.skipped))}.", ""]
    lines += [f"> **Note:** {escape_markdown(note)}" for note in c.notes] + ([""] if c.notes else [])
    rows = []
    for cell in c.cells:
        texts = cell_texts(cell)
        for index in (1, len(texts) - 2, len(texts) - 1):  # the record's own strings: mode, checks, notes
            texts[index] = escape_markdown(texts[index])
        if cell.verdict in (SLOWER, FASTER):
            texts[VERDICT_COLUMN] = f"**{texts[VERDICT_COLUMN]}**"
        rows.append(texts)
    lines += markdown_table(COMPARE_HEADER, rows)
    if c.latency:
        lines += ["", "What a client sees, NEW / OLD:", ""]
        lines += markdown_table(LATENCY_HEADER, [[escape_markdown(t) for t in latency_texts(change)]
                                                 for change in c.latency])
    lines += ["", summary_line(c)]
    return "\n".join(lines) + "\n"


def render_across(views: list) -> str:
    """`kvbench compare --across-machines --format markdown`."""
    labels, cells, differences = machines.across(views)
    lines = [f"**kvbench compare --across-machines**: {len(views)} records", ""]
    lines += [f"{index + 1}. {escape_markdown(label)}: `{view.source}`" for index, (label, view) in
              enumerate(zip(labels, views))] + [""]
    for index, found in enumerate(differences, start=2):
        if found:
            lines += [f"> Environment of record {index} against record 1: {escape_markdown('; '.join(found))}", ""]
    lines += markdown_table([escape_markdown(name) for name in machines.header(labels)],
                            [[escape_markdown(text) for text in machines.cell_texts(cell, labels)] for cell in cells])
    lines += ["", escape_markdown(machines.legend(views))]
    return "\n".join(lines) + "\n"
