"""A real model's retrieval in a report: each mode's accuracy and mean answer log-probability against full's, the
safe ratios, and each mode's grid of cells (a table here; the HTML report draws it as a heat map,
kvbench.report.record.heatmap). Read from the record's `needle` section (kvbench.workloads.needle wrote it)."""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.record import RecordView

NEEDLE_COLUMNS = ["mode", "accuracy", "correct", "answer log-prob (95% CI)", "Δ vs full (95% CI)"]
NEEDLE_SENTENCE = ("A 4-digit code (\"{needle}\") hidden at each depth of corpus contexts of each length (the "
                   "model's tokens), given to the cache in one call, then the question one token a step: accuracy = "
                   "share of cells whose greedy answer ({extra} tokens past the answer's) starts with the code; "
                   "answer log-prob = sum of the log-softmax of the answer's tokens teacher-forced after the "
                   "question, nats, mean over the cells with its 95% t interval; Δ = the same, paired by cell, "
                   "minus full's")


@dataclass(frozen=True)
class NeedleRow:
    label: str
    mode: str
    accuracy: float
    correct: int
    cells: int
    logprob: dict  # mean, low, high
    difference: dict | None  # against full's, paired by cell (None: full's own row)
    grid: dict  # (context, depth) -> (log-prob, correct)


@dataclass(frozen=True)
class Needle:
    rows: list[NeedleRow]
    contexts: list[int]
    depths: list[int]
    note: str
    safe: list[str]  # one sentence per kind run at several ratios


def needle_summary(view: RecordView) -> Needle | None:
    section = view.needle
    if not section:
        return None
    rows = [NeedleRow(entry["label"], entry["mode"], entry["accuracy"], entry["correct"], len(entry["cells"]),
                      entry["logprob"], entry.get("logprob_difference"),
                      {(cell["context"], cell["depth"]): (cell["logprob"], cell["correct"]) for cell in entry["cells"]})
             for entry in section["modes"]]
    return Needle(rows, section["contexts"], section["depths"], needle_note(section), safe_sentences(section))


def needle_note(section: dict) -> str:
    contexts = ", ".join(map(str, section["contexts"]))
    depths = ", ".join(f"{depth}%" for depth in section["depths"])
    return (NEEDLE_SENTENCE.format(needle=section.get("needle", "").strip().format(code="NNNN"),
                                   extra=section.get("extra", 0))
            + f". Contexts {contexts} tokens; depths {depths}; {len(section['contexts']) * len(section['depths'])} "
              "cells per mode")


def safe_sentences(section: dict) -> list[str]:
    accuracy, logprob = section.get("accuracy_loss", 0.01), section.get("logprob_loss", 0.1)
    out = []
    for entry in section["safe_ratios"]:
        tried = ", ".join(f"{ratio:g}" for ratio in entry["ratios"])
        verdict = ("none of them" if entry["safe_ratio"] is None else f"evict_ratio {entry['safe_ratio']:g}")
        points = f"{accuracy * 100:g} point{'' if accuracy == 0.01 else 's'}"
        out.append(f"{entry['mode']}: of evict_ratio {tried}, the largest losing at most {points} of accuracy and "
                   f"{logprob:g} nats of mean answer log-prob against full: {verdict}")
    return out


def interval_text(found: dict | None, signed: bool = False) -> str:
    if found is None:
        return "baseline"
    sign = "+" if signed else ""
    if found["low"] is None:
        return f"{found['mean']:{sign}.3f}"
    return f"{found['mean']:{sign}.3f} [{found['low']:{sign}.3f}, {found['high']:{sign}.3f}]"


def needle_cells(row: NeedleRow) -> list[str]:
    return [row.label, f"{row.accuracy:.0%}", f"{row.correct} of {row.cells}", interval_text(row.logprob),
            interval_text(row.difference, signed=True)]


def grid_columns(needle: Needle) -> list[str]:
    return ["mode", "context", *(f"depth {depth}%" for depth in needle.depths)]


def grid_cells(needle: Needle) -> list[list[str]]:
    """Per mode and context, each depth's cell: ✓ or ✗, then the answer's log-prob."""
    out = []
    for row in needle.rows:
        for context in needle.contexts:
            found = [row.grid.get((context, depth)) for depth in needle.depths]
            out.append([row.label, str(context), *("" if cell is None else f"{'✓' if cell[1] else '✗'} {cell[0]:.2f}"
                                                   for cell in found)])
    return out
