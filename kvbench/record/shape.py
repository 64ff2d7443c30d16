"""A record's JSON schema compiled into nested Python checks: the fast path of kvbench.record.schema's shape check.

jsonschema walks a schema for every value of a record through its generic machinery (a validator evolved and a
path kept per value), and a record holds hundreds of repetitions of a dozen fields each: reading one took a
tenth of a second or more, most of `kvbench show`'s time and most of the test suite's reading of records.
`compiled(schema)` turns the keywords kvbench's schemas use into closures that answer only "valid or not", with
jsonschema's own Draft 2020-12 semantics: a float with an integer value is an integer, a bool is never a number,
enum and const compare without True == 1, a keyword constrains only the type it is about. A record they pass is
valid; one they fail goes to jsonschema, which finds and words its first error as before. A keyword they do not
know makes the compile fail, and that schema always goes to jsonschema: the fast path can be missing, never laxer
(tests/test_record_hostile.py holds both to the same answer on every mutated record).
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Mapping, Sequence
from typing import Callable

import jsonschema

Check = Callable[[object], bool]
ANNOTATIONS = {"title", "description", "$comment", "default", "examples", "deprecated", "readOnly", "writeOnly"}


class Unsupported(ValueError):
    """A schema keyword the fast path does not implement: the schema goes to jsonschema whole."""


def is_number(value: object) -> bool:
    kind = type(value)
    if kind is float or kind is int:  # what JSON gives: no walk of the numeric tower's ABCs
        return True
    return kind is not bool and isinstance(value, numbers.Number)


TYPES: dict[str, Check] = {
    "object": lambda value: isinstance(value, dict),
    "array": lambda value: isinstance(value, list),
    "string": lambda value: isinstance(value, str),
    "boolean": lambda value: isinstance(value, bool),
    "null": lambda value: value is None,
    "number": is_number,
    "integer": lambda value: not isinstance(value, bool) and (
        isinstance(value, int) or (isinstance(value, float) and value.is_integer())),
}


def unbool(value: object) -> object:
    """True and False as themselves, never as 1 and 0 (jsonschema's equality)."""
    return ("bool", value) if isinstance(value, bool) else value


def equal(one: object, two: object) -> bool:
    """JSON equality as jsonschema has it: sequences and mappings item by item, a bool equal only to itself."""
    if one is two:
        return True
    if isinstance(one, str) or isinstance(two, str):
        return one == two
    if isinstance(one, Sequence) and isinstance(two, Sequence):
        return len(one) == len(two) and all(equal(a, b) for a, b in zip(one, two))
    if isinstance(one, Mapping) and isinstance(two, Mapping):
        return one.keys() == two.keys() and all(equal(one[key], two[key]) for key in one)
    return unbool(one) == unbool(two)


def unique(values: list) -> bool:
    return not any(equal(values[i], values[j]) for i in range(len(values)) for j in range(i))


def compiled(schema: object) -> Check:
    """The schema as one check; Unsupported for a keyword (or a schema that is not an object or a bool) it lacks."""
    if schema is True or schema is False:
        return (lambda value: True) if schema else (lambda value: False)
    if not isinstance(schema, dict):
        raise Unsupported(f"expected a schema object or a bool, got {type(schema).__name__}")
    unknown = set(schema) - set(KEYWORDS) - ANNOTATIONS - {"then", "else"}
    if unknown:
        raise Unsupported(f"no fast check for {', '.join(sorted(unknown))}")
    checks = [KEYWORDS[name](schema[name], schema) for name in KEYWORDS if name in schema]
    checks = [check for check in checks if check is not None]
    if len(checks) == 1:  # most of a record's values: one call, not a loop
        return checks[0]
    return every(checks)


def every(checks: list[Check]) -> Check:
    def check(value: object) -> bool:
        for each in checks:
            if not each(value):
                return False
        return True

    return check


CACHE: dict[int, tuple[dict, Check]] = {}
CACHE_SIZE = 64  # kvbench's schemas are a handful of module constants


def fast_check(schema: dict) -> Check:
    """The schema's compiled check, made once per schema object; for a schema it cannot compile, a check that
    always sends the record on to jsonschema."""
    cached = CACHE.get(id(schema))
    if cached is None or cached[0] is not schema:  # the object kept beside it: an id is never reused under it
        try:
            check = compiled(schema)
        except Unsupported:
            check = lambda value: False  # noqa: E731  not known valid: jsonschema decides
        if len(CACHE) >= CACHE_SIZE:  # a caller that builds its schemas anew must not grow the cache for ever
            CACHE.clear()
        cached = CACHE[id(schema)] = (schema, check)
    return cached[1]


def first_error(instance: object, schema: dict) -> tuple[tuple, str] | None:
    """Where `instance` first departs from `schema` and jsonschema's words for it, or None when it is valid: the
    compiled checks answer for a valid one, jsonschema finds and words the error of any other."""
    if fast_check(schema)(instance):
        return None
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(instance))
    return None if error is None else (tuple(error.absolute_path), error.message)


def type_check(types, _) -> Check:
    named = [TYPES[name] for name in ([types] if isinstance(types, str) else types)]
    if len(named) == 1:
        return named[0]
    return lambda value: any(check(value) for check in named)


def object_check(guarded: Callable[[dict], bool]) -> Check:
    return lambda value: not isinstance(value, dict) or guarded(value)


def properties_check(properties: dict, _) -> Check:
    checks = [(name, compiled(subschema)) for name, subschema in properties.items()]

    def check(value: object) -> bool:
        if isinstance(value, dict):
            for name, each in checks:
                if name in value and not each(value[name]):
                    return False
        return True

    return check


def additional_check(additional, schema: dict) -> Check:
    named = set(schema.get("properties", {}))
    check = compiled(additional)
    return object_check(lambda value: all(check(item) for name, item in value.items() if name not in named))


def array_check(guarded: Callable[[list], bool]) -> Check:
    return lambda value: not isinstance(value, list) or guarded(value)


def number_check(passes: Callable[[object], bool]) -> Check:
    return lambda value: not is_number(value) or passes(value)


def pattern_check(pattern: str, _) -> Check:
    found = re.compile(pattern).search
    return lambda value: not isinstance(value, str) or found(value) is not None


def if_check(condition, schema: dict) -> Check:
    test, then, otherwise = (compiled(schema.get(name, True)) for name in ("if", "then", "else"))
    return lambda value: then(value) if test(value) else otherwise(value)


def any_of_check(subschemas: list, _) -> Check:
    checks = [compiled(subschema) for subschema in subschemas]
    return lambda value: any(check(value) for check in checks)


def one_of_check(subschemas: list, _) -> Check:
    checks = [compiled(subschema) for subschema in subschemas]
    return lambda value: sum(1 for check in checks if check(value)) == 1


def items_check(items, _) -> Check:
    each = compiled(items)

    def check(value: object) -> bool:
        if isinstance(value, list):
            for item in value:
                if not each(item):
                    return False
        return True

    return check


def names_check(names, _) -> Check:
    check = compiled(names)
    return object_check(lambda value: all(check(name) for name in value))


def dependent_check(dependencies: dict, _) -> Check:
    return object_check(lambda value: all(needed in value for name, needs in dependencies.items() if name in value
                                          for needed in needs))


KEYWORDS: dict[str, Callable[[object, dict], Check | None]] = {  # the order checks run in: the cheap ones first
    "type": type_check,
    "const": lambda const, _: lambda value: equal(value, const),
    "enum": lambda enum, _: lambda value: any(equal(each, value) for each in enum),
    "minimum": lambda bound, _: number_check(lambda value: value >= bound),
    "maximum": lambda bound, _: number_check(lambda value: value <= bound),
    "exclusiveMinimum": lambda bound, _: number_check(lambda value: value > bound),
    "exclusiveMaximum": lambda bound, _: number_check(lambda value: value < bound),
    "pattern": pattern_check,
    "required": lambda names, _: object_check(lambda value: all(name in value for name in names)),
    "minProperties": lambda count, _: object_check(lambda value: len(value) >= count),
    "dependentRequired": dependent_check,
    "minItems": lambda count, _: array_check(lambda value: len(value) >= count),
    "maxItems": lambda count, _: array_check(lambda value: len(value) <= count),
    "uniqueItems": lambda flag, _: array_check(unique) if flag else None,
    "properties": properties_check,
    "additionalProperties": additional_check,
    "propertyNames": names_check,
    "items": items_check,
    "anyOf": any_of_check,
    "oneOf": one_of_check,
    "if": if_check,
}
