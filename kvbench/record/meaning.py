"""What a record means: the checks after the JSON schema.

A record is held to what kvbench itself would have written: a config the model
accepts, known modes only, checks whose verdicts agree with their own numbers and
with the config, bytes that equal the formula for every timed cell, a protocol that
agrees with the run, a summary recomputed from the raw repetitions and nothing more.
Each check returns the first problem as one sentence, or None.
"""

from __future__ import annotations

import math

from kvbench.config import PlainConfig
from kvbench.kinds import DRIFT_METRICS, REFERENCE_NOT_FINITE, within_limits
from kvbench.models.hf import hf_architecture
from kvbench.modes import CONTROL, FULL_PREFIX, PLUGIN, RUNNABLE, TRANSFORMERS, expected_bytes, source_of
from kvbench.record.needle import check_needle
from kvbench.record.summary import by_cell, summarize


class RecordError(ValueError):
    """A record file that cannot be read, or that does not match the schema."""


def record_config(record: dict) -> PlainConfig:
    return PlainConfig.from_dict(record["config"])


def check_run(record: dict) -> str | None:
    try:
        config = record_config(record)
    except ValueError as error:
        return f"config: {error}"
    run = record["run"]
    known = [*RUNNABLE, *(kind for plugin in run["plugins"] for kind in plugin["kinds"])]
    unknown = [mode for mode in run["modes"] if mode not in known]
    if unknown:
        return f"run/modes: unknown mode {unknown[0]!r}; expected modes among {known} (plugins declare theirs)"
    for mode in (mode for mode in run["modes"] if source_of(mode) == TRANSFORMERS):
        try:
            hf_architecture(config)  # the rule `kvbench run` refuses such a mode by
        except ValueError as error:
            return f"run/modes: {mode} runs transformers' twin of the model, and {error}"
    control = run["control"]
    if control is not None and (control not in run["modes"] or source_of(control) == FULL_PREFIX):
        return f"run/control: the A/A control repeats a cached mode of run.modes {run['modes']}, got {control!r}"
    protocol = record["protocol"]
    for name in ("repeats", "warmup", "batch", "seed", "threads", "per_step_length"):
        if name in protocol and name in run and protocol[name] != run[name]:
            return f"protocol/{name} is {protocol[name]!r}, but run/{name} is {run[name]!r}: one run has one protocol"
    too_long = [length for length in [*run["lengths"], run["per_step_length"] or 0] if length > config.max_length]
    if too_long:
        return f"run/lengths: length {too_long[0]} exceeds the config's max_length {config.max_length}"
    return None


def _outside(record: dict, section: str, entries: list[dict]) -> str | None:
    run = record["run"]
    for index, entry in enumerate(entries):
        if entry["mode"] not in run["modes"] or entry["length"] not in run["lengths"]:
            return (f"{section}/{index}: mode {entry['mode']!r} at length {entry['length']} is outside "
                    f"run.modes {run['modes']} x run.lengths {run['lengths']}")
    if len(by_cell(entries)) != len(entries):
        return f"{section}: a (mode, length) cell appears twice"
    return None


def entries(section: str, check_entry):
    """A check over one per-cell section: every entry inside the grid, once, and sound by `check_entry`."""
    def check(record: dict) -> str | None:
        problem = _outside(record, section, record[section])
        for index, entry in enumerate(record[section]):
            if problem:
                break
            problem = check_entry(record, entry, f"{section}/{index} ({entry['mode']} at length {entry['length']})")
        return problem

    return check


def sound_check(record: dict, check: dict, where: str) -> str | None:
    if "error" in check:
        return f"{where}: passed is true, but the check carries an error" if check["passed"] else None
    problem = sound_failure(check, where)
    if problem:
        return problem
    if check["max_abs_diff"] is None or check["max_rel_diff"] is None:
        return f"{where}: differences are null without an error"
    if check.get("exact", True) is False:
        return sound_drift(check, where)
    position, non_finite = check["first_divergent_position"], check.get("non_finite", 0) + check.get("reference_non_finite", 0)
    if check["passed"] and (position is not None or non_finite):
        return f"{where}: passed is true, but it diverges at position {position} with {non_finite} non-finite logits"
    if check.get("dtype", record["config"]["dtype"]) != record["config"]["dtype"]:
        return f"{where}: the check compared {check['dtype']} logits, but the config's dtype is {record['config']['dtype']}"
    largest = check.get("reference_max_abs")
    if check["passed"] and largest is not None and check["max_abs_diff"] > (check["atol"] + check["rtol"] * largest) * (1 + 1e-9):
        return (f"{where}: passed is true, but max_abs_diff {check['max_abs_diff']:.3g} exceeds its tolerance "
                f"atol {check['atol']:g} + rtol {check['rtol']:g} * {largest:.3g} (the largest |logit|)")
    used = check.get("tolerance_used")
    if used is not None and check["passed"] != (used <= 1 and not non_finite):
        return (f"{where}: passed is {str(check['passed']).lower()}, but its largest difference uses "
                f"{used:.3g} times its tolerance (atol {check['atol']:g} + rtol {check['rtol']:g} * |logit|)")
    if not check["passed"] and (position is None or position >= check["length"]):
        return f"{where}: failed without a diverging position in [0, {check['length'] - 1}], got {position}"
    return None


def sound_failure(check: dict, where: str) -> str | None:
    """The failure named (records before it name none) agrees with the verdict and the counts."""
    if "failure" not in check:
        return None
    failure, passed = check["failure"], check["passed"]
    if passed != (failure is None):
        return f"{where}: passed is {str(passed).lower()}, but its failure is {failure!r}"
    if (failure == REFERENCE_NOT_FINITE) != bool(check.get("reference_non_finite", 0)):
        return (f"{where}: failure {failure!r} with {check.get('reference_non_finite', 0)} non-finite reference "
                "logits: a non-finite reference is the failure named first")
    return None


def sound_drift(check: dict, where: str) -> str | None:
    """A lossy kind's check: its verdict must be what its own limits say of its own metrics."""
    limits = check.get("limits")
    if not isinstance(limits, dict) or not limits or set(limits) - set(DRIFT_METRICS):
        return f"{where}: a drift check names its limits among {sorted(DRIFT_METRICS)}, got {limits!r}"
    missing = [name for name in (*DRIFT_METRICS, "non_finite") if not isinstance(check.get(name), (int, float))]
    if missing:
        return f"{where}: a drift check reports {missing[0]} as a number"
    disagreements = check.get("top1_disagreements")
    if disagreements is not None and (disagreements == 0) != (check["top1_agreement"] == 1):
        return (f"{where}: top1_disagreements is {disagreements}, but top1_agreement is "
                f"{check['top1_agreement']:.4g}: every step agrees exactly when none disagrees")
    if check["passed"] != within_limits(check, limits):
        return f"{where}: passed is {str(check['passed']).lower()}, but its drift against its limits {limits} says otherwise"
    return None


def sound_memory(record: dict, entry: dict, where: str) -> str | None:
    mode, options = entry["mode"], record["run"]["cache_options"].get(entry["mode"], {})  # a kind without options: none
    formula = entry["expected_bytes"]  # a plugin's kind: its formula is the plugin's, unknown here
    if source_of(mode) != PLUGIN:  # transformers' caches: what was measured
        formula = expected_bytes(mode, record_config(record), record["run"]["batch"], entry["length"],
                                 measured=entry["expected_bytes"], **options)
    if entry["expected_bytes"] != formula:
        return f"{where}: expected_bytes is {entry['expected_bytes']}, but the formula gives {formula}"
    if entry["measured_bytes"] != formula:
        return f"{where}: measured_bytes {entry['measured_bytes']} contradicts the formula's {formula}"
    if entry["reserved_bytes"] < entry["measured_bytes"]:
        return f"{where}: reserved_bytes {entry['reserved_bytes']} is below measured_bytes {entry['measured_bytes']}"
    if entry.get("quantized_positions", 0) > entry["length"]:
        return (f"{where}: quantized_positions {entry['quantized_positions']} exceeds the {entry['length']} "
                "positions the cache held")
    return None


check_checks = entries("checks", sound_check)
check_memory_entries = entries("memory", sound_memory)


def check_memory(record: dict) -> str | None:
    """Every entry sound, and every timed cell measured: memory is measured before timing starts."""
    problem = check_memory_entries(record)
    measured = by_cell(record["memory"])
    for rep in record["repetitions"]:
        if problem:
            break
        if rep["mode"] != CONTROL and (rep["mode"], rep["length"]) not in measured:
            problem = f"mode {rep['mode']!r} at length {rep['length']} was timed, but memory has no entry for it"
    return problem


def labels(record: dict) -> list[str]:
    """The labels timed: the run's modes, and the A/A control when there is one."""
    control = record["run"]["control"]
    return [*record["run"]["modes"], *([CONTROL] if control else [])]


def planned_rotations(record: dict) -> dict[int, int]:
    """length -> rotations every label there must have in a complete record."""
    return {entry["length"]: entry["rotations"] for entry in record["sampling"]["lengths"]}


def check_repetitions(record: dict) -> str | None:
    run, timed = record["run"], labels(record)
    expected_cells = {(m, n) for m in timed for n in run["lengths"]}
    seen: dict[tuple[str, int], int] = {}
    indices: set[tuple[str, int, int]] = set()
    for rep in record["repetitions"]:
        key = (rep["mode"], rep["length"])
        if key not in expected_cells:
            return f"repetition for mode {key[0]!r} at length {key[1]} is outside the modes {timed} x run.lengths {run['lengths']}"
        if rep["order"] >= len(timed):
            return f"repetition for mode {key[0]!r} at length {key[1]} has order {rep['order']}, but only {len(timed)} modes ran"
        seen[key] = seen.get(key, 0) + 1
        index = (*key, rep["repetition"])
        if index in indices:  # the report pairs modes by repetition index: it must be unique
            return f"mode {key[0]!r} at length {key[1]} has repetition {rep['repetition']} twice"
        indices.add(index)
    if record["status"] == "complete":
        untimeable = {key for key, check in by_cell(record["checks"]).items() if "error" in check}
        untimeable |= {(CONTROL, n) for (mode, n) in untimeable if mode == run["control"]}
        rotations = planned_rotations(record)
        for mode, length in sorted(expected_cells - untimeable):
            found, planned = seen.get((mode, length), 0), rotations.get(length, run["repeats"])
            if found != planned:
                return f"mode {mode!r} at length {length}: expected {planned} repetitions, found {found}"
    return None


def check_sampling(record: dict) -> str | None:
    """One entry per length run, at least run.repeats rotations unless cut short."""
    run, seen = record["run"], set()
    for entry in record["sampling"]["lengths"]:
        length = entry["length"]
        if length not in run["lengths"] or length in seen:
            return f"sampling: length {length} is not one of run.lengths {run['lengths']}, or appears twice"
        seen.add(length)
        if entry["stop"] not in ("interrupted", "budget") and entry["rotations"] < run["repeats"]:
            return (f"sampling: length {length} stopped ({entry['stop']}) after {entry['rotations']} rotations, "
                    f"fewer than run.repeats {run['repeats']}")
    if record["status"] == "complete" and seen != set(run["lengths"]):
        return f"sampling: a complete record has an entry for every length {run['lengths']}, found {sorted(seen)}"
    return None


def check_per_step(record: dict) -> str | None:
    run = record["run"]
    for entry in record.get("per_step", []):
        if entry["mode"] not in run["modes"]:
            return f"per_step entry for mode {entry['mode']!r} is outside run.modes {run['modes']}"
        if run["per_step_length"] is not None and entry["length"] != run["per_step_length"]:
            return (f"per_step entry for mode {entry['mode']!r} has length {entry['length']}, "
                    f"but run.per_step_length is {run['per_step_length']}")
        if len(entry["seconds"]) != entry["length"]:
            return (f"per_step for mode {entry['mode']!r} at length {entry['length']} "
                    f"has {len(entry['seconds'])} step durations, expected {entry['length']}")
    return None


def check_summary(record: dict) -> str | None:
    """The summary must be exactly what the repetitions and checks give: no cell more, none less."""
    summary = record["summary"]
    try:
        recomputed = summarize(record["repetitions"], record["checks"], summary["baseline"], record["run"]["control"],
                               summary["estimator"], summary["interval"], summary["between_run"],
                               (summary["estimation"] or {}).get("rule"), record["run"]["threads"],
                               record["run"]["workload"], record["run"]["batch"])
    except ArithmeticError as error:
        return f"summary: its repetitions cannot be summarized ({error})"
    sections = [("cells", ("median", "min", "max", "q1", "q3", "repetitions", "per_token_median")),
                ("speedups", ("speedup",))]
    if summary["estimator"] is not None:
        sections = [sections[0], ("speedups", ("speedup", "low", "high", "pairs")),
                    ("controls", ("ratio", "low", "high", "pairs"))]
    if summary["estimation"] != recomputed["estimation"]:
        return (f"summary/estimation is {summary['estimation']}, but the telemetry of its repetitions gives "
                f"{recomputed['estimation']}")
    if not close(summary.get("latency"), recomputed.get("latency")):
        return (f"summary/latency is not what the repetitions give: recorded {str(summary.get('latency'))[:200]}, "
                f"recomputed {str(recomputed.get('latency'))[:200]}")
    for section, stats in sections:
        stored, derived = by_cell(record["summary"][section]), by_cell(recomputed[section])
        extra = sorted(set(stored) - set(derived))
        if extra:
            mode, length = extra[0]
            return f"summary has a {section[:-1]} for mode {mode!r} at length {length}, which its repetitions do not give"
        for key, mine in derived.items():
            theirs = stored.get(key)
            where = f"mode {key[0]!r} at length {key[1]}"
            if theirs is None:
                return f"summary has no {section[:-1]} for {where}"
            for stat in stats:
                if not close(theirs[stat], mine[stat]):  # a stored value of another type differs, never crashes
                    return f"summary {stat} for {where} is {theirs[stat]}, but its repetitions give {mine[stat]}"
            if "valid" in mine and theirs["valid"] != mine["valid"]:
                return f"summary marks {where} valid={theirs['valid']}, but its check gives valid={mine['valid']}"
    return None


def close(a: object, b: object) -> bool:
    """Equal, numbers within rounding (a summary recomputed on load sums floats in the same order, but
    a JSON round trip may print the last digit differently)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-9,
                                                                                            abs_tol=1e-15)
    return a == b


def check_workload(record: dict) -> str | None:
    """A request run's repetitions each time exactly its prompt's prefill and generate - 1 steps; a contexts
    run's, its warm-up and timed steps."""
    workload = record["run"]["workload"]
    if workload["kind"] == "contexts":
        return check_context_steps(record, workload)
    if workload["kind"] != "request":
        return None
    if record["run"]["lengths"] != [workload["prompt"] + workload["generate"] - 1]:
        return (f"run/lengths is {record['run']['lengths']}, but a request of {workload['prompt']} + "
                f"{workload['generate']} tokens holds {workload['prompt'] + workload['generate'] - 1} positions")
    for index, rep in enumerate(record["repetitions"]):
        steps = rep.get("step_seconds")
        if rep.get("ttft_seconds") is None or steps is None or len(steps) != workload["generate"] - 1:
            return (f"repetitions/{index}: a request of {workload['generate']} tokens times a prefill and "
                    f"{workload['generate'] - 1} steps, got {'no ' if steps is None else len(steps)} steps")
        if rep["ttft_seconds"] + sum(steps) > rep["seconds"] * (1 + 1e-9) + 1e-9:
            return f"repetitions/{index}: its steps add up to more than the request's {rep['seconds']} s"
    return None


def check_context_steps(record: dict, workload: dict) -> str | None:
    """Since contexts runs time a window of steps: every repetition keeps each warm-up and timed step, and the
    timed ones fit in the sample (records from before keep none, and say so by having no step counts)."""
    if "timed_steps" not in workload:
        return None
    warmup, timed = workload.get("warmup_steps", 0), workload["timed_steps"]
    for index, rep in enumerate(record["repetitions"]):
        steps = rep.get("step_seconds")
        if steps is None or len(steps) != warmup + timed:
            return (f"repetitions/{index}: a contexts run of {warmup} warm-up and {timed} timed steps keeps "
                    f"{warmup + timed} step durations, got {'none' if steps is None else len(steps)}")
        if sum(steps[warmup:]) > rep["seconds"] * (1 + 1e-9) + 1e-9:
            return f"repetitions/{index}: its timed steps add up to more than the sample's {rep['seconds']} s"
    return None


def check_machine_probe(record: dict) -> str | None:
    """Each phase of the probe times exactly the calls it names (under its "workloads" key), `repeats` times each."""
    probe = record.get("machine_probe")
    if probe is None:
        return None
    for phase in ("start", "end"):
        timed = probe.get(phase)
        if timed is None:
            continue
        if set(timed) != set(probe["workloads"]):
            return f"machine_probe/{phase} times {sorted(timed)}, but the probe names {sorted(probe['workloads'])}"
        short = [name for name, seconds in timed.items() if len(seconds) != probe["repeats"]]
        if short:
            return f"machine_probe/{phase}/{short[0]}: {len(timed[short[0]])} samples, the probe takes {probe['repeats']}"
    return None


MEANING_CHECKS = (check_run, check_workload, check_checks, check_sampling, check_repetitions, check_memory,
                  check_per_step, check_summary, check_machine_probe, check_needle)
