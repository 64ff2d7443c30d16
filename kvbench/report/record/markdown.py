"""The markdown layout (GitHub-flavoured) of one record's report.

Text that comes from a record (mode names, paths, notes) is escaped; the numbers and
words kvbench generates are written as they are.
"""

from __future__ import annotations

from kvbench.report.format import as_sentence, escape_markdown, markdown_table
from kvbench.report.record import columns
from kvbench.report.record.latency import (
    CONTEXT_COLUMNS,
    context_cells,
    LATENCY_COLUMNS,
    LIMIT_COLUMNS,
    peer_columns,
    PEER_NOTE,
    latency_cells,
    limit_cells,
    peer_cells,
)
from kvbench.report.record.model import MARKS, Report, Row, environment_line
from kvbench.report.record.precision import CLOCK_TEXTS
from kvbench.report.record.quality import QUALITY_COLUMNS, quality_cells


def _cell(column: columns.Column, row: Row) -> str:
    text = escape_markdown(column.text(row)) if column.from_record else column.text(row)
    style = column.style(row)
    if style == "failed":
        return f"**{text}**"
    return text


def workload_sections(report: Report) -> list[str]:
    """What comes before the timing table: a real model's text quality, a request's or a contexts run's steps,
    the machine's limits, transformers' caches."""
    lines: list[str] = []
    if report.model_note:
        lines += [escape_markdown(as_sentence(report.model_note)), ""]
    if report.quality:
        lines += markdown_table(QUALITY_COLUMNS, [[escape_markdown(text) for text in quality_cells(row)]
                                                  for row in report.quality], left=("mode", "greedy departs at"))
        lines += ["", escape_markdown(as_sentence(report.quality_note)), ""]
        lines += [f"- {escape_markdown(row.label)}: {escape_markdown(repr(row.sample))}" for row in report.quality]
        lines.append("")
    if report.latency:
        lines += markdown_table((*LATENCY_COLUMNS, "marks"), [[escape_markdown(text) for text in latency_cells(row)]
                                                             + [columns.marks_of(row)] for row in report.latency],
                                left=("mode", "equivalence", "marks"))
        lines += ["", escape_markdown(as_sentence(report.latency_note)), ""]
    if report.context_steps:
        lines += markdown_table((*CONTEXT_COLUMNS, "marks"), [[escape_markdown(text) for text in context_cells(row)]
                                                             + [columns.marks_of(row)] for row in report.context_steps],
                                left=("mode", "equivalence", "marks"))
        lines += ["", escape_markdown(as_sentence(report.context_note)), ""]
    if report.limits:
        lines += markdown_table(LIMIT_COLUMNS, [[escape_markdown(text) for text in limit_cells(row)]
                                                for row in report.limits], left=("mode", "step"))
        lines += ["", escape_markdown(as_sentence(report.limits_note)), ""]
    if report.peers:
        lines += markdown_table(peer_columns(bool(report.context_steps)),
                                [[escape_markdown(text) for text in peer_cells(row)] for row in report.peers],
                                left=("kvbench", "transformers"))
        lines += ["", escape_markdown(as_sentence(PEER_NOTE)), ""]
    return lines


def render_report(report: Report, image: str | None = None) -> str:
    """The report as markdown; `image` is a relative link to the plot, if one was written."""
    lines = [f"**{escape_markdown(report.title)}**" + ("" if report.complete else " — **INCOMPLETE: interrupted run**"), ""]
    lines += [f"Record `{report.source}`, created {report.created_utc}. "
              f"{escape_markdown(environment_line(report.environment))}.", ""]
    if report.verdict:
        lines += [f"**{escape_markdown(as_sentence(report.verdict))}**", ""]
    lines += workload_sections(report)
    legend = [f"{MARKS[name][0]} {MARKS[name][1]}" for name in report.marks_used()]
    marks = " Marks: " + "; ".join(legend) + "." if legend else ""
    if report.kind != "request":  # a request's figures are its latency table's
        for clock in report.clocks():
            shown = columns.row_columns(report, clock, "document")
            if len(report.clocks()) > 1:
                lines += [f"Times and speedups on {CLOCK_TEXTS[clock]}:", ""]
            lines += markdown_table([column.name for column in shown],
                                    [[_cell(column, row) for column in shown] for row in report.rows if row.clock == clock])
            lines.append("")
        lines.append(escape_markdown(as_sentence(columns.speedup_legend(report))) + marks)
    elif marks:
        lines.append(marks.strip())
    for note in report.notes:
        lines += ["", f"> **Note:** {escape_markdown(note)}"]
    if report.sampling:
        lines += ["", escape_markdown(columns.sampling_sentence(report)) + ":", ""]
        lines += markdown_table(columns.sampling_columns(report),
                                [columns.sampling_cells(row, report.workload) for row in report.sampling], left=("stopped",))
    if report.noise is not None:
        lines += ["", escape_markdown(as_sentence(columns.noise_sentence(report.noise)))]
    if report.tradeoffs:
        lines += ["", columns.TRADEOFF_SENTENCE, ""]
        lines += markdown_table(columns.TRADEOFF_COLUMNS, [[escape_markdown(text) for text in columns.tradeoff_cells(entry)]
                                                   for entry in report.tradeoffs], left=("mode", "judged"))
    if report.fits:
        lines += ["", "Scaling fit, time ≈ a · T^b over the measured lengths:", ""]
        lines += markdown_table(columns.FIT_COLUMNS, [[escape_markdown(mode), *columns.fit_cells(fit)]
                                                      for mode, fit in report.fits.items()])
    if report.profile is not None:
        head, *rest = columns.profile_sentences(report.profile, report.baseline)
        lines += ["", head[0].upper() + head[1:], ""] + [f"- {escape_markdown(line.strip())}" for line in rest]
    if image:
        lines += ["", f"![kvbench: time, speedup, per-token cost and per-step profile]({image})"]
    return "\n".join(lines) + "\n"
