"""Serving-budget arithmetic: how much KV state a request retains, and how many fit.

Counts key/value element storage only (plus int8 scales), the same quantity as
``expected_cache_bytes``: not weights, activations, allocator slack or metadata,
unless the caller subtracts them from the limit with ``reserved``.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}
INT8_SCALE_BYTES = 2  # one float16 scale per group of int8 elements
MAX_SIZE = 2**64  # bytes: more than any machine's memory, and finite
SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
              "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str, allow_zero: bool = False) -> int:
    """'24GiB', '80 GB', '1.5e9', '4096' -> bytes; zero only when `allow_zero`."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).lower() not in SIZE_UNITS:
        raise ValueError(f"expected a size like 24GiB, 80GB or 1e9, got {text!r}")
    size = float(match.group(1)) * SIZE_UNITS[match.group(2).lower()]
    if not math.isfinite(size) or size > MAX_SIZE:
        raise ValueError(f"expected a size of at most {MAX_SIZE:,} bytes (16 EiB), got {text!r}")
    if size < 0 or (size == 0 and not allow_zero):
        raise ValueError(f"expected a positive size, got {text!r}")
    return int(size)


@dataclass(frozen=True)
class Budget:
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str
    tokens: int
    max_length: int
    block_size: int
    memory_bytes: int
    reserved_bytes: int
    int8_group: int
    bytes_per_element: float
    scale_overhead: float  # fraction of element bytes spent on int8 scales
    bytes_per_token: float
    request_bytes: float  # exact: tokens * bytes_per_token
    contiguous_request_bytes: float  # preallocated to max_length
    paged_request_bytes: float  # whole blocks
    paged_waste_bytes: float  # unused part of the last block
    contiguous_requests: int
    paged_requests: int
    exact_requests: int

    def to_dict(self) -> dict:
        return asdict(self)


def kv_budget(
    layers: int, kv_heads: int, head_dim: int, dtype: str, tokens: int, memory_bytes: int,
    block_size: int = 16, max_length: int | None = None, reserved_bytes: int = 0, int8_group: int | None = None,
) -> Budget:
    for name, value in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim),
                        ("tokens", tokens), ("block_size", block_size), ("memory_bytes", memory_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if dtype not in ELEMENT_BYTES:
        raise ValueError(f"dtype must be one of {list(ELEMENT_BYTES)}, got {dtype!r}")
    max_length = tokens if max_length is None else max_length
    if max_length < tokens:
        raise ValueError(f"max_length must be >= tokens per request ({tokens}), got {max_length}")
    if reserved_bytes < 0 or reserved_bytes >= memory_bytes:
        raise ValueError(f"reserved bytes must be in [0, memory limit {memory_bytes}), got {reserved_bytes}")
    int8_group = head_dim if int8_group is None else int8_group
    if int8_group < 1:
        raise ValueError(f"int8 group must be a positive integer, got {int8_group}")

    element = ELEMENT_BYTES[dtype]
    scale_overhead = INT8_SCALE_BYTES / int8_group / element if dtype == "int8" else 0.0
    per_element = element * (1 + scale_overhead)
    per_token = 2 * layers * kv_heads * head_dim * per_element  # 2: keys and values
    blocks = math.ceil(tokens / block_size)
    available = memory_bytes - reserved_bytes
    contiguous = per_token * max_length
    paged = per_token * blocks * block_size
    return Budget(
        layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, tokens=tokens, max_length=max_length,
        block_size=block_size, memory_bytes=memory_bytes, reserved_bytes=reserved_bytes, int8_group=int8_group,
        bytes_per_element=per_element, scale_overhead=scale_overhead, bytes_per_token=per_token,
        request_bytes=per_token * tokens, contiguous_request_bytes=contiguous, paged_request_bytes=paged,
        paged_waste_bytes=paged - per_token * tokens,
        contiguous_requests=int(available // contiguous), paged_requests=int(available // paged),
        exact_requests=int(available // (per_token * tokens)),
    )
