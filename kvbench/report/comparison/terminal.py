"""Terminal layouts (rich) of a comparison: two records (`kvbench compare`) and several machines
(`--across-machines`). Every text from a record is escaped before rich sees it."""

from __future__ import annotations

from rich import box
from rich.table import Table

from kvbench.report.comparison import machines
from kvbench.report.comparison.compare import (
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
from kvbench.report.comparison.differences import CRITICAL, INFORMATIONAL, NOTABLE
from kvbench.report.format import render_plain, rich_escape

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
    out += [table, rich_escape(machines.legend(views))]
    return out
