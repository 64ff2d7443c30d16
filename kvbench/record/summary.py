"""What a record derives from its raw repetitions: per-cell statistics and speedups.

Kept apart from the schema so that writing a record and checking one loaded from disk
compute the summary with the same code.
"""

from __future__ import annotations

import statistics


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
