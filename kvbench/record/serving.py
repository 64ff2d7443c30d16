"""A serving record (`kvbench run --trace`, schema kvbench.serving/1) read back: checked for type and range once,
when it is read, before anything is computed from it. Torch-free.

Every reader of a serving record (`kvbench report`, `compare`, `export`) goes through `check_serving_record`:
the figures (kvbench.serving_figures) divide by makespans, token counts and reserved bytes, the report formats
bytes and reads each kind's check, the exporters copy fields as they are; a field of the wrong type or out of
range would end in a traceback, a division by zero or a nonsense figure. A problem is one ValueError naming the
file and the field ("samples/3/replay/requests/0/token_times/2: ..."), as a loop record's RecordError does.

What is checked is what the readers read: the trace as `--trace FILE` checks it (kvbench.trace), the model
config, the environment as a loop record's, the budget, the protocol's between-run allowance, each kind's check,
and every replay's per-token stamps (wall and CPU) and per-iteration memory. An interrupted record
(`complete: false`) may lack a kind's check or replays; a complete one has a replay of every kind that passed.
"""

from __future__ import annotations

import math

import jsonschema

from kvbench.config import PlainConfig
from kvbench.kinds import KIND_NAME
from kvbench.modes import CONTROL  # a sample's mode for the A/A control's replays: not a kind
from kvbench.record.schema import environment_schema
from kvbench.trace import trace_from_dict

SERVING_SCHEMA = "kvbench.serving/1"
TOP_LEVEL = (("kinds", list), ("samples", list), ("trace", dict), ("checks", dict), ("protocol", dict),
             ("environment", dict), ("budget", dict), ("config", dict), ("preset", str))
ITERATION_COUNTS = ("running", "preempted")
ITERATION_BYTES = ("used", "reserved", "saved")
ITERATION_OPTIONAL = ("prefill_seconds", "decode_seconds", "prefill_tokens")  # absent in older records


class Malformed(ValueError):
    """One field that is wrong: where it is (a JSON path) and what is wrong with it."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"{where}: {what}")


def is_serving(document: object) -> bool:
    return isinstance(document, dict) and document.get("schema") == SERVING_SCHEMA


def check_serving_record(document: dict, source: object) -> dict:
    """The document read from `source`, when it is a sound serving record; else ValueError naming the source and
    the first wrong field."""
    try:
        check_document(document)
    except Malformed as error:
        raise ValueError(f"{source}: malformed serving record ({SERVING_SCHEMA!r}): {error}") from None
    return document


def check_document(record: dict) -> None:
    for key, kind in TOP_LEVEL:
        of_type(key, record.get(key), kind)
    if not isinstance(record.get("complete", True), bool):
        raise Malformed("complete", f"expected true or false, got {record['complete']!r}")
    kinds = check_kinds(record["kinds"])
    control = record.get("control")
    if control is not None and control not in kinds:
        raise Malformed("control", f"expected null or one of the kinds {kinds}, got {control!r}")
    try:
        config = PlainConfig.from_dict(record["config"])
    except (ValueError, TypeError) as error:  # a field of the wrong type fails in the dataclass's own checks
        raise Malformed("config", str(error)) from None
    of_type("trace/spec", record["trace"].get("spec"), dict)  # a record's trace says how it was drawn, or read
    try:
        requests = trace_from_dict(record["trace"], config.max_length).requests
    except ValueError as error:
        raise Malformed("trace", str(error)) from None
    between = record["protocol"].get("between_run")
    if isinstance(between, bool) or not isinstance(between, (int, float)) or not 0 <= between < 0.5:
        raise Malformed("protocol/between_run", f"expected a relative standard deviation in [0, 0.5), got {between!r}")
    check_budget(record["budget"])
    check_settings(record.get("settings", {}))
    check_environment(record["environment"])
    complete = record.get("complete", True)
    check_checks(record["checks"], kinds, complete)
    replayed = check_samples(record["samples"], kinds, [request.output for request in requests])
    if complete:
        missing = [kind for kind in kinds if record["checks"][kind]["passed"] and kind not in replayed]
        if missing:
            raise Malformed("samples", f"kinds {missing} passed their check but have no replay")


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
        raise Malformed("kinds", f"expected a non-empty list of kind names ({KIND_NAME.pattern}, not {CONTROL!r}), "
                                 f"got {kinds!r}")
    if len(set(kinds)) < len(kinds):
        raise Malformed("kinds", f"expected each kind once, got {kinds!r}")
    return kinds


def check_budget(budget: dict) -> None:
    count("budget/bytes", budget.get("bytes"), low=1)
    if not isinstance(budget.get("reserve"), (str, type(None))):
        raise Malformed("budget/reserve", f"expected a policy name or null, got {budget['reserve']!r}")


def check_settings(settings: object) -> None:
    of_type("settings", settings, dict)
    for kind, setting in settings.items():
        of_type(f"settings/{kind}", setting, dict)


def check_environment(environment: dict) -> None:
    """As a loop record's: what capture.py writes, with its types (kvbench.record.schema.environment_schema)."""
    validator = jsonschema.Draft202012Validator(environment_schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(environment))
    if error is not None:
        where = "/".join(["environment", *(str(part) for part in error.absolute_path)])
        raise Malformed(where, error.message)


def check_checks(checks: dict, kinds: list[str], complete: bool) -> None:
    """Each kind's gate: passed true or false, and the requests that failed it; an interrupted run may lack one."""
    for kind in kinds:
        if kind not in checks and complete:
            raise Malformed("checks", f"expected a check of every kind {kinds}, got none of {kind!r}")
    for kind, check in checks.items():
        of_type(f"checks/{kind}", check, dict)
        if not isinstance(check.get("passed"), bool):
            raise Malformed(f"checks/{kind}/passed", f"expected true or false, got {check.get('passed')!r}")
        if not check["passed"]:
            of_type(f"checks/{kind}/failed_requests", check.get("failed_requests"), list)


def check_samples(samples: list, kinds: list[str], outputs: list[int]) -> set[str]:
    """Every kept replay of the trace (`outputs`: each request's output length); the modes replayed."""
    # an interrupted run recorded its control replays without naming their kind (control null) until 2026-12-04:
    # they are read, and left out of the figures, rather than the record refused
    modes, seen = {*kinds, CONTROL}, set()
    for index, kept in enumerate(samples):
        where = f"samples/{index}"
        of_type(where, kept, dict)
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
