"""The record's "device" section: what a run on another device than the CPU ran on (kvbench.measure.gpu's facts)
and which attention kernels each mode launched there. Absent in a CPU run's record, as in every record before it:
optional, so no new schema version. Torch-free."""

from __future__ import annotations

_scalar = {"type": ["string", "number", "boolean", "null"]}


def device_schema() -> dict:
    """{"type": the device, fact: scalar..., "unavailable": {source: reason}, "settings": {numerics in effect},
    "attention": {mode: {"sdpa": [backends], "kernels": count}}}."""
    strings = {"type": "object", "additionalProperties": {"type": "string"}}
    attention = {"type": "object", "additionalProperties": {
        "type": "object", "required": ["sdpa"],
        "properties": {"sdpa": {"type": "array", "items": {"enum": ["flash", "efficient", "cudnn", "math"]}},
                       "kernels": {"type": "integer", "minimum": 0}}}}
    return {"type": "object", "required": ["type"], "additionalProperties": _scalar,
            "properties": {"type": {"type": "string"}, "unavailable": strings,
                           "settings": {"type": "object", "additionalProperties": _scalar}, "attention": attention}}
