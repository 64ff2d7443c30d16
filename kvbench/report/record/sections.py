"""A record's report as data: one list of sections, each a title, columns, rows of cells and a note.

`sections(report)` is the one place that says what a report shows and in which order; each layout
(terminal, markdown, HTML) renders every section with one generic renderer of its own and keeps only
its own concerns: rich styles, markdown escaping, HTML escaping, and where it puts its plots. Titles
and notes are phrases, as the terminal prints them; markdown and HTML make sentences of the notes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvbench.report.record import columns
from kvbench.report.record.latency import (
    CONTEXT_COLUMNS,
    LATENCY_COLUMNS,
    LATENCY_COMPACT,
    LIMIT_COLUMNS,
    PEER_NOTE,
    context_cells,
    latency_cells,
    latency_compact_cells,
    limit_cells,
    peer_cells,
    peer_columns,
)
from kvbench.report.record.model import Report, Row
from kvbench.report.record.precision import CLOCK_TEXTS
from kvbench.report.record.needle import NEEDLE_COLUMNS, grid_cells, grid_columns, needle_cells
from kvbench.report.record.quality import QUALITY_COLUMNS, quality_cells


@dataclass(frozen=True)
class Column:
    name: str
    left: bool = False  # alignment: words left, numbers right
    from_record: bool = False  # its texts carry a record's own strings (mode names, errors): markdown escapes them


@dataclass(frozen=True)
class Cell:
    text: str
    style: str | None = None  # what the cell means ("failed", "invalid", "noisy", "unchecked"); layouts style it
    marks: tuple[str, ...] = ()  # a marks cell: the names of its MARKS, which each layout draws its own way


@dataclass(frozen=True)
class Section:
    """One part of a report. A section without columns is text only: its title, note, items or warnings."""

    name: str  # what it is: "quality", "latency", "timings", "sampling", ...
    title: str | None = None
    columns: tuple[Column, ...] = ()
    rows: tuple[tuple[Cell, ...], ...] = ()
    note: str | None = None  # the caption: what the table shows and how it was computed
    items: tuple[str, ...] = ()  # lines listed after the note, a record's text among them (greedy samples)
    marks: tuple[str, ...] = ()  # MARKS whose meaning the section explains (the legend)
    warnings: tuple[str, ...] = ()  # what a reader must not miss (an interrupted run, cells not measured)
    grouped: bool = False  # rows grouped by their first cell: shown only where it changes
    narrow: tuple[str, ...] = ()  # the columns a narrow terminal drops first, in order

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns)


RECORD_TEXTS = ("mode", "kvbench", "transformers", "equivalence")  # columns holding a record's strings
LEFT = ("mode", "equivalence", "gate", "marks", "step", "stopped", "judged", "kvbench", "transformers",
        "greedy departs at")


def table(name: str, title: str, names: tuple[str, ...], rows: list[list[str]], **options) -> Section:
    """A section of plain texts: columns aligned by LEFT, escaped in markdown by RECORD_TEXTS."""
    shown = tuple(Column(column, left=column in LEFT, from_record=column in RECORD_TEXTS) for column in names)
    return Section(name, title, shown, tuple(tuple(Cell(text) for text in row) for row in rows), **options)


def with_marks(section: Section, marked: list) -> Section:
    """A section with a marks column: each row's marks (kvbench.report.record.model.MARKS) in its last cell."""
    rows = tuple((*cells, Cell(columns.marks_of(row), marks=row.marks)) for cells, row in zip(section.rows, marked))
    return dataclasses.replace(section, columns=(*section.columns, Column("marks", left=True)), rows=rows)


def timing_section(report: Report, clock: str, layout: str = "document", title: str | None = None) -> Section:
    """The timing table of the lengths on one clock, with a layout's columns (kvbench.report.record.columns)."""
    shown = columns.row_columns(report, clock, layout)
    rows = tuple(tuple(timing_cell(column, row) for column in shown) for row in report.rows if row.clock == clock)
    head = tuple(Column(column.name, column.left, column.from_record) for column in shown)
    narrow = (columns.GATE.name, shown[2].name) if layout == "compact" else ()
    return Section("timings", title, head, rows, grouped=True, narrow=narrow)


def timing_cell(column: columns.Column, row: Row) -> Cell:
    style = column.style(row)
    if style == "marks":
        return Cell(column.text(row), marks=row.marks)
    return Cell(column.text(row), style)


def timing_title(report: Report, clock: str) -> str:
    """A timing table names its lengths and clock when the run has several clocks."""
    if len(report.clocks()) == 1:
        return "times and speedups"
    lengths = ", ".join(str(n) for n in dict.fromkeys(row.length for row in report.rows if row.clock == clock))
    return f"length {lengths}: times and speedups on {CLOCK_TEXTS[clock]}"


def timing_sections(report: Report, layout: str = "document") -> list[Section]:
    if report.kind == "request":  # a request's figures are its latency table's
        return []
    return [timing_section(report, clock, layout, timing_title(report, clock)) for clock in report.clocks()]


def quality_section(report: Report) -> Section:
    """What each mode did to a real model's text, then each mode's greedy sample; a quantized kind that held
    little of a chunk quantized is marked, and a transformers cache measured with other settings than kvbench's
    kind beside it is said."""
    section = table("quality", "quality on text", tuple(QUALITY_COLUMNS), [quality_cells(row) for row in report.quality],
                    note=report.quality_note, items=tuple(f"{row.label}: {row.sample!r}" for row in report.quality),
                    narrow=("beyond window (full's)", "quantized", "KL", "greedy departs at", "top-1"))
    marks = tuple(name for name in ("unquantized",) if any(name in row.marks for row in report.quality))
    if not marks:
        return section
    return dataclasses.replace(with_marks(section, report.quality), marks=marks)


def needle_section(report: Report) -> Section:
    """Retrieval per mode: accuracy and mean answer log-prob against full's; the safe ratios after the note."""
    needle = report.needle
    return table("needle", "retrieval: a needle in the context", tuple(NEEDLE_COLUMNS),
                 [needle_cells(row) for row in needle.rows], note=needle.note, items=tuple(needle.safe),
                 narrow=("correct", "Δ vs full (95% CI)"))


def needle_grid_section(report: Report) -> Section:
    """Every cell of every mode: the table the HTML report's heat maps draw."""
    return table("needle-grid", "retrieval by cell: ✓ or ✗, then the answer's log-prob (nats)",
                 tuple(grid_columns(report.needle)), grid_cells(report.needle), grouped=True)


def latency_section(report: Report, compact: bool = False) -> Section:
    """A request run's TTFT, TPOT, ITL per mode (`compact`: the few columns a narrow terminal shows)."""
    first = report.latency[0]
    names, cells = (LATENCY_COMPACT, latency_compact_cells) if compact else (LATENCY_COLUMNS, latency_cells)
    section = table("latency", f"what a client sees, one request: {first.prompt} prompt tokens, {first.generate} "
                    "generated · wall time", names, [cells(row) for row in report.latency], note=report.latency_note,
                    narrow=("n", "tokens/s", "E2E ms", "TTFT ×", "ITL p50 / p90 / p99 ms", "TPOT ×", "ITL p50/p99 ms"))
    return with_marks(section, report.latency)


def contexts_section(report: Report) -> Section:
    section = table("contexts", "steps at a context: the steady-state step and the first after the prefill",
                    CONTEXT_COLUMNS, [context_cells(row) for row in report.context_steps], note=report.context_note,
                    narrow=("n", "equivalence", "first / step", CONTEXT_COLUMNS[4]))
    return with_marks(section, report.context_steps)


def workload_sections(report: Report, compact: bool = False) -> list[Section]:
    """What a request or contexts run shows before (a request: instead of) the timing table."""
    out = []
    if report.latency:
        out.append(latency_section(report, compact))
    if report.context_steps:
        out.append(contexts_section(report))
    return out


def limits_section(report: Report) -> Section:
    return table("limits", "against the machine's limits", LIMIT_COLUMNS, [limit_cells(row) for row in report.limits],
                 note=report.limits_note, narrow=("reads", "GFLOP/s", "matmul floor ms", "GB/s", "% of matmul"))


def peers_section(report: Report) -> Section:
    names = peer_columns(bool(report.context_steps), report.interval_name)
    return table("peers", "against transformers' caches, same weights, same rotations", names,
                 [peer_cells(row) for row in report.peers], note=PEER_NOTE, narrow=("pairs", names[4]))


def legend_section(report: Report) -> Section:
    """The legends of what the tables show: the speedup column's (not a request's, which has none), the marks."""
    note = None if report.kind == "request" else columns.speedup_legend(report)
    return Section("legend", note=note, marks=tuple(report.marks_used()))


def sampling_section(report: Report) -> Section:
    head = columns.sampling_columns(report)
    return table("sampling", "sampling: rotations per length, why they stopped, the A/A noise floor", head,
                 [columns.sampling_cells(row, report.workload) for row in report.sampling],
                 note=columns.sampling_sentence(report), narrow=("A/A ratio", head[5], "rotations"))


def tradeoff_sections(report: Report) -> list[Section]:
    """The trade-off table, one per clock as the timing table is: each time beside the speedup it was estimated
    with, its clock named in its header."""
    clocks = list(dict.fromkeys(entry.clock for entry in report.tradeoffs))
    out = []
    for clock in clocks:
        names = columns.tradeoff_columns(report.kind, clock)
        entries = [entry for entry in report.tradeoffs if entry.clock == clock]
        lengths = ", ".join(str(n) for n in dict.fromkeys(entry.length for entry in entries))
        title = "trade-off: bytes, drift, time" if len(clocks) == 1 else \
            f"length {lengths}: trade-off on {CLOCK_TEXTS[clock]}"
        out.append(table("tradeoff", title, names, [columns.tradeoff_cells(entry, report.kind) for entry in entries],
                         note=columns.TRADEOFF_SENTENCE,
                         narrow=("of float", "KL mean", "max |Δ|", names[9], "quantized")))
    return out


def fit_section(report: Report) -> Section:
    return table("fit", "scaling fit: time ≈ a · T^b (least squares on log-log medians)", columns.FIT_COLUMNS,
                 [[mode, *columns.fit_cells(fit)] for mode, fit in report.fits.items()], note=columns.FIT_SENTENCE,
                 narrow=("a (s)", "± SE", "b, two longest", "R²"))


def profile_section(report: Report) -> Section | None:
    if report.profile is None:
        if report.kind != "loop":
            return None
        return Section("profile", "per-step profile",
                       note="no per-step profile in this record (kvbench run --per-step LENGTH records one)")
    head, *rest = columns.profile_sentences(report.profile, report.baseline)
    return Section("profile", head.rstrip(":"), items=tuple(line.strip() for line in rest))


def sections(report: Report) -> list[Section]:
    """Everything a record's report shows, in order, for every layout."""
    out = [Section("model", note=report.model_note)] if report.model_note else []
    out += [quality_section(report)] if report.quality else []
    out += [needle_section(report), needle_grid_section(report)] if report.needle else []
    out += workload_sections(report)
    out += [limits_section(report)] if report.limits else []
    out += [peers_section(report)] if report.peers else []
    out += timing_sections(report)
    out.append(legend_section(report))
    if report.notes:
        out.append(Section("notes", warnings=tuple(report.notes)))
    out += [sampling_section(report)] if report.sampling else []
    if report.noise is not None:
        out.append(Section("noise", note=columns.noise_sentence(report.noise)))
    out += tradeoff_sections(report)
    out += [fit_section(report)] if report.fits else []
    profile = profile_section(report)
    return out + ([profile] if profile else [])

