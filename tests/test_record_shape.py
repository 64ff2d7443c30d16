"""kvbench.record.shape: the compiled checks say "valid" exactly where jsonschema does, on every schema of the
record, for committed records mutated field by field and for each keyword's edge cases; what they cannot compile
goes to jsonschema."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from records import mutated, paths

from kvbench.record import RecordError, load_record
from kvbench.record.schema import SCHEMAS, check_shape
from kvbench.record.shape import Unsupported, compiled, fast_check

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ("results/layouts/seed.json", "results/llama/llama-tiny.json", "results/latency/llama-mini-request.json",
           "results/latency/qwen2.5-0.5b-contexts.json", "results/reference.json")
ORIGINALS = {name: json.loads((ROOT / name).read_text()) for name in RECORDS}
PATHS = {name: paths(record) for name, record in ORIGINALS.items()}
# Every JSON type, and the values where JSON Schema's types differ from Python's: 1.0 is an integer, True is no
# number and equals no 1, a huge integer, an empty string, a negative and a fraction.
EDGES = ([], [1, 1], {}, {"junk": [1]}, "", "junk", "full", 10**30, -1, 0, 1, 1.0, 3.0, 0.5, -1e300, None, True, False)
VALIDATORS = {name: jsonschema.Draft202012Validator(schema) for name, schema in SCHEMAS.items()}


def assert_agree(record: object) -> None:
    for name, schema in SCHEMAS.items():
        assert fast_check(schema)(record) == VALIDATORS[name].is_valid(record), name


@pytest.mark.parametrize("name", RECORDS)
def test_every_committed_shape_passes_where_jsonschema_does(name):
    assert_agree(ORIGINALS[name])
    assert any(fast_check(schema)(ORIGINALS[name]) for schema in SCHEMAS.values())


@st.composite
def mutations(draw):
    name = draw(st.sampled_from(RECORDS))
    record = ORIGINALS[name]
    for _ in range(draw(st.integers(1, 2))):  # two changes at once reach the anyOf, oneOf and if branches too
        place = draw(st.sampled_from(paths(record) or PATHS[name]))
        record = mutated(record, place, draw(st.sampled_from(("replace", "replace", "delete", "junk"))),
                         draw(st.sampled_from(EDGES)))
    return record


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(mutations())
def test_a_mutated_record_is_valid_for_the_compiled_checks_exactly_when_for_jsonschema(record):
    assert_agree(record)


KEYWORD_CASES = [
    ({"type": "integer"}, [1, 1.0, 1.5, True, "1", None, 10**30]),
    ({"type": "number"}, [1, 0.5, True, False, "1"]),
    ({"type": ["string", "null"]}, ["x", None, 0, []]),
    ({"type": "array"}, [[], (), {}]),
    ({"enum": [1, "a", [1, 2]]}, [1, 1.0, True, "a", [1, 2], [1.0, 2], [True, 2], 2]),
    ({"const": False}, [False, 0, None, 0.0]),
    ({"const": {"a": [1]}}, [{"a": [1]}, {"a": [True]}, {"a": [1], "b": 1}]),
    ({"minimum": 0, "exclusiveMaximum": 1}, [0, 0.99, 1, -0.1, "x", True]),
    ({"exclusiveMinimum": 0, "maximum": 2}, [0, 2, 2.5, 1e-9]),
    ({"pattern": "^[a-z]+$"}, ["abc", "ab1", "", 5]),
    ({"required": ["a"], "minProperties": 2}, [{"a": 1}, {"a": 1, "b": 2}, {"b": 1, "c": 2}, [1, 2]]),
    ({"properties": {"a": {"type": "string"}}, "additionalProperties": False}, [{"a": "x"}, {"a": 1}, {"b": 1}, 3]),
    ({"additionalProperties": {"type": "integer"}}, [{"a": 1}, {"a": 1.0}, {"a": "x"}]),
    ({"propertyNames": {"pattern": "^x"}}, [{"xa": 1}, {"a": 1}, {}]),
    ({"dependentRequired": {"a": ["b"]}}, [{"a": 1}, {"a": 1, "b": 1}, {"b": 1}]),
    ({"items": {"type": "integer"}, "minItems": 1, "maxItems": 2, "uniqueItems": True},
     [[1], [1, 1], [1, 1.0], [1, True], [], [1, 2, 3], ["x"]]),
    ({"anyOf": [{"type": "string"}, {"minimum": 3}]}, ["x", 4, 2, None]),
    ({"oneOf": [{"type": "integer"}, {"minimum": 3}]}, [1, 4, 3.5, "x"]),
    ({"if": {"type": "string"}, "then": {"pattern": "^a"}}, ["ab", "b", 3]),
    ({"if": {"minimum": 0}, "then": {"type": "integer"}, "else": {"maximum": -5}}, [1, 1.5, -6, -1]),
    ({"then": {"type": "string"}}, [1]),  # then without if: no constraint
    (True, [1, None]),
    (False, [1, None]),
]


@pytest.mark.parametrize("schema, values", KEYWORD_CASES)
def test_each_keyword_means_what_it_means_to_jsonschema(schema, values):
    check, validator = compiled(schema), jsonschema.Draft202012Validator(schema)
    for value in values:
        assert check(value) == validator.is_valid(value), value


def test_a_keyword_it_does_not_know_leaves_the_schema_to_jsonschema():
    for schema in ({"$ref": "#/$defs/x"}, {"prefixItems": [{"type": "integer"}]}, {"format": "date"},
                   {"properties": {"a": {"patternProperties": {"^x": {}}}}}, []):
        with pytest.raises(Unsupported):
            compiled(schema)
        assert fast_check(schema)({"a": 1}) is False  # never "valid": jsonschema decides


def test_a_record_the_checks_refuse_is_worded_by_jsonschema(tmp_path):
    record = json.loads((ROOT / RECORDS[0]).read_text())
    record["run"]["lengths"] = [16, "sixteen"]
    (tmp_path / "r.json").write_text(json.dumps(record))
    with pytest.raises(RecordError, match=r"r\.json: run/lengths/1: 'sixteen' is not of type 'integer'"):
        load_record(tmp_path / "r.json")
    with pytest.raises(RecordError, match=r"here: run/lengths/1"):
        check_shape(record, record["schema"], "here")
