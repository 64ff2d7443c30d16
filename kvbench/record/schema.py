"""What a sound record is: its JSON schema, then its meaning.

The schema (checked by kvbench.record.shape, in jsonschema's words) fixes shapes and types, and every number must be
finite; then the checks of :mod:`kvbench.record.meaning` hold the record to what kvbench
itself would have written. A record that fails is rejected with its source and the
first problem, never believed.
"""

from __future__ import annotations

import copy

from kvbench.config import DTYPE_NAMES, FAMILIES, PRESET_NAME, WINDOW_PATTERNS
from kvbench.files import first_non_finite
from kvbench.kinds import FAILURES, KIND_NAME, WORKLOADS
from kvbench.measure import capture, estimation
from kvbench.measure.sampling import STOPS
from kvbench.measure.stats import ESTIMATORS, INTERVALS
import kvbench.record.serving as serving
from kvbench.record.device import device_schema
from kvbench.record.needle import needle_schema
from kvbench.record.entries import TELEMETRY
from kvbench.record.shape import first_error
from kvbench.record.meaning import MEANING_CHECKS, RecordError
from kvbench.record.upgrade import CURRENT, LATER_CELL, LATER_SUMMARY, V3, complete_run, lacks_a_later_section, upgrade

SCHEMA = CURRENT  # "kvbench.record/4"
SCHEMA_NAME, SCHEMA_VERSION = SCHEMA.split("/")
# 1: fixed repetitions, medians-ratio speedups; 2: sections added; 3: every section there; 4: the serving workload.
# Older ones (and kvbench.serving/1) are upgraded on load (kvbench.record.upgrade), then checked as this one.
READABLE = ("kvbench.record/1", "kvbench.record/2", V3, SCHEMA)
MAX_SAMPLE_SECONDS = 1e6  # one decode loop of more than 11 days is not a measurement (and overflows ratios)
STATUSES = ("complete", "incomplete")
MODE_NAME = f"^{KIND_NAME.pattern}$"  # plain words: nothing a terminal, markdown or HTML would interpret

_count = {"type": "integer", "minimum": 0}
_scalar = {"type": ["string", "number", "boolean", "null"]}
JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", type(None): "null"}
LIST_ITEMS = {"python.build": {"type": "string"}, "cpu.flags": {"type": "string"}, "system.cpu_affinity": _count,
              "system.load_average": {"type": "number", "minimum": 0}}  # what capture.py lists hold


def protocol_schema() -> dict:
    """protocol: the settings readers print and export, with the types kvbench writes (older records lack some)."""
    optional = lambda kind, low: {"type": [kind, "null"], "minimum": low}  # noqa: E731
    return {"type": "object", "properties": {
        **dict.fromkeys(("batch", "repeats", "threads"), _positive), **dict.fromkeys(("seed", "warmup"), _count),
        "max_repeats": optional("integer", 1), "per_step_length": optional("integer", 1),
        "precision": {"type": ["number", "null"], "exclusiveMinimum": 0},
        "max_seconds": {"type": ["number", "null"], "exclusiveMinimum": 0},
        "between_run": {"type": "number", "minimum": 0, "exclusiveMaximum": 0.5},
        **dict.fromkeys(("clock", "control", "cpu", "gc", "order", "order_rule"), {"type": ["string", "null"]}),
        **dict.fromkeys(("cpu_in_effect", "threads_in_effect"), {"type": "object"})}}


def environment_schema() -> dict:
    """environment: every key capture.py writes, with the type it writes (or null: a sensor that failed,
    its reason kept in `unavailable`); counts, sizes and rates are not negative. A record from an older
    kvbench may lack keys (readers show them absent); a key kvbench does not know holds a plain value."""
    sections: dict[str, dict] = {}
    for path, expected in capture.KEY_TYPES.items():
        section, _, key = path.rpartition(".")
        types = sorted({JSON_TYPES[kind] for kind in (expected if isinstance(expected, tuple) else (expected,))}
                       | {"null"})
        types = [kind for kind in types if section or kind != "null"]  # a sensor may fail; the clock does not
        rule = {"type": types, **({"minimum": 0} if {"integer", "number"} & set(types) else {})}
        sections.setdefault(section, {})[key] = {**rule, **({"items": LIST_ITEMS[path]} if path in LIST_ITEMS else {})}
    top = sections.pop("")
    strings = {"type": "object", "additionalProperties": {"type": "string"}}
    unknown = {"anyOf": [_scalar, {"type": "object", "additionalProperties": _scalar}]}
    return {"type": "object", "additionalProperties": unknown,
            "properties": {**top, "unavailable": strings, "env": {**strings, "type": ["object", "null"]},
                           **{name: {"type": ["object", "null"], "properties": keys, "additionalProperties": _scalar}
                              for name, keys in sections.items()}}}

_positive = {"type": "integer", "minimum": 1}
_mode = {"type": "string", "pattern": MODE_NAME}
_bytes = {"type": "integer", "minimum": 0}
_difference = {"type": ["number", "null"], "minimum": 0}
_cell = {"mode": _mode, "length": _positive}

RECORD_SCHEMA_V1 = {
    "type": "object",
    "required": [
        "schema", "status", "created_utc", "command", "config", "run", "protocol",
        "environment", "checks", "repetitions", "summary", "memory",
    ],
    "properties": {
        "schema": {"const": "kvbench.record/1"},
        "status": {"enum": list(STATUSES)},
        "created_utc": {"type": "string"},
        "command": {"type": "array", "items": {"type": "string"}},
        "config": {
            "type": "object",
            "required": ["vocab_size", "width", "heads", "kv_heads", "layers", "max_length", "dtype"],
            "properties": {**dict.fromkeys(("vocab_size", "width", "heads", "kv_heads", "layers", "max_length",
                                            "mlp_ratio"), _positive), "dtype": {"enum": sorted(DTYPE_NAMES)},
                           "window": {"type": ["integer", "null"], "minimum": 1}},
            "additionalProperties": False,
        },
        "run": {
            "type": "object",
            "required": ["preset", "lengths", "modes", "batch", "seed", "repeats", "warmup", "threads"],
            "properties": {
                "preset": {"type": "string", "pattern": f"^{PRESET_NAME.pattern}$"},
                "lengths": {"type": "array", "minItems": 1, "uniqueItems": True, "items": _positive},
                "modes": {"type": "array", "minItems": 1, "uniqueItems": True, "items": _mode},
                "batch": _positive, "seed": _count, "repeats": _positive, "warmup": _count, "threads": _positive,
                "per_step_length": {"type": ["integer", "null"], "minimum": 1},
            },
        },
        "protocol": protocol_schema(),
        "environment": environment_schema(),
        "checks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["mode", "length", "passed", "max_abs_diff", "max_rel_diff", "first_divergent_position", "atol", "rtol"],
                # The differences are null only for a mode that raised: its check carries the error.
                "properties": {**_cell, "passed": {"type": "boolean"}, "max_abs_diff": _difference,
                               "max_rel_diff": _difference, "first_divergent_position": {"type": ["integer", "null"], "minimum": 0},
                               "non_finite": _count, "atol": {"type": "number", "minimum": 0},
                               "rtol": {"type": "number", "minimum": 0}, "dtype": {"enum": sorted(DTYPE_NAMES)},
                               "tolerance_used": {"type": "number", "minimum": 0}, "error": {"type": "string"},
                               "reference_max_abs": {"type": "number", "minimum": 0},
                               "top1_disagreements": _count, "reference_non_finite": _count,
                               "first_reference_non_finite": {"type": ["integer", "null"], "minimum": 0},
                               "failure": {"enum": [*FAILURES, None]}},
            },
        },
        "repetitions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["mode", "length", "repetition", "order", "seconds"],
                "properties": {**_cell, "repetition": _count, "order": _count,
                               "seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_SAMPLE_SECONDS}},
            },
        },
        "summary": {
            "type": "object",
            "required": ["cells", "speedups"],
            "properties": {
                "cells": {"type": "array", "items": {"type": "object", "properties": _cell, "required": [
                    "mode", "length", "median", "min", "max", "q1", "q3", "repetitions", "valid"]}},
                "speedups": {"type": "array", "items": {"type": "object", "properties": _cell,
                                                        "required": ["mode", "length", "speedup", "valid"]}},
            },
        },
        "memory": {
            "type": "array",
            "items": {"type": "object", "required": ["mode", "length", "expected_bytes", "measured_bytes", "reserved_bytes"],
                      "properties": {**_cell, "expected_bytes": _bytes, "measured_bytes": _bytes,
                                     "reserved_bytes": _bytes, "peak_rss_growth_bytes": _bytes,
                                     "quantized_positions": _count}},  # a quantized kind's, since 2026-12-04
        },
        "per_step": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["mode", "length", "seconds"],
                "properties": {**_cell, "seconds": {"type": "array", "minItems": 1,
                                                    "items": {"type": "number", "minimum": 0, "maximum": MAX_SAMPLE_SECONDS}}},
            },
        },
    },
}


def machine_sections() -> dict:
    """The machine probe (every run since 2026-12-01) and the machine's limits (request and contexts runs)."""
    seconds = {"type": "array", "minItems": 1, "items": {"type": "number", "exclusiveMinimum": 0,
                                                         "maximum": MAX_SAMPLE_SECONDS}}
    phase = {"type": "object", "propertyNames": {"pattern": MODE_NAME}, "additionalProperties": seconds}
    probe = {  # absent in records written before 2026-12-01
        # "workloads": the probe calls by name (the key predates "workload" meaning loop, request or contexts)
        "type": "object", "required": ["workloads", "repeats", "start"], "additionalProperties": False,
        "properties": {"workloads": {"type": "object", "minProperties": 1, "propertyNames": {"pattern": MODE_NAME},
                                     "additionalProperties": {"type": "string"}},
                       "repeats": _positive, "start": phase, "end": phase}}
    rate = {"type": "object", "required": ["median", "min", "max", "samples"],
            "properties": {**{name: {"type": "number", "exclusiveMinimum": 0} for name in ("median", "min", "max")},
                           "samples": {"type": "array", "minItems": 1,
                                       "items": {"type": "number", "exclusiveMinimum": 0}}}}
    limits = {  # request and contexts runs since 2026-12-01: the machine's limits
        "type": "object", "required": ["buffer_bytes", "memory_bandwidth", "matmul", "weight_bytes_per_step"],
        "properties": {"buffer_bytes": _positive, "weight_bytes_per_step": _positive, "parameter_bytes": _positive,
                       "last_level_cache_bytes": {"type": ["integer", "null"], "minimum": 1},
                       "memory_bandwidth": {"type": "object", "required": ["copy", "triad"], "additionalProperties": {
                           "type": "object", "minProperties": 1, "propertyNames": {"pattern": "^[0-9]+$"},
                           "additionalProperties": rate}},
                       "matmul": {"type": "array", "minItems": 1, "items": {  # the roof: one shape at least
                           "type": "object", "required": ["shape", "flops_per_second"],
                           "properties": {"shape": {"type": "array", "items": _positive, "minItems": 3, "maxItems": 3},
                                          "flops_per_second": rate}}}}}
    # compiled modes (kvbench.models.compiled): each compiled function's first call in the run's process, compile
    # included, never inside a sample
    compiled = {"type": "object", "propertyNames": {"pattern": MODE_NAME}, "additionalProperties": seconds}
    return {"machine_probe": probe, "limits": limits, "compile_seconds": compiled}


def real_model_sections() -> dict:
    """A real model's run (since 2026-12-03): the GGUF file its weights came from, where its token ids came from,
    and what the lossy kinds did to its text (kvbench.workloads.quality) and to retrieval (kvbench.workloads.needle)."""
    sha = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
    model = {"type": "object", "required": ["source", "path", "size", "sha256", "architecture", "quantization",
                                            "dequantized_to"],
             "properties": {"source": {"const": "gguf"}, "path": {"type": "string"}, "size": _positive, "sha256": sha,
                            "architecture": {"type": "string"}, "name": {"type": ["string", "null"]},
                            "quantization": {"type": "object", "minProperties": 1, "additionalProperties": _positive},
                            "dequantized_to": {"enum": sorted(DTYPE_NAMES)},
                            "weights_from": {"enum": ["cache", "dequantized"]},
                            "build_seconds": {"type": "number", "minimum": 0},
                            "tokenize_seconds": {"type": "number", "minimum": 0}}}
    token_ids = {"type": "object", "required": ["source"],  # the report names the corpus and its digest
                 "properties": {"source": {"enum": ["corpus", "random"]}, "sha256": sha, "name": {"type": "string"}},
                 "if": {"properties": {"source": {"const": "corpus"}}}, "then": {"required": ["name", "sha256"]}}
    return {"model": model, "token_ids": token_ids, "quality": quality_schema(), "needle": needle_schema()}


def quality_schema() -> dict:
    """quality (kvbench.quality.measure): every key the report reads of each mode's row, always written."""
    number, positive = {"type": "number"}, {"type": "number", "exclusiveMinimum": 0}
    interval = {"type": "object", "required": ["mean", "low", "high"],  # the mean alone, or with both ends
                "properties": {"mean": number, **dict.fromkeys(("low", "high"), {"type": ["number", "null"]})},
                "if": {"properties": {"low": number}}, "then": {"properties": {"high": number}}}
    row = {"type": "object", "required": ["mode", "perplexity", "nll_mean", "kl_mean", "top1_agreement",
                                          "greedy_departure", "sample"],
           "dependentRequired": {"window": ["sinks"], "perplexity_beyond_window": ["full_perplexity_beyond_window"]},
           "properties": {"mode": _mode, "perplexity": positive, "nll_mean": number, "kl_mean": number,
                          "top1_agreement": {"type": "number", "minimum": 0, "maximum": 1},
                          "greedy_departure": {"type": ["integer", "null"], "minimum": 0}, "sample": {"type": "string"},
                          "window": _positive, "sinks": _count, "nll_difference": interval,
                          "perplexity_beyond_window": positive, "full_perplexity_beyond_window": positive,
                          # what its cache held after a chunk's last step (since 2026-12-04)
                          "cache_bytes": _count, "quantized_positions": _count}}
    return {"type": "object", "required": ["tokens", "chunks", "modes", "prompt", "generate"],
            "properties": {"tokens": _positive, "chunks": _positive, "prompt": _count, "generate": _count,
                           "modes": {"type": "array", "items": row}}}


def estimation_schema() -> dict:
    """summary.estimation: the clock and estimator each length's speedups were computed with, and why."""
    return {  # absent in records written before 2026-12-01 (wall time everywhere)
        "type": "object", "required": ["rule", "lengths"], "additionalProperties": False,
        "properties": {"rule": {"enum": [estimation.RULE]}, "lengths": {"type": "array", "items": {
            "type": "object", "required": ["length", "clock", "estimator", "samples", "waited", "reason"],
            "additionalProperties": False,
            "properties": {"length": _positive, "clock": {"enum": list(estimation.CLOCKS)},
                           "estimator": {"enum": list(ESTIMATORS)}, "samples": _count, "waited": _count,
                           "reason": {"type": "string"}}}}}}


def sampling_schema() -> dict:
    """sampling: how many rotations each length ran and why it stopped; what the telemetry cost and lacked."""
    lengths = {"type": "array", "items": {
        "type": "object", "required": ["length", "rotations", "stop"],
        "properties": {"length": _positive, "rotations": _count, "stop": {"enum": list(STOPS)},
                       "half_width": {"type": ["number", "null"], "minimum": 0}}}}
    telemetry = {"type": "object", "properties": {
        "unavailable": {"type": "object", "additionalProperties": {"type": "string"}},
        **dict.fromkeys(("per_sample_seconds", "per_step_timer_seconds", "reading_seconds"),
                        {"type": ["number", "null"], "minimum": 0})}}
    return {"type": "object", "required": ["lengths", "telemetry"],
            "properties": {"lengths": lengths, "elapsed": {"type": ["number", "null"], "minimum": 0},
                           "telemetry": telemetry}}


def _schema_v2() -> dict:
    """Version 2 adds the sampling section, per-sample rounds and telemetry, speedup intervals."""
    schema = copy.deepcopy(RECORD_SCHEMA_V1)
    schema["properties"]["schema"] = {"const": "kvbench.record/2"}
    schema["required"].append("sampling")
    _number = {"type": "number", "exclusiveMinimum": 0}
    _derived = {"type": ["integer", "null"], "minimum": 1}  # null: width / heads, mlp_ratio x width
    schema["properties"]["config"]["properties"].update({  # the model families' fields (absent before them: gpt2)
        "family": {"enum": list(FAMILIES)}, "head_dim": _derived, "intermediate_size": _derived,
        "window_pattern": {"enum": [*WINDOW_PATTERNS, None]}, "norm_eps": _number,
        "rope_theta": {"type": ["number", "null"], "exclusiveMinimum": 0},
        "rope_scaling": {"oneOf": [{"type": "null"}, {
            "type": "object", "additionalProperties": False,
            "required": ["factor", "low_freq_factor", "high_freq_factor", "original_max_length"],
            "properties": {"factor": _number, "low_freq_factor": _number, "high_freq_factor": _number,
                           "original_max_length": _positive}}]},
        "qkv_bias": {"type": "boolean"}, "tie_embeddings": {"type": "boolean"}, "sinks": _count})
    schema["properties"]["run"]["properties"]["control"] = {"type": ["string", "null"], "pattern": MODE_NAME}
    # at least what --quant-group and --quant-residual take
    schema["properties"]["run"]["properties"]["cache_options"] = {
        "type": "object", "propertyNames": {"pattern": MODE_NAME}, "additionalProperties": {
            "type": "object", "properties": {"group_size": _positive, "residual": _count}}}
    schema["properties"]["run"]["properties"]["plugins"] = {"type": "array", "items": {
        "type": "object", "required": ["path", "sha256", "kinds"],
        "properties": {"path": {"type": "string"}, "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                       "kinds": {"type": "array", "minItems": 1, "items": _mode}}}}
    schema["properties"]["run"]["properties"]["workload"] = {  # absent before 2026-12-01: the loop
        "type": "object", "required": ["kind"], "additionalProperties": False,
        # a contexts run's warm-up and timed steps: absent before 2026-12-03 (one cold step, its release timed too)
        "properties": {"kind": {"enum": list(WORKLOADS)}, "prompt": _positive, "generate": _positive,
                       "warmup_steps": _count, "timed_steps": _positive},
        "if": {"properties": {"kind": {"const": "request"}}}, "then": {"required": ["kind", "prompt", "generate"]}}
    repetition = schema["properties"]["repetitions"]["items"]
    repetition["properties"].update({
        "ttft_seconds": {"type": "number", "minimum": 0, "maximum": MAX_SAMPLE_SECONDS},
        "step_seconds": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": MAX_SAMPLE_SECONDS}}})
    repetition["required"] += ["round", "started", *TELEMETRY]
    repetition["properties"].update({"round": _count, "started": {"type": "number", "minimum": 0},
                                     **{name: {"type": [kind, "null"], "minimum": 0} for name, kind in TELEMETRY.items()}})
    schema["properties"]["sampling"] = sampling_schema()
    schema["properties"].update(machine_sections())
    schema["properties"].update(real_model_sections(), device=device_schema())  # a device's run (kvbench.record.device)
    summary = schema["properties"]["summary"]
    summary["required"] += ["estimator", "interval", "controls"]
    summary["properties"]["baseline"] = _mode
    summary["properties"]["estimator"] = {"enum": list(ESTIMATORS)}
    summary["properties"]["interval"] = {"enum": list(INTERVALS)}
    summary["properties"]["between_run"] = {  # absent in records written before it (no between-run allowance)
        "type": "object", "required": ["speedup", "seconds"], "additionalProperties": False,
        "properties": {name: {"type": "number", "minimum": 0, "exclusiveMaximum": 0.5} for name in ("speedup", "seconds")}}
    summary["properties"]["estimation"] = estimation_schema()
    summary["properties"]["speedups"]["items"]["required"] += ["low", "high", "pairs"]
    summary["properties"]["controls"] = {"type": "array", "items": {
        "type": "object", "required": ["mode", "length", "ratio", "low", "high", "pairs"], "properties": _cell}}
    return schema


def _schema_v3() -> dict:
    """Version 3: what version 2 left to be absent in older records is always there (kvbench.record.upgrade fills
    it in older ones): the run's workload, control, plugins, cache options and per-step length; the summary's
    baseline, estimator, interval, controls, between-run allowance, estimation and per-token medians. Null
    states what an older run did not do: no interval (schema 1's ratio of medians), no between-run widening, wall
    time everywhere, no start time or telemetry for schema 1's samples."""
    schema = copy.deepcopy(RECORD_SCHEMA_V2)
    properties = schema["properties"]
    properties["schema"] = {"const": V3}
    run = properties["run"]
    run["required"] = [*run["required"], "workload", "control", "plugins", "cache_options", "per_step_length"]
    summary = properties["summary"]
    summary["required"] = [*summary["required"], "baseline", "between_run", "estimation"]
    nullable = lambda rule: {"anyOf": [{"type": "null"}, rule]}  # noqa: E731
    for name in ("estimator", "interval", "between_run", "estimation"):
        summary["properties"][name] = nullable(summary["properties"][name])
    summary["properties"]["cells"]["items"]["required"].append("per_token_median")
    speedup = summary["properties"]["speedups"]["items"]
    speedup["properties"] = {**speedup["properties"], "low": {"type": ["number", "null"]},
                             "high": {"type": ["number", "null"]}, "pairs": {"type": ["integer", "null"], "minimum": 0}}
    properties["repetitions"]["items"]["properties"]["started"]["type"] = ["number", "null"]
    return schema


def _schema_v3_unfilled() -> dict:
    """Version 3 less what the v2-to-v3 step fills (upgrade.LATER_SUMMARY, ...): a /3 file lacking some of it is checked
    against this before the step reads its cells (a length of 0 was a ZeroDivisionError), then held to /3 itself."""
    schema = copy.deepcopy(RECORD_SCHEMA_V3)
    run, summary = schema["properties"]["run"], schema["properties"]["summary"]
    run["required"] = [name for name in run["required"] if name not in complete_run({})]
    summary["required"] = [name for name in summary["required"] if name not in LATER_SUMMARY]
    cells = summary["properties"]["cells"]["items"]
    cells["required"] = [name for name in cells["required"] if name != LATER_CELL]
    return schema


RECORD_SCHEMA_V2 = _schema_v2()
RECORD_SCHEMA_V3 = _schema_v3()
# Version 4 is version 3 for a loop, request or contexts record (a serving one: kvbench.record.serving checks it)
RECORD_SCHEMA = {**RECORD_SCHEMA_V3, "properties": {**RECORD_SCHEMA_V3["properties"], "schema": {"const": SCHEMA}}}
UNFILLED = f"{V3} before the upgrade fills it"
SCHEMAS = {"kvbench.record/1": RECORD_SCHEMA_V1, "kvbench.record/2": RECORD_SCHEMA_V2, V3: RECORD_SCHEMA_V3,
           SCHEMA: RECORD_SCHEMA, UNFILLED: _schema_v3_unfilled()}


def check_shape(record: dict, schema: str, source: str) -> None:
    """Raise RecordError naming the first place where the record departs from that version's JSON schema."""
    error = first_error(record, SCHEMAS[schema])  # kvbench.record.shape: compiled checks, jsonschema's words
    if error is not None:
        raise RecordError(f"{source}: {'/'.join(str(part) for part in error[0]) or '(top level)'}: {error[1]}")


def validate_record(record: object, source: str = "record") -> dict:
    """Raise RecordError naming the first problem; return the record, in this version's shape, when it is sound
    (an older record is upgraded first: kvbench.record.upgrade)."""
    if not isinstance(record, dict):
        raise RecordError(f"{source}: expected a JSON object with schema {SCHEMA!r}, got {type(record).__name__}")
    found = record.get("schema")
    if found not in READABLE and found != serving.SERVING_V1:
        if isinstance(found, str) and found.startswith(SCHEMA_NAME + "/"):
            raise RecordError(f"{source}: unsupported schema version {found!r}; this kvbench reads "
                              f"{', '.join(map(repr, READABLE[:-1]))} and {READABLE[-1]!r}")
        raise RecordError(f"{source}: not a kvbench record: expected schema {SCHEMA!r}, got {found!r}")
    non_finite = first_non_finite(record)
    if non_finite is not None:
        raise RecordError(f"{source}: {non_finite[0]}: not a finite number")
    if serving.is_serving(record):
        return validate_serving(record, found, source)
    # A /3 file lacking what schema 2 left optional is checked without it, then filled, then checked whole: the
    # filling reads only what the first check passed.
    check_shape(record, UNFILLED if found == V3 and lacks_a_later_section(record) else found, source)
    upgraded = upgrade(record)
    if upgraded is not record:  # an older record: upgraded, then held to this version like a record written today
        record = upgraded
        check_shape(record, SCHEMA, f"{source} (upgraded from {found})")
    for check in MEANING_CHECKS:
        problem = check(record)
        if problem:
            raise RecordError(f"{source}: {problem}")
    return record


def validate_serving(record: dict, found: str, source: str) -> dict:
    """A serving record (kvbench.record.serving), upgraded from its own older format; every field readers read."""
    if found == serving.SERVING_V1:
        serving.check_v1_shape(record, source)
        record, source = upgrade(record), f"{source} (upgraded from {found})"
    elif found != SCHEMA:
        raise RecordError(f"{source}: run/workload: the serving workload is new in {SCHEMA!r}, got it in {found!r}")
    return serving.check(record, RECORD_SCHEMA["properties"]["environment"], source)  # one object: compiled once


__all__ = ["MODE_NAME", "RECORD_SCHEMA", "SCHEMA", "SCHEMA_NAME", "SCHEMA_VERSION", "STATUSES", "RecordError",
           "validate_record"]
