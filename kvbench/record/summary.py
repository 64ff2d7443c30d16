"""What a record derives from its raw repetitions: per-cell statistics and speedups.

Kept apart from the schema so that writing a record and checking one loaded from disk
compute the summary with the same code.
"""

from __future__ import annotations

import statistics

from kvbench.measure import estimation as clocks
from kvbench.measure import latency, stats
from kvbench.modes import CONTROL
from kvbench.record.entries import CellKey


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


def samples_by_cell(repetitions: list[dict]) -> dict[CellKey, dict[int, float]]:
    """{(mode, length): {repetition: seconds}}, cells in the order their first sample ran."""
    cells: dict[CellKey, dict[int, float]] = {}
    for rep in repetitions:
        cells.setdefault(CellKey.of(rep), {})[rep["repetition"]] = rep["seconds"]
    return cells


def by_cell(entries: list[dict]) -> dict[CellKey, dict]:
    """{(mode, length): entry} for a list of per-cell entries (checks, memory, summary cells)."""
    return {CellKey.of(entry): entry for entry in entries}


def summarize(repetitions: list[dict], checks: list[dict], baseline: str = "full", control: str | None = None,
              estimator: str | None = None, interval: str | None = None, between_run: dict | None = None,
              rule: str | None = None, threads: int = 1, workload: dict | None = None, batch: int = 1) -> dict:
    """Per (label, length): median, min, max, quartiles; per length and label: the speedup over the
    baseline; per length: the A/A control's ratio.

    A cell is valid only when its mode passed the equivalence gate at that length (the control
    label is its mode's twin); a speedup is valid only when both of its cells are. With no
    `estimator` (records of schema 1) a speedup is the ratio of medians, without an interval.
    `between_run` ({"speedup": SD, "seconds": SD}) widens the speedup intervals for what varies
    from one run to the next; None for records written before it was recorded (no widening).
    With a `rule` (kvbench.measure.estimation.RULE) each length's speedups are estimated on the clock its
    samples' telemetry chose; without one (records written before it), on wall time. A request
    `workload` adds each mode's latency figures (kvbench.measure.latency) and its TTFT and TPOT against the
    baseline's.
    """
    passed = {key: check["passed"] for key, check in by_cell(checks).items()}
    samples = samples_by_cell(repetitions)

    def valid(label: str, length: int) -> bool:
        return passed.get((control if label == CONTROL else label, length), False)

    cells = []
    for (label, length), seconds in samples.items():
        statistics_ = cell_statistics(list(seconds.values()))
        statistics_["per_token_median"] = statistics_["median"] / length
        cells.append({"mode": label, "length": length, **statistics_, "valid": valid(label, length)})
    chosen = clocks.by_length(repetitions, threads, estimator) if rule and estimator else {}
    timed = {clock: clocks.series(repetitions, clock) for clock in {c.clock for c in chosen.values()}}

    def on_clock(label: str, length: int) -> dict[int, float]:
        return timed[chosen[length].clock][(label, length)] if length in chosen else samples[(label, length)]

    by_key = by_cell(cells)
    speedups = []
    for cell in cells:
        label, length = cell["mode"], cell["length"]
        base = by_key.get((baseline, length))
        if label == baseline or base is None:
            continue
        entry = {"mode": label, "length": length, "speedup": base["median"] / cell["median"],
                 "valid": cell["valid"] and base["valid"], "low": None, "high": None, "pairs": None}
        if estimator is not None:
            estimate = stats.speedup(on_clock(baseline, length), on_clock(label, length), estimator=estimator,
                                     interval=interval, between_run=(between_run or {}).get("speedup", 0.0),
                                     key=(label, length))
            entry.update(speedup=estimate.ratio, low=estimate.low, high=estimate.high, pairs=estimate.pairs)
        speedups.append(entry)
    summary = {"baseline": baseline, "cells": cells, "speedups": speedups, "estimator": estimator,
               "interval": interval, "controls": [], "between_run": None, "estimation": None}
    if estimator is not None:
        summary["controls"] = control_ratios(samples, control, estimator, control_interval(interval, between_run),
                                             on_clock)
        if between_run is not None:
            summary["between_run"] = dict(between_run)
        if rule is not None:
            summary["estimation"] = {"rule": rule, "lengths": [chosen[n].to_dict() for n in sorted(chosen)]}
    if (workload or {}).get("kind") == "request":
        summary["latency"] = request_latency(repetitions, baseline, batch, (between_run or {}).get("speedup", 0.0))
    return summary


def request_latency(repetitions: list[dict], baseline: str, batch: int, between_run: float) -> list[dict]:
    """Per (label, length): the latency figures of its sampled requests, and TTFT and TPOT ratios to the baseline."""
    by_label: dict[tuple[str, int], list[dict]] = {}
    for rep in repetitions:
        by_label.setdefault((rep["mode"], rep["length"]), []).append(rep)
    out = []
    for (label, length), reps in by_label.items():
        entry = {"mode": label, "length": length, **latency.mode_latency(reps, batch), "ratios": {}}
        base = by_label.get((baseline, length))
        if label != baseline and base:
            for name in latency.RATIOS:
                estimate = latency.ratio_to_baseline(base, reps, name, between_run, key=(label, length))
                if estimate is not None:
                    entry["ratios"][name] = {"ratio": estimate.ratio, "low": estimate.low, "high": estimate.high,
                                             "pairs": estimate.pairs}
        out.append(entry)
    return out


def control_interval(interval: str, between_run: dict | None) -> str:
    """The A/A control's interval: from this run's samples alone ("within") when the run records what varies
    between runs, since the allowance is the same for every run and says nothing of this one's noise; else the
    speedups' own. The writer and every reader ask here."""
    return "within" if between_run else interval


def control_ratios(samples: dict, control: str | None, estimator: str, interval: str, on_clock=None) -> list[dict]:
    """Per length, the A/A ratio mode / control: the same code under two labels, so 1 but for noise.
    Its interval, from this run's samples alone, is what the run can resolve at that length: its
    noise floor (the between-run allowance, the same for every run, is not added). `on_clock(label,
    length)` gives the samples on the length's chosen clock (default: wall time)."""
    if control is None:
        return []
    on_clock = on_clock or (lambda label, length: samples[(label, length)])
    out = []
    for (label, length), seconds in samples.items():
        if label == CONTROL and (control, length) in samples:
            estimate = stats.speedup(on_clock(control, length), on_clock(label, length), estimator=estimator,
                                     interval=interval, between_run=0.0, key=("aa", length))
            out.append({"mode": control, "length": length, "ratio": estimate.ratio, "low": estimate.low,
                        "high": estimate.high, "pairs": estimate.pairs})
    return out
