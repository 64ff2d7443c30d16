"""The run record: one versioned JSON file, validated on write and on read.

Top-level keys: schema, status, created_utc, command, config, run, protocol,
environment, checks, repetitions, summary, memory. Everything derived (summary)
is recomputed from the raw repetitions when a record is loaded, so a record whose
numbers disagree with its own samples is rejected rather than believed.
"""

from __future__ import annotations

import json
import math
import statistics
from datetime import datetime, timezone
from pathlib import Path

import jsonschema

from kvbench.files import OutputExistsError, write_bytes_atomic, write_json_atomic

__all__ = ["RecordError", "RecordExistsError", "RecordView", "build_record", "load_record", "validate_record",
           "write_bytes_atomic", "write_json_atomic", "write_record"]

SCHEMA = "kvbench.record/1"
SCHEMA_NAME, SCHEMA_VERSION = SCHEMA.split("/")
DEFAULT_RECORDS_DIR = Path("results") / "records"
STATUSES = ("complete", "incomplete")


class RecordError(ValueError):
    """A record file that cannot be read, or that does not match the schema."""


class RecordExistsError(RecordError, OutputExistsError):
    """Writing would replace an existing record, and replacing was not asked for."""


_number = {"type": "number"}
_count = {"type": "integer", "minimum": 0}
_nullable_number = {"type": ["number", "null"]}

RECORD_SCHEMA = {
    "type": "object",
    "required": [
        "schema", "status", "created_utc", "command", "config", "run", "protocol",
        "environment", "checks", "repetitions", "summary", "memory",
    ],
    "properties": {
        "schema": {"const": SCHEMA},
        "status": {"enum": list(STATUSES)},
        "created_utc": {"type": "string"},
        "command": {"type": "array", "items": {"type": "string"}},
        "config": {"type": "object", "required": ["vocab_size", "width", "heads", "kv_heads", "layers", "max_length", "dtype"]},
        "run": {
            "type": "object",
            "required": ["preset", "lengths", "modes", "batch", "seed", "repeats", "warmup", "threads"],
            "properties": {
                "lengths": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 1}},
                "modes": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                "repeats": {"type": "integer", "minimum": 1},
            },
        },
        "protocol": {"type": "object"},
        "environment": {"type": "object"},
        "checks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["mode", "length", "passed", "max_abs_diff", "max_rel_diff", "first_divergent_position", "atol", "rtol"],
                # The differences are null only for a mode that raised: its check carries the error.
                "properties": {"passed": {"type": "boolean"}, "max_abs_diff": _nullable_number,
                               "max_rel_diff": _nullable_number, "error": {"type": "string"}},
            },
        },
        "repetitions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["mode", "length", "repetition", "order", "seconds"],
                "properties": {
                    "mode": {"type": "string"},
                    "length": {"type": "integer", "minimum": 1},
                    "repetition": _count,
                    "order": _count,
                    "seconds": {"type": "number", "exclusiveMinimum": 0},
                },
            },
        },
        "summary": {
            "type": "object",
            "required": ["cells", "speedups"],
            "properties": {
                "cells": {"type": "array", "items": {"type": "object", "required": ["mode", "length", "median", "min", "max", "q1", "q3", "repetitions", "valid"]}},
                "speedups": {"type": "array", "items": {"type": "object", "required": ["mode", "length", "speedup", "valid"]}},
            },
        },
        "memory": {
            "type": "array",
            "items": {"type": "object", "required": ["mode", "length", "expected_bytes", "measured_bytes", "reserved_bytes"]},
        },
        "per_step": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["mode", "length", "seconds"],
                "properties": {
                    "mode": {"type": "string"},
                    "length": {"type": "integer", "minimum": 1},
                    "seconds": {"type": "array", "minItems": 1, "items": {"type": "number", "minimum": 0}},
                },
            },
        },
    },
}


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def cell_statistics(seconds: list[float]) -> dict:
    ordered = sorted(seconds)
    if len(ordered) > 1:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return {
        "median": statistics.median(ordered),
        "min": ordered[0],
        "max": ordered[-1],
        "q1": q1,
        "q3": q3,
        "repetitions": len(ordered),
    }


def samples_by_cell(repetitions: list[dict]) -> dict[tuple[str, int], dict[int, float]]:
    """{(mode, length): {repetition: seconds}}, cells in the order their first sample ran."""
    cells: dict[tuple[str, int], dict[int, float]] = {}
    for rep in repetitions:
        cells.setdefault((rep["mode"], rep["length"]), {})[rep["repetition"]] = rep["seconds"]
    return cells


def by_cell(entries: list[dict]) -> dict[tuple[str, int], dict]:
    """{(mode, length): entry} for a list of per-cell entries (checks, memory, summary cells)."""
    return {(entry["mode"], entry["length"]): entry for entry in entries}


def summarize(repetitions: list[dict], checks: list[dict], baseline: str = "full") -> dict:
    """Per (mode, length): median, min, max, quartiles; per length: median ratio full / cached.

    A cell is valid only when its mode passed the equivalence gate at that length;
    a speedup is valid only when both of its cells are.
    """
    passed = {key: check["passed"] for key, check in by_cell(checks).items()}
    cells = []
    for (mode, length), samples in samples_by_cell(repetitions).items():
        stats = cell_statistics(list(samples.values()))
        stats["per_token_median"] = stats["median"] / length
        cells.append({"mode": mode, "length": length, **stats, "valid": passed.get((mode, length), False)})
    by_key = by_cell(cells)
    speedups = []
    for cell in cells:
        base = by_key.get((baseline, cell["length"]))
        if cell["mode"] == baseline or base is None:
            continue
        speedups.append({
            "mode": cell["mode"],
            "length": cell["length"],
            "speedup": base["median"] / cell["median"],
            "valid": cell["valid"] and base["valid"],
        })
    return {"baseline": baseline, "cells": cells, "speedups": speedups}


def build_record(
    *, command: list[str], config: dict, run: dict, protocol: dict, environment: dict,
    checks: list[dict], repetitions: list[dict], memory: list[dict], status: str = "complete",
    per_step: list[dict] | None = None,
) -> dict:
    record = {
        "schema": SCHEMA,
        "status": status,
        "created_utc": utc_now(),
        "command": list(command),
        "config": config,
        "run": run,
        "protocol": protocol,
        "environment": environment,
        "checks": checks,
        "repetitions": repetitions,
        "summary": summarize(repetitions, checks),
        "memory": memory,
    }
    if per_step is not None:
        record["per_step"] = per_step
    validate_record(record)
    return record


def validate_record(record: object, source: str = "record") -> dict:
    """Raise RecordError naming the first problem; return the record when it is sound."""
    if not isinstance(record, dict):
        raise RecordError(f"{source}: expected a JSON object with schema {SCHEMA!r}, got {type(record).__name__}")
    found = record.get("schema")
    if found != SCHEMA:
        if isinstance(found, str) and found.startswith(SCHEMA_NAME + "/"):
            raise RecordError(f"{source}: unsupported schema version {found!r}; this kvbench reads {SCHEMA!r}")
        raise RecordError(f"{source}: not a kvbench record: expected schema {SCHEMA!r}, got {found!r}")
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(RECORD_SCHEMA).iter_errors(record))
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path) or "(top level)"
        raise RecordError(f"{source}: {where}: {error.message}")
    _check_consistency(record, source)
    return record


def _check_consistency(record: dict, source: str) -> None:
    run = record["run"]
    expected_cells = {(m, n) for m in run["modes"] for n in run["lengths"]}
    seen: dict[tuple[str, int], int] = {}
    indices: set[tuple[str, int, int]] = set()
    for rep in record["repetitions"]:
        key = (rep["mode"], rep["length"])
        if key not in expected_cells:
            raise RecordError(f"{source}: repetition for mode {key[0]!r} at length {key[1]} is outside run.modes {run['modes']} x run.lengths {run['lengths']}")
        seen[key] = seen.get(key, 0) + 1
        index = (*key, rep["repetition"])
        if index in indices:  # the report pairs modes by repetition index: it must be unique
            raise RecordError(f"{source}: mode {key[0]!r} at length {key[1]} has repetition {rep['repetition']} twice")
        indices.add(index)
    if record["status"] == "complete":
        untimeable = {key for key, check in by_cell(record["checks"]).items() if "error" in check}
        for key in sorted(expected_cells - untimeable):
            if seen.get(key, 0) != run["repeats"]:
                raise RecordError(f"{source}: mode {key[0]!r} at length {key[1]}: expected {run['repeats']} repetitions, found {seen.get(key, 0)}")
    for entry in record.get("per_step", []):
        if entry["mode"] not in run["modes"]:
            raise RecordError(f"{source}: per_step entry for mode {entry['mode']!r} is outside run.modes {run['modes']}")
        if len(entry["seconds"]) != entry["length"]:
            raise RecordError(f"{source}: per_step for mode {entry['mode']!r} at length {entry['length']} "
                              f"has {len(entry['seconds'])} step durations, expected {entry['length']}")
    recomputed = summarize(record["repetitions"], record["checks"], record["summary"].get("baseline", "full"))
    stored_cells = by_cell(record["summary"]["cells"])
    for cell in recomputed["cells"]:
        mine = stored_entry(stored_cells, cell, "cell", source)
        where = f"mode {cell['mode']!r} at length {cell['length']}"
        for stat in ("median", "min", "max", "q1", "q3"):
            if not math.isclose(mine[stat], cell[stat], rel_tol=1e-9, abs_tol=1e-15):
                raise RecordError(f"{source}: summary {stat} for {where} is {mine[stat]}, but its repetitions give {cell[stat]}")
        if mine["valid"] != cell["valid"]:
            raise RecordError(f"{source}: summary marks {where} valid={mine['valid']}, but its check gives valid={cell['valid']}")
    stored_speedups = by_cell(record["summary"]["speedups"])
    for speedup in recomputed["speedups"]:
        mine = stored_entry(stored_speedups, speedup, "speedup", source)
        if not math.isclose(mine["speedup"], speedup["speedup"], rel_tol=1e-9) or mine["valid"] != speedup["valid"]:
            raise RecordError(
                f"{source}: summary speedup for mode {speedup['mode']!r} at length {speedup['length']} is "
                f"{mine['speedup']} (valid={mine['valid']}), but the repetitions and checks give "
                f"{speedup['speedup']} (valid={speedup['valid']})"
            )


def stored_entry(stored: dict[tuple[str, int], dict], expected: dict, what: str, source: str) -> dict:
    """The record's own summary entry for the cell of `expected`, or RecordError naming the cell."""
    entry = stored.get((expected["mode"], expected["length"]))
    if entry is None:
        raise RecordError(f"{source}: summary has no {what} for mode {expected['mode']!r} at length {expected['length']}")
    return entry


def default_record_path(directory: Path | str = DEFAULT_RECORDS_DIR) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    return Path(directory) / f"run-{stamp}.json"


def write_record(record: dict, path: Path | str, force: bool = False) -> Path:
    """Validate, then write atomically; refuse to replace a file unless `force`."""
    validate_record(record)
    try:
        return write_json_atomic(record, path, force)
    except OutputExistsError as error:
        raise RecordExistsError(str(error)) from None


def load_record(path: Path | str) -> dict:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RecordError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise RecordError(f"{path}: cannot read: {error}") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        raise RecordError(f"{path}: not valid JSON (truncated or corrupt?): {error.msg} at line {error.lineno} column {error.colno}") from None
    return validate_record(record, str(path))


def record_from_run(outcome, *, command: list[str], preset: str, config, lengths: list[int], modes: list[str],
                    protocol, threads_in_effect: dict, environment: dict) -> dict:
    """The record of one run: its settings (a DecoderConfig and a timing.Protocol) beside its outcome."""
    return build_record(
        command=command, config=config.to_dict(), run=protocol.run_section(preset, lengths, modes),
        protocol=protocol.describe(threads_in_effect), environment=environment, checks=outcome.checks,
        repetitions=outcome.repetitions, memory=outcome.memory, per_step=outcome.per_step,
        status="incomplete" if outcome.interrupted else "complete",
    )


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
