"""Several records, several machines: each cached cell's speedup lined up, machine by machine.

Raw seconds from two machines measure two machines; a speedup, each run's own full-prefix
time over its cached time measured in the same rotations, measures the code on each. So the
view lines up every record's speedup per cell with the interval that record computed, says how far apart
they are, and whether the intervals overlap (if they do not, the cache pays differently on
those machines; if they do, these records cannot tell the machines apart).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.record import RecordView
from kvbench.report.comparison.differences import environment_diff
from kvbench.report.format import interval_name


@dataclass(frozen=True)
class MachineSpeedup:
    record: int  # index of the record among those lined up
    ratio: float
    low: float
    high: float
    valid: bool


@dataclass(frozen=True)
class CellAcross:
    mode: str
    length: int
    speedups: list[MachineSpeedup]  # one per record that measured the cell, in the records' order

    @property
    def spread(self) -> float:
        """max / min - 1 of the speedups."""
        ratios = [s.ratio for s in self.speedups]
        return max(ratios) / min(ratios) - 1

    @property
    def overlap(self) -> bool:
        """Whether one value lies inside every record's interval."""
        return max(s.low for s in self.speedups) <= min(s.high for s in self.speedups)


def machine_label(view: RecordView) -> str:
    os_section, cpu = view.environment.get("os") or {}, view.environment.get("cpu") or {}
    return f"{os_section.get('hostname') or '?'} ({cpu.get('brand') or 'unknown CPU'})"


def across(views: list[RecordView]) -> tuple[list[str], list[CellAcross], list[list[str]]]:
    """(machine labels, every cached cell two or more records measured, the critical and notable environment
    differences between each record and the first)."""
    labels = [machine_label(view) for view in views]
    labels = [label if labels.count(label) == 1 else f"{label} #{index + 1}" for index, label in enumerate(labels)]
    cells = []
    for mode, length in dict.fromkeys(cell for view in views for cell in view.cells()):
        found = []
        for index, view in enumerate(views):
            entry = view.speedup(mode, length)
            if entry is not None and entry["low"] is not None:  # schema 1: no interval
                found.append(MachineSpeedup(index, entry["speedup"], entry["low"], entry["high"], entry["valid"]))
        if len(found) >= 2:
            cells.append(CellAcross(mode, length, found))
    differences = [[f"{d.key}: {d.old} -> {d.new}" for d in environment_diff(views[0].environment, view.environment)
                    if d.rank != "informational"] for view in views[1:]]
    return labels, cells, differences


def cell_texts(cell: CellAcross, labels: list[str]) -> list[str]:
    by_record = {s.record: s for s in cell.speedups}
    texts = [str(cell.length), cell.mode]
    for index in range(len(labels)):
        s = by_record.get(index)
        texts.append("" if s is None else "invalid" if not s.valid else f"{s.ratio:.2f}x [{s.low:.2f}, {s.high:.2f}]")
    return [*texts, f"{cell.spread:.0%}", "overlap" if cell.overlap else "apart"]


def header(labels: list[str]) -> list[str]:
    return ["length", "mode", *labels, "spread", "intervals"]


def legend(views: list[RecordView]) -> str:
    """What the lined-up figures are, with the interval each record computed named from the record."""
    names = list(dict.fromkeys(interval_name(view.interval) for view in views if view.interval is not None))
    if not names:
        with_interval = "without an interval (records of schema 1: ratios of medians)"
    elif len(names) == 1:
        with_interval = f"with its {names[0]}"
    else:
        with_interval = f"with the interval its record computed ({'; '.join(names)})"
    return ("each speedup is its own run's full-prefix time over the cached time, measured in the same rotations, "
            f"{with_interval}; raw seconds from different machines are not compared. spread: max / min - 1; "
            "intervals: overlap when one value lies in all of them (these records cannot tell the machines apart), "
            "apart when not")
