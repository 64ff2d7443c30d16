"""A serving run's record (`kvbench run --trace`): the one versioned record (kvbench.record/4) with the workload
"serving", assembled here, and checked here field by field for what its readers read. Torch-free.

A serving record holds the envelope every record holds (schema, status, created_utc, command, config, run,
protocol, environment) and, in place of a loop's grid, one cell per kind keyed by (mode, trace, budget)
(kvbench.record.entries.CellKey): `checks` (each kind's gate over the whole trace), `repetitions` (every kept
replay, its raw per-token stamps and per-iteration memory under `replay`), `sampling` (how many rotations, why they
stopped) and `serving` (the trace, the budget, each kind's settings, where the output ids came from). The figures
(kvbench.serving.figures) are derived from the stamps by every reader, never stored, so a record cannot disagree
with its own samples.

`check` runs after the schema's common checks (kvbench.record.schema.validate_record): the figures divide by
makespans, token counts and reserved bytes, the report formats bytes and reads each kind's check, the exporters
copy fields as they are; a field of the wrong type or out of range would end in a traceback, a division by zero or
a nonsense figure. A problem is one RecordError naming the source and the field
("repetitions/3/replay/requests/0/token_times/2: ..."). An interrupted record (status "incomplete") may lack a
kind's check or replays; a complete one has a replay of every kind that passed.

Records written before 2026-12-04 carry their own marker, kvbench.serving/1, and are upgraded on load
(kvbench.record.upgrade.serving_to_v4, which calls `assemble` as the writer does): `check_v1_shape` first makes
sure the upgrade has the containers it reshapes.
"""

from __future__ import annotations

import math

from kvbench.config import PlainConfig
from kvbench.kinds import KIND_NAME
from kvbench.modes import CONTROL  # a sample's mode for the A/A control's replays: not a kind
from kvbench.record.meaning import RecordError
from kvbench.record.shape import first_error
from kvbench.serving.trace import LENGTHS, SHAPES, trace_from_dict

V4 = "kvbench.record/4"
SERVING_V1 = "kvbench.serving/1"  # the serving run's own format until 2026-12-04, upgraded on load
SERVING = "serving"  # run.workload.kind
V1_TOP_LEVEL = (("kinds", list), ("samples", list), ("trace", dict), ("checks", dict), ("protocol", dict),
                ("environment", dict), ("budget", dict), ("config", dict), ("preset", str), ("sampling", dict))
TOP_LEVEL = (("command", list), ("created_utc", str), ("config", dict), ("run", dict), ("protocol", dict),
             ("environment", dict), ("checks", list), ("repetitions", list), ("sampling", dict), ("serving", dict))
RUN_FROM_PROTOCOL = ("repeats", "warmup", "batch", "seed", "threads")  # the run section's copy of the protocol's
ITERATION_COUNTS = ("running", "preempted")
ITERATION_BYTES = ("used", "reserved", "saved")
ITERATION_OPTIONAL = ("prefill_seconds", "decode_seconds", "prefill_tokens")  # absent in older records


class Malformed(ValueError):
    """One field that is wrong: where it is (a JSON path) and what is wrong with it."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"{where}: {what}")


def is_serving(record: object) -> bool:
    """A serving record of either format: kvbench.serving/1, or a record whose workload is "serving"."""
    if not isinstance(record, dict):
        return False
    workload = record.get("run", {}).get("workload") if isinstance(record.get("run"), dict) else None
    return record.get("schema") == SERVING_V1 or (isinstance(workload, dict) and workload.get("kind") == SERVING)


def trace_name(trace: dict) -> str:
    """The trace's name in a cell's key: how its lengths were drawn (chat, alpaca, fixed, uniform), or "saved" for
    a trace read from a file whose spec names no known draw (its text is not shown: it is the file's own)."""
    spec = trace.get("spec") if isinstance(trace.get("spec"), dict) else {}
    lengths = spec.get("lengths")
    return lengths if isinstance(lengths, str) and lengths in (*LENGTHS, *SHAPES) else "saved"


def assemble(*, complete: bool, created_utc: str, command: list, preset: str, config: dict, trace: dict,
             kinds: list, settings: dict, budget: dict, protocol: dict, environment: dict, checks: dict,
             control: str | None, outputs: dict, samples: list[dict], sampling: dict,
             sweep: dict | None = None, sections: dict | None = None) -> dict:
    """The record of a serving run from its parts (the writer's, or a kvbench.serving/1 document's): each kind's
    check and every replay keyed by its cell (mode, trace, budget) instead of the length 0 they were sampled
    under, and the run section every record has, copied from the protocol (a serving run has no lengths).
    `sections`: a trained model's `model` and `token_ids`, as a timed run records them."""
    key = {"trace": trace_name(trace), "budget": budget.get("bytes")}
    unkeyed = lambda entry: {name: value for name, value in entry.items()  # noqa: E731
                             if name not in ("length", "mode")}
    return {
        "schema": V4, "status": "complete" if complete else "incomplete", "created_utc": created_utc,
        "command": list(command), "config": config,
        "run": {"preset": preset, "workload": {"kind": SERVING, "trace": key["trace"]}, "modes": list(kinds),
                "lengths": [], "control": control, **{name: protocol.get(name) for name in RUN_FROM_PROTOCOL},
                "plugins": [], "cache_options": {}, "per_step_length": None},
        "protocol": protocol, "environment": environment,
        # a check's "length" is the steps compared in the request whose logits differed most (its worst request's
        # check, kvbench.serving.replay.gate): no cell length, so kept by a name of its own
        "checks": [{"mode": mode, **key, "positions": check.get("length"), **unkeyed(check)}
                   for mode, check in checks.items()],
        "repetitions": [{"mode": sample.get("mode"), **key, **unkeyed(sample)} for sample in samples],
        "sampling": {"cells": [{**key, **unkeyed(entry)} for entry in sampling.values()]},
        "serving": {"trace": trace, "budget": budget, "settings": settings, "outputs": outputs,
                    **({"sweep": sweep} if sweep is not None else {})},
        **(sections or {}),
    }


def check_v1_shape(document: dict, source: object) -> None:
    """What the upgrade of a kvbench.serving/1 document reshapes is there with its type: else RecordError naming
    the field (the values inside are checked once upgraded, by `check`)."""
    try:
        for key, kind in V1_TOP_LEVEL:
            of_type(key, document.get(key), kind)
        for name, entries in (("checks", document["checks"].values()), ("samples", document["samples"]),
                              ("sampling", document["sampling"].values())):
            for index, entry in enumerate(entries):
                of_type(f"{name}/{index}", entry, dict)
    except Malformed as error:
        raise RecordError(f"{source}: malformed serving record ({SERVING_V1!r}): {error}") from None


def check(record: dict, environment_schema: dict, source: object) -> dict:
    """The record, when it is a sound serving record; else RecordError naming the source and the first wrong
    field. `environment_schema`: a loop record's (kvbench.record.schema.environment_schema)."""
    try:
        check_document(record, environment_schema)
    except Malformed as error:
        raise RecordError(f"{source}: malformed serving record: {error}") from None
    return record


def check_document(record: dict, environment_schema: dict) -> None:
    for key, kind in TOP_LEVEL:
        of_type(key, record.get(key), kind)
    if record.get("status") not in ("complete", "incomplete"):
        raise Malformed("status", f"expected 'complete' or 'incomplete', got {record.get('status')!r}")
    run, serving = record["run"], record["serving"]
    for key, kind in (("trace", dict), ("budget", dict), ("settings", dict), ("outputs", dict)):
        of_type(f"serving/{key}", serving.get(key), kind)
    of_type("run/modes", run.get("modes"), list)
    kinds = check_kinds(run["modes"])
    control = run.get("control")
    if control is not None and control not in kinds:
        raise Malformed("run/control", f"expected null or one of the kinds {kinds}, got {control!r}")
    for name in RUN_FROM_PROTOCOL:
        if run.get(name) != record["protocol"].get(name):
            raise Malformed(f"run/{name}", f"expected the protocol's {record['protocol'].get(name)!r}, got "
                                           f"{run.get(name)!r}")
    if not isinstance(run.get("preset"), str):
        raise Malformed("run/preset", f"expected a preset name, got {run.get('preset')!r}")
    try:
        config = PlainConfig.from_dict(record["config"])
    except (ValueError, TypeError) as error:  # a field of the wrong type fails in the dataclass's own checks
        raise Malformed("config", str(error)) from None
    of_type("serving/trace/spec", serving["trace"].get("spec"), dict)  # a trace says how it was drawn, or read
    try:
        requests = trace_from_dict(serving["trace"], config.max_length).requests
    except ValueError as error:
        raise Malformed("serving/trace", str(error)) from None
    between = record["protocol"].get("between_run")
    if isinstance(between, bool) or not isinstance(between, (int, float)) or not 0 <= between < 0.5:
        raise Malformed("protocol/between_run", f"expected a relative standard deviation in [0, 0.5), got {between!r}")
    check_budget(serving["budget"])
    check_settings(serving["settings"])
    check_environment(record["environment"], environment_schema)
    key = {"trace": trace_name(serving["trace"]), "budget": serving["budget"]["bytes"]}
    if run.get("workload") != {"kind": SERVING, "trace": key["trace"]}:
        raise Malformed("run/workload", f"expected {{'kind': 'serving', 'trace': {key['trace']!r}}}, got "
                                        f"{run.get('workload')!r}")
    complete = record["status"] == "complete"
    checks = check_checks(record["checks"], kinds, complete, key)
    of_type("sampling/cells", record["sampling"].get("cells"), list)
    for index, entry in enumerate(record["sampling"]["cells"]):
        of_type(f"sampling/cells/{index}", entry, dict)
        check_key(f"sampling/cells/{index}", entry, key)
    replayed = check_samples(record["repetitions"], kinds, [request.output for request in requests], key)
    if complete:
        missing = [kind for kind in kinds if checks[kind]["passed"] and kind not in replayed]
        if missing:
            raise Malformed("repetitions", f"kinds {missing} passed their check but have no replay")
    if "sweep" in serving:
        check_sweep(serving["sweep"], kinds, [request.output for request in requests])


def check_sweep(sweep: object, kinds: list[str], outputs: list[int]) -> None:
    """A rate sweep or capacity search (kvbench.serving.sweep): its targets, the unloaded step, every replay at its
    rate (raw stamps, as a sampled replay's) and each search's probes."""
    from kvbench.serving.goodput import TARGETS

    of_type("serving/sweep", sweep, dict)
    for key, kind in (("targets", list), ("limits", dict), ("points", list), ("searches", dict),
                      ("unloaded", dict), ("rates", list)):
        of_type(f"serving/sweep/{key}", sweep.get(key), kind)
    for index, target in enumerate(sweep["targets"]):
        where = f"serving/sweep/targets/{index}"
        of_type(where, target, dict)
        if target.get("name") not in TARGETS or not isinstance(target.get("relative"), bool):
            raise Malformed(where, f"expected a target of {list(TARGETS)} in ms or relative, got {target!r}")
        number(f"{where}/value", target.get("value"), above=True)
    for name, limit in sweep["limits"].items():
        number(f"serving/sweep/limits/{name}", limit, above=True)
    number("serving/sweep/unloaded/step_seconds", sweep["unloaded"].get("step_seconds"), above=True)
    for index, rate in enumerate(sweep["rates"]):
        number(f"serving/sweep/rates/{index}", rate, above=True)
    for index, point in enumerate(sweep["points"]):
        where = f"serving/sweep/points/{index}"
        of_type(where, point, dict)
        if point.get("kind") not in kinds:
            raise Malformed(f"{where}/kind", f"expected one of the kinds {kinds}, got {point.get('kind')!r}")
        number(f"{where}/rate", point.get("rate"), above=True)
        of_type(f"{where}/replay", point.get("replay"), dict)
        check_replay(f"{where}/replay", point["replay"], outputs)
    for kind, search in sweep["searches"].items():
        where = f"serving/sweep/searches/{kind}"
        of_type(where, search, dict)
        of_type(f"{where}/probes", search.get("probes"), list)
        for name in ("low", "high", "capacity"):
            if search.get(name) is not None:
                number(f"{where}/{name}", search[name], above=True)


def check_key(where: str, entry: dict, key: dict) -> None:
    """An entry of the run's one cell per kind: the trace and the budget of the run."""
    for name, expected in key.items():
        if entry.get(name) != expected or isinstance(entry.get(name), bool):
            raise Malformed(f"{where}/{name}", f"expected the run's {expected!r}, got {entry.get(name)!r}")


def of_type(where: str, value: object, kind: type) -> None:
    if not isinstance(value, kind):
        raise Malformed(where, f"expected {kind.__name__}, got {type(value).__name__}")


def number(where: str, value: object, low: float = 0.0, above: bool = False) -> float:
    """A finite int or float (not a bool) at least `low`, or above it."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value < low or (above and value == low)):
        raise Malformed(where, f"expected a finite number {'>' if above else '>='} {low:g}, got {value!r}")
    return value


def count(where: str, value: object, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise Malformed(where, f"expected an integer >= {low}, got {value!r}")
    return value


def check_kinds(kinds: list) -> list[str]:
    """Plain words (kvbench.kinds.KIND_NAME), as a loop record's modes: every layout prints them as they are."""
    if not kinds or not all(isinstance(kind, str) and KIND_NAME.fullmatch(kind) and kind != CONTROL for kind in kinds):
        raise Malformed("run/modes", f"expected a non-empty list of kind names ({KIND_NAME.pattern}, not {CONTROL!r}), "
                                 f"got {kinds!r}")
    if len(set(kinds)) < len(kinds):
        raise Malformed("run/modes", f"expected each kind once, got {kinds!r}")
    return kinds


def check_budget(budget: dict) -> None:
    count("serving/budget/bytes", budget.get("bytes"), low=1)
    if not isinstance(budget.get("reserve"), (str, type(None))):
        raise Malformed("serving/budget/reserve", f"expected a policy name or null, got {budget['reserve']!r}")


def check_settings(settings: object) -> None:
    of_type("serving/settings", settings, dict)
    for kind, setting in settings.items():
        of_type(f"serving/settings/{kind}", setting, dict)


def check_environment(environment: dict, schema: dict) -> None:
    """As a loop record's: what capture.py writes, with its types (kvbench.record.schema.environment_schema)."""
    error = first_error(environment, schema)
    if error is not None:
        raise Malformed("/".join(["environment", *(str(part) for part in error[0])]), error[1])


def check_checks(checks: list, kinds: list[str], complete: bool, key: dict) -> dict[str, dict]:
    """Each kind's gate, once: passed true or false, and the requests that failed it; an interrupted run may lack
    one. Returns them by kind."""
    found: dict[str, dict] = {}
    for index, entry in enumerate(checks):
        where = f"checks/{index}"
        of_type(where, entry, dict)
        if entry.get("mode") not in kinds or entry["mode"] in found:
            raise Malformed(f"{where}/mode", f"expected one check of each kind {kinds}, got {entry.get('mode')!r}")
        check_key(where, entry, key)
        if not isinstance(entry.get("passed"), bool):
            raise Malformed(f"{where}/passed", f"expected true or false, got {entry.get('passed')!r}")
        if not entry["passed"]:
            of_type(f"{where}/failed_requests", entry.get("failed_requests"), list)
        found[entry["mode"]] = entry
    missing = [kind for kind in kinds if kind not in found]
    if missing and complete:
        raise Malformed("checks", f"expected a check of every kind {kinds}, got none of {missing[0]!r}")
    return found


def check_samples(samples: list, kinds: list[str], outputs: list[int], key: dict) -> set[str]:
    """Every kept replay of the trace (`outputs`: each request's output length); the modes replayed."""
    # an interrupted run recorded its control replays without naming their kind (control null) until 2026-12-04:
    # they are read, and left out of the figures, rather than the record refused
    modes, seen = {*kinds, CONTROL}, set()
    for index, kept in enumerate(samples):
        where = f"repetitions/{index}"
        of_type(where, kept, dict)
        check_key(where, kept, key)
        if kept.get("mode") not in modes:
            raise Malformed(f"{where}/mode", f"expected one of {sorted(modes)}, got {kept.get('mode')!r}")
        rotation = (kept["mode"], count(f"{where}/repetition", kept.get("repetition")))
        if rotation in seen:
            raise Malformed(f"{where}/repetition", f"expected one replay of {kept['mode']} per rotation, got "
                                                   f"rotation {rotation[1]} twice")
        seen.add(rotation)
        number(f"{where}/seconds", kept.get("seconds"), above=True)
        of_type(f"{where}/replay", kept.get("replay"), dict)
        check_replay(f"{where}/replay", kept["replay"], outputs)
    return {mode for mode, _ in seen}


def check_replay(where: str, replay: dict, outputs: list[int]) -> None:
    requests, iterations = replay.get("requests"), replay.get("iterations")
    of_type(f"{where}/requests", requests, list)
    of_type(f"{where}/iterations", iterations, list)
    if len(requests) != len(outputs):
        raise Malformed(f"{where}/requests", f"expected the trace's {len(outputs)} requests, got {len(requests)}")
    for index, (request, output) in enumerate(zip(requests, outputs)):
        check_request(f"{where}/requests/{index}", request, index, output)
    last = 0.0
    for index, iteration in enumerate(iterations):
        last = check_iteration(f"{where}/iterations/{index}", iteration, last)
    if "prefix_cache" in replay:  # a kind replayed with its prefix cache: what the report's hit rate divides
        cached = replay["prefix_cache"]
        of_type(f"{where}/prefix_cache", cached, dict)
        of_type(f"{where}/prefix_cache/hit_tokens", cached.get("hit_tokens"), list)
        if len(cached["hit_tokens"]) != len(outputs):
            raise Malformed(f"{where}/prefix_cache/hit_tokens", f"expected one count per request ({len(outputs)}), "
                                                                f"got {len(cached['hit_tokens'])}")
        for index, hits in enumerate(cached["hit_tokens"]):
            count(f"{where}/prefix_cache/hit_tokens/{index}", hits)
        count(f"{where}/prefix_cache/evicted", cached.get("evicted"))


def check_request(where: str, request: object, index: int, output: int) -> None:
    """Its arrival, admission and token stamps: in order, so that every latency is >= 0 and its end-to-end
    latency (which the figures divide by) above 0."""
    of_type(where, request, dict)
    if isinstance(request.get("id"), bool) or request.get("id") != index:
        raise Malformed(f"{where}/id", f"expected {index} (the trace's order), got {request.get('id')!r}")
    arrival = number(f"{where}/arrival", request.get("arrival"))
    admitted = number(f"{where}/admitted", request.get("admitted"), low=arrival)
    wall = stamps(f"{where}/token_times", request.get("token_times"), output)
    if wall[0] < admitted:
        raise Malformed(f"{where}/token_times/0", f"expected the first token at or after its admission at "
                                                  f"{admitted:g} s, got {wall[0]!r}")
    if wall[-1] <= arrival:
        raise Malformed(f"{where}/token_times/{len(wall) - 1}", f"expected the last token after its arrival at "
                                                                f"{arrival:g} s, got {wall[-1]!r}")
    cpu = request.get("token_cpu_times")
    if cpu is not None:  # a peer that schedules itself keeps no CPU stamps
        stamps(f"{where}/token_cpu_times", cpu, output)
        if len(cpu) != len(wall):
            raise Malformed(f"{where}/token_cpu_times", f"expected one CPU stamp per token ({len(wall)}), got "
                                                        f"{len(cpu)}")
        if cpu[-1] <= 0:
            raise Malformed(f"{where}/token_cpu_times/{len(cpu) - 1}", f"expected the last token's CPU time above "
                                                                       f"0 s, got {cpu[-1]!r}")


def stamps(where: str, values: object, output: int) -> list[float]:
    """1 to `output` seconds since the replay started, none before the one ahead of it."""
    of_type(where, values, list)
    if not 1 <= len(values) <= output:
        raise Malformed(where, f"expected 1 to {output} token stamps (the request's output), got {len(values)}")
    last = 0.0
    for index, value in enumerate(values):
        last = number(f"{where}/{index}", value, low=last)
    return values


def check_iteration(where: str, iteration: object, last: float) -> float:
    """One scheduler iteration's time (none before the one ahead), counts and bytes (used within reserved)."""
    of_type(where, iteration, dict)
    time = number(f"{where}/time", iteration.get("time"), low=last)
    for name in ITERATION_COUNTS:
        count(f"{where}/{name}", iteration.get(name))
    for name in ITERATION_BYTES:
        number(f"{where}/{name}", iteration.get(name))
    for name in ITERATION_OPTIONAL:
        if name in iteration:
            number(f"{where}/{name}", iteration[name])
    if iteration["used"] > iteration["reserved"]:
        raise Malformed(f"{where}/used", f"expected at most the {iteration['reserved']!r} bytes reserved, got "
                                         f"{iteration['used']!r}")
    return time
