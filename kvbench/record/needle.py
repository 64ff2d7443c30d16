"""The record's `needle` section (kvbench.workloads.needle): its JSON schema and what its numbers must agree on.

Optional, like `quality`: a real model's run with --needle adds it, and a record without it (every record written
before it) reads as before, so the schema's version does not change. The meaning check holds each mode's
accuracy to its cells and every mode to the same grid in the same order, which the paired differences, the
report's heat maps and the safe-ratio rule read.
"""

from __future__ import annotations

import math

from kvbench.kinds import KIND_NAME

NAME = "needle"
_mode = {"type": "string", "pattern": f"^{KIND_NAME.pattern}$"}
_positive = {"type": "integer", "minimum": 1}
_count = {"type": "integer", "minimum": 0}
_depth = {"type": "integer", "minimum": 0, "maximum": 100}
_number = {"type": "number"}
_interval = {"type": "object", "required": ["mean", "low", "high"],  # the mean alone, or with both ends
             "properties": {"mean": _number, **dict.fromkeys(("low", "high"), {"type": ["number", "null"]})},
             "if": {"properties": {"low": _number}}, "then": {"properties": {"high": _number}}}


def needle_schema() -> dict:
    """needle: the grid, every mode's per-cell results and summary, and the safe ratios."""
    scalar = {"type": ["string", "number", "boolean", "null"]}
    cell = {"type": "object", "required": ["context", "depth", "answer", "generated", "correct", "logprob"],
            "properties": {"context": _positive, "depth": _depth, "answer": {"type": "string", "pattern": "^[0-9]+$"},
                           "generated": {"type": "string"}, "correct": {"type": "boolean"}, "logprob": _number,
                           "needle_at": _count, "cache_bytes": _count}}
    row = {"type": "object", "required": ["mode", "options", "label", "correct", "accuracy", "logprob", "cells"],
           "properties": {"mode": _mode, "options": {"type": "object", "additionalProperties": scalar},
                          "label": {"type": "string"}, "correct": _count,
                          "accuracy": {"type": "number", "minimum": 0, "maximum": 1}, "logprob": _interval,
                          "logprob_difference": _interval, "cells": {"type": "array", "minItems": 1, "items": cell}}}
    safe = {"type": "object", "required": ["mode", "ratios", "safe_ratio"],
            "properties": {"mode": _mode, "ratios": {"type": "array", "minItems": 2, "items": _number},
                           "safe_ratio": {"type": ["number", "null"]}}}
    return {"type": "object", "required": ["contexts", "depths", "modes", "safe_ratios"],
            "properties": {"contexts": {"type": "array", "minItems": 1, "items": _positive},
                           "depths": {"type": "array", "minItems": 1, "items": _depth},
                           **dict.fromkeys(("needle", "question", "answer"), {"type": "string"}), "extra": _count,
                           **dict.fromkeys(("accuracy_loss", "logprob_loss"), {"type": "number", "minimum": 0}),
                           "modes": {"type": "array", "minItems": 1, "items": row},
                           "safe_ratios": {"type": "array", "items": safe}}}


def check_needle(record: dict) -> str | None:
    """The first disagreement in the needle section (None: none, or no section): a mode's count or accuracy
    against its cells, a mode's cells against the grid or the first mode's, a safe ratio of a mode not run."""
    section = record.get(NAME)
    if section is None:
        return None
    grid = [(context, depth) for context in section["contexts"] for depth in section["depths"]]
    for index, row in enumerate(section["modes"]):
        where = f"needle/modes/{index}"
        cells = [(cell["context"], cell["depth"]) for cell in row["cells"]]
        if sorted(cells) != sorted(grid):
            return (f"{where}: expected the cells of contexts {section['contexts']} x depths {section['depths']}, "
                    f"got {cells}")
        if index and cells != [(cell["context"], cell["depth"]) for cell in section["modes"][0]["cells"]]:
            return f"{where}: expected the cells in the first mode's order (differences pair them), got {cells}"
        correct = sum(cell["correct"] for cell in row["cells"])
        if row["correct"] != correct:
            return f"{where}/correct: expected {correct}, the cells marked correct, got {row['correct']}"
        if not math.isclose(row["accuracy"], correct / len(cells), abs_tol=1e-12):
            return (f"{where}/accuracy: expected {correct} / {len(cells)} = {correct / len(cells)}, "
                    f"got {row['accuracy']}")
    run = {row["mode"] for row in section["modes"]}
    for index, entry in enumerate(section["safe_ratios"]):
        if entry["mode"] not in run:
            return (f"needle/safe_ratios/{index}/mode: expected one of the modes run {sorted(run)}, "
                    f"got {entry['mode']!r}")
    return None
