"""Older records brought to the current shape on load, in one place: a chain of pure functions.

Each step takes a record of one version (already checked against that version's JSON schema)
and returns a new dict of the next version; the input is never modified. A step fills only what
the newer kvbench always writes and the older one did not, with the value that states what the
older run did (never a measurement it did not make), so the upgraded record passes the current
schema and the meaning checks like a record written today, and readers default nothing.

What stays optional in the current schema is optional by workload, not by age: `per_step`
(a run with a profile), `limits` (request and contexts runs, since 2026-12-01), `machine_probe`
(runs since 2026-12-01), `summary.latency` (request runs), a repetition's `ttft_seconds` and
`step_seconds`, a contexts workload's `warmup_steps` and `timed_steps` (since 2026-12-03);
RecordView presents each as None (or empty) where a run has none. Schema 4 added the serving workload, whose
record keeps the common envelope and its own cells (kvbench.record.serving); a serving run's own format
(kvbench.serving/1) is upgraded to it by `serving_to_v4`.
"""

from __future__ import annotations

import copy

import kvbench.record.serving as serving
from kvbench.record.entries import TELEMETRY
from kvbench.record.meaning import RecordError

V1, V2, V3, V4 = "kvbench.record/1", "kvbench.record/2", "kvbench.record/3", serving.V4
# What schema 2 left optional and schema 3 requires, which v2_to_v3 fills: the run's keys (complete_run), these
# of the summary, and each cell's per-token median.
LATER_SUMMARY = ("baseline", "between_run", "estimation")
LATER_CELL = "per_token_median"


def v1_to_v2(record: dict) -> dict:
    """Schema 1 (fixed repetitions, no telemetry, speedups as ratios of medians) to schema 2's shape.

    - `sampling`: what the fixed protocol did: every length ran run.repeats rotations ("fixed"), or,
      in an incomplete record, the rotations its repetitions show ("interrupted"); no half-width, no
      telemetry ("not recorded before schema 2").
    - each repetition: its `round` is its repetition index (one rotation per round under the fixed
      protocol); `started` is null (schema 1 did not record when a sample started: /3 allows null
      for that reason alone) and every telemetry counter is null (unavailable).
    - `summary`: `estimator`, `interval` null and `controls` empty (schema 1 estimated no interval
      and ran no A/A control: a reader keeps reporting the ratio of medians); each speedup's `low`,
      `high` and `pairs` null for the same reason.
    """
    out = copy.deepcopy(record)
    out["schema"] = V2
    run = out["run"]
    complete = out["status"] == "complete"
    seen: dict[int, int] = {}
    for rep in out["repetitions"]:
        seen[rep["length"]] = max(seen.get(rep["length"], 0), rep["repetition"] + 1)
        rep.setdefault("round", rep["repetition"])
        rep.setdefault("started", None)
        for name in TELEMETRY:
            rep.setdefault(name, None)
    out["sampling"] = {
        "lengths": [{"length": length, "rotations": run["repeats"] if complete else seen.get(length, 0),
                     "stop": "fixed" if complete else "interrupted", "half_width": None}
                    for length in run["lengths"] if complete or length in seen],
        "telemetry": {"unavailable": dict.fromkeys(TELEMETRY, "not recorded before kvbench.record/2"),
                      "per_sample_seconds": None}}
    summary = out["summary"]
    summary.update(estimator=None, interval=None, controls=[])
    for speedup in summary["speedups"]:
        speedup.update(low=None, high=None, pairs=None)
    return out


def v2_to_v3(record: dict) -> dict:
    """Schema 2 (its sections added over time) to schema 3, where every section a run of today writes is there.

    - run: `workload` {"kind": "loop"} (before 2026-12-01 every run was the loop), `control` null (no A/A
      control before it), `plugins` [] and `cache_options` {} (none before them), `per_step_length` null.
    - summary: `baseline` "full" (the only baseline before it was recorded); `between_run` and `estimation`
      null (not recorded: the speedup intervals were not widened, and every length was estimated on wall
      time); each cell's `per_token_median`, its median / its length (derived, as the summary is).
    """
    out = copy.deepcopy(record)
    out["schema"] = V3
    out["run"] = complete_run(out["run"])
    summary = out["summary"]
    summary.setdefault("baseline", "full")
    summary.setdefault("between_run", None)
    summary.setdefault("estimation", None)
    for cell in (cell for cell in summary.get("cells", ()) if isinstance(cell, dict)):  # else: the schema says
        # Derived only from a numeric median and a positive integer length: anything else (a length of 0, none,
        # a string) is left for the schema or the summary's check to name, never divided by.
        median, length = cell.get("median"), cell.get("length")
        numeric = isinstance(median, (int, float)) and not isinstance(median, bool)
        counted = isinstance(length, int) and not isinstance(length, bool) and length > 0
        cell.setdefault(LATER_CELL, median / length if numeric and counted else None)
    return out


def complete_run(run: dict) -> dict:
    """The run section with every key schema 3 requires: a run that names no workload ran the loop, one that
    names no control, plugins or cache options had none (what kvbench did before it could name them)."""
    return {"workload": {"kind": "loop"}, "control": None, "plugins": [], "cache_options": {},
            "per_step_length": None, **run}


def v3_to_v4(record: dict) -> dict:
    """Schema 3 to schema 4, which added the serving workload (its cells keyed by trace and budget, its
    `serving` section): a loop, request or contexts record of schema 3 means in schema 4 what it meant, so only
    its label changes."""
    return {**copy.deepcopy(record), "schema": V4}


def serving_to_v4(document: dict) -> dict:
    """A serving run's own format (kvbench.serving/1, until 2026-12-04) to schema 4, by the function the writer
    builds a serving record with (kvbench.record.serving.assemble): every value kept as it was measured.

    - `complete` (absent: true) becomes `status`; `created_utc` is the environment's capture time (serving/1
      kept no other), the kinds become `run.modes` and the control `run.control`;
    - each kind's check and every kept replay are keyed by the cell (mode, trace, budget) in place of the length
      0 they were sampled under; a check's length (the steps compared in its worst request) becomes `positions`;
    - `sampling`, keyed by that length 0, becomes one entry per cell; the trace, budget, settings and outputs
      go to `serving`."""
    document = copy.deepcopy(document)
    return serving.assemble(
        complete=document.get("complete", True), created_utc=document["environment"].get("timestamp_utc") or "",
        command=document.get("command", []), preset=document["preset"], config=document["config"],
        trace=document["trace"], kinds=document["kinds"], settings=document.get("settings", {}),
        budget=document["budget"], protocol=document["protocol"], environment=document["environment"],
        checks=document["checks"], control=document.get("control"),
        outputs=document.get("outputs", {"source": "not recorded"}), samples=document["samples"],
        sampling=document["sampling"])


# each version: its step and the version it gives
STEPS = {V1: (v1_to_v2, V2), V2: (v2_to_v3, V3), V3: (v3_to_v4, V4), serving.SERVING_V1: (serving_to_v4, V4)}
CURRENT = V4


def lacks_a_later_section(record: dict) -> bool:
    """Whether a record lacks a section that schema 2 left optional and schema 3 requires."""
    summary = record.get("summary")
    if not isinstance(record.get("run"), dict) or not isinstance(summary, dict):
        return False  # not a record's shape: the schema check names what is wrong
    cells = summary.get("cells") if isinstance(summary.get("cells"), list) else []
    return (not complete_run({}).keys() <= record["run"].keys()
            or not set(LATER_SUMMARY) <= summary.keys()
            or any(isinstance(cell, dict) and LATER_CELL not in cell for cell in cells))


def upgrade(record: dict) -> dict:
    """The record in the current schema: a new dict for an older one (each step in turn), the record itself
    for a current one (so upgrading is idempotent).

    A record labelled /3 that lacks a section schema 2 left optional (a file edited by hand, or one made by a
    tool that copied an older record's shape) is read as its schema 2 twin would be: v2_to_v3 fills the same
    sections the same way, so a missing workload is the loop, as it always was."""
    found = record.get("schema")
    if found not in (*STEPS, CURRENT):
        raise RecordError(f"no upgrade from schema {found!r}; expected one of {[*STEPS, CURRENT]}")
    copied = found == V3 and lacks_a_later_section(record)
    if copied:
        record = v2_to_v3(record)
    while found in STEPS:
        step, found = STEPS[found]
        # a record an earlier step made is this call's own copy: relabelling it needs no second deep copy
        record = {**record, "schema": V4} if copied and step is v3_to_v4 else step(record)
        copied = True
    return record


__all__ = ["CURRENT", "LATER_CELL", "LATER_SUMMARY", "STEPS", "complete_run", "lacks_a_later_section",
           "serving_to_v4", "upgrade", "v1_to_v2", "v2_to_v3", "v3_to_v4"]
