"""RecordView: read-only access to a validated record, indexed once, for every reader."""

from __future__ import annotations

from pathlib import Path

from kvbench.record.store import load_record
from kvbench.record.summary import by_cell, samples_by_cell


class RecordView:
    """Read-only access to a validated record, indexed once: every reader goes through it.

    Cells are (mode, length) pairs. The record's sections are attributes (status,
    created_utc, command, config, run, protocol, environment, baseline, modes, lengths);
    accessors return the record's own entries (do not modify them) or None where the
    record has none for that cell.
    """

    def __init__(self, record: dict, source: str = "record") -> None:
        self.record = record
        self.source = source
        self.status: str = record["status"]
        self.complete = self.status == "complete"
        self.created_utc: str = record["created_utc"]
        self.command: list[str] = list(record["command"])
        self.config: dict = record["config"]
        self.run: dict = record["run"]
        self.protocol: dict = record["protocol"]
        self.environment: dict = record["environment"]
        self.baseline: str = record["summary"].get("baseline", "full")
        self.modes: list[str] = list(self.run["modes"])
        self.lengths: list[int] = list(self.run["lengths"])
        self.planned_repeats: int = self.run["repeats"]
        self.per_step: list[dict] = record.get("per_step") or []
        self._samples = samples_by_cell(record["repetitions"])
        self._checks = by_cell(record["checks"])
        self._memory = by_cell(record["memory"])
        self._summaries = by_cell(record["summary"]["cells"])
        self._speedups = by_cell(record["summary"]["speedups"])

    @classmethod
    def load(cls, path: Path | str) -> RecordView:
        return cls(load_record(path), str(path))

    def grid(self) -> list[tuple[str, int]]:
        """Every planned cell in the run's order: lengths outer, modes inner."""
        return [(mode, length) for length in self.lengths for mode in self.modes]

    def cells(self) -> list[tuple[str, int]]:
        """The planned cells that have at least one repetition, in the run's order."""
        return [cell for cell in self.grid() if cell in self._samples]

    def samples(self, mode: str, length: int) -> dict[int, float]:
        """{repetition index: seconds} of one cell (empty when it never ran)."""
        return dict(self._samples.get((mode, length), {}))

    def seconds(self, mode: str, length: int) -> list[float]:
        return list(self._samples.get((mode, length), {}).values())

    def check(self, mode: str, length: int) -> dict | None:
        return self._checks.get((mode, length))

    def memory(self, mode: str, length: int) -> dict | None:
        return self._memory.get((mode, length))

    def summary(self, mode: str, length: int) -> dict | None:
        return self._summaries.get((mode, length))

    def speedup(self, mode: str, length: int) -> dict | None:
        return self._speedups.get((mode, length))

    def passed(self, mode: str, length: int) -> bool:
        check = self.check(mode, length)
        return bool(check and check["passed"])
