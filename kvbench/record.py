"""The run record: one versioned JSON file, validated on write and on read.

Top-level keys: schema, status, created_utc, command, config, run, protocol,
environment, checks, repetitions, summary, memory. Everything derived (summary)
is recomputed from the raw repetitions when a record is loaded, so a record whose
numbers disagree with its own samples is rejected rather than believed.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import jsonschema

SCHEMA = "kvbench.record/1"
SCHEMA_NAME, SCHEMA_VERSION = SCHEMA.split("/")
DEFAULT_RECORDS_DIR = Path("results") / "records"
STATUSES = ("complete", "incomplete")


class RecordError(ValueError):
    """A record file that cannot be read, or that does not match the schema."""


class RecordExistsError(RecordError):
    """Writing would replace an existing file without --force."""


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
                "properties": {"passed": {"type": "boolean"}, "max_abs_diff": _number, "max_rel_diff": _number},
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


def summarize(repetitions: list[dict], checks: list[dict], baseline: str = "full") -> dict:
    """Per (mode, length): median, min, max, quartiles; per length: median ratio full / cached.

    A cell is valid only when its mode passed the equivalence gate at that length;
    a speedup is valid only when both of its cells are.
    """
    passed = {(c["mode"], c["length"]): c["passed"] for c in checks}
    grouped: dict[tuple[str, int], list[float]] = {}
    for rep in repetitions:
        grouped.setdefault((rep["mode"], rep["length"]), []).append(rep["seconds"])
    cells = []
    for (mode, length), seconds in grouped.items():
        stats = cell_statistics(seconds)
        stats["per_token_median"] = stats["median"] / length
        cells.append({"mode": mode, "length": length, **stats, "valid": passed.get((mode, length), False)})
    by_key = {(c["mode"], c["length"]): c for c in cells}
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
        for key in sorted(expected_cells):
            if seen.get(key, 0) != run["repeats"]:
                raise RecordError(f"{source}: mode {key[0]!r} at length {key[1]}: expected {run['repeats']} repetitions, found {seen.get(key, 0)}")
    for entry in record.get("per_step", []):
        if entry["mode"] not in run["modes"]:
            raise RecordError(f"{source}: per_step entry for mode {entry['mode']!r} is outside run.modes {run['modes']}")
        if len(entry["seconds"]) != entry["length"]:
            raise RecordError(f"{source}: per_step for mode {entry['mode']!r} at length {entry['length']} "
                              f"has {len(entry['seconds'])} step durations, expected {entry['length']}")
    recomputed = summarize(record["repetitions"], record["checks"], record["summary"].get("baseline", "full"))
    stored = {(c["mode"], c["length"]): c for c in record["summary"]["cells"]}
    for cell in recomputed["cells"]:
        key = (cell["mode"], cell["length"])
        mine = stored.get(key)
        if mine is None:
            raise RecordError(f"{source}: summary has no cell for mode {key[0]!r} at length {key[1]}")
        for stat in ("median", "min", "max", "q1", "q3"):
            if not math.isclose(mine[stat], cell[stat], rel_tol=1e-9, abs_tol=1e-15):
                raise RecordError(f"{source}: summary {stat} for mode {key[0]!r} at length {key[1]} is {mine[stat]}, but its repetitions give {cell[stat]}")
        if mine["valid"] != cell["valid"]:
            raise RecordError(f"{source}: summary marks mode {key[0]!r} at length {key[1]} valid={mine['valid']}, but its check gives valid={cell['valid']}")
    stored_speedups = {(s["mode"], s["length"]): s for s in record["summary"]["speedups"]}
    for speedup in recomputed["speedups"]:
        key = (speedup["mode"], speedup["length"])
        mine = stored_speedups.get(key)
        if mine is None:
            raise RecordError(f"{source}: summary has no speedup for mode {key[0]!r} at length {key[1]}")
        if not math.isclose(mine["speedup"], speedup["speedup"], rel_tol=1e-9) or mine["valid"] != speedup["valid"]:
            raise RecordError(
                f"{source}: summary speedup for mode {key[0]!r} at length {key[1]} is {mine['speedup']} (valid={mine['valid']}), "
                f"but the repetitions and checks give {speedup['speedup']} (valid={speedup['valid']})"
            )


def default_record_path(directory: Path | str = DEFAULT_RECORDS_DIR) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    return Path(directory) / f"run-{stamp}.json"


def write_record(record: dict, path: Path | str, force: bool = False) -> Path:
    """Validate, then write atomically; refuse to replace a file unless `force`."""
    validate_record(record)
    return write_json_atomic(record, path, force)


def write_json_atomic(data: object, path: Path | str, force: bool = False) -> Path:
    return write_bytes_atomic(path, (json.dumps(data, indent=1, allow_nan=False) + "\n").encode(), force)


def write_bytes_atomic(path: Path | str, content: bytes, force: bool = False) -> Path:
    """Temp file + fsync + link (or rename with `force`): readers never see half a file,
    and an existing file is never replaced silently. A replaced file keeps its mode."""
    path = Path(path)
    if path.exists() and not force:
        raise RecordExistsError(f"{path} already exists; pass --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp's 0600 would hide records from teammates and change a spliced README's mode.
        os.fchmod(descriptor, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask())
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        if force:
            os.replace(temporary, path)
        else:
            # link() fails if the name was taken meanwhile: no silent overwrite race.
            try:
                os.link(temporary, path)
            except FileExistsError:
                raise RecordExistsError(f"{path} already exists; pass --force to overwrite it") from None
            os.unlink(temporary)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


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
