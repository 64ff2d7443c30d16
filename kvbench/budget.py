"""Serving-budget arithmetic: how much KV state a request retains, and how many requests fit.

The same formulas as the caches themselves: ``expected_cache_bytes`` for a float cache,
``quantized_cache_bytes`` (int8 / int4 codes, float16 scales and minimums, the newest
positions in full precision) for a quantized one. Key/value storage only: not weights,
activations, allocator slack or metadata, unless the caller subtracts them from the limit
with ``reserved``.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from kvbench.config import PlainConfig
from kvbench.kinds import (
    GROUP_SIZE,
    QUANTIZED_BITS,
    RESIDUAL,
    check_quantized_options,
    expected_cache_bytes,
    quantized_cache_bytes,
)

DTYPES = ("float32", "bfloat16", "float16")
QUANTIZATIONS = ("int8", "int4")  # the quantized kinds, quantized-int8 and quantized-int4
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
    quantize: str | None
    group_size: int | None
    residual: int | None
    tokens: int
    max_length: int
    block_size: int
    memory_bytes: int
    reserved_bytes: int
    bytes_per_token: float  # request bytes / tokens (a quantized cache's recent positions cost more)
    full_precision_bytes: int  # the same request as a float cache of `dtype`
    request_bytes: int  # exact: what a cache holding `tokens` positions retains
    contiguous_request_bytes: int  # preallocated to max_length
    paged_request_bytes: int | None  # whole blocks of a float paged cache (None for a quantized one)
    paged_waste_bytes: int | None  # unused part of the last block
    contiguous_requests: int
    paged_requests: int | None
    exact_requests: int
    assumptions: str

    def to_dict(self) -> dict:
        return asdict(self)


def _positive(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def kv_budget(
    layers: int, kv_heads: int, head_dim: int, dtype: str, tokens: int, memory_bytes: int,
    block_size: int = 16, max_length: int | None = None, reserved_bytes: int = 0, quantize: str | None = None,
    group_size: int = GROUP_SIZE, residual: int = RESIDUAL,
) -> Budget:
    _positive(layers=layers, kv_heads=kv_heads, head_dim=head_dim, tokens=tokens, block_size=block_size,
              memory_bytes=memory_bytes)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ValueError(f"quantize must be one of {list(QUANTIZATIONS)} or None, got {quantize!r}")
    bits = QUANTIZED_BITS[f"quantized-{quantize}"] if quantize else None
    check_quantized_options(bits, head_dim, group_size, residual)
    max_length = tokens if max_length is None else max_length
    if max_length < tokens:
        raise ValueError(f"max_length must be >= tokens per request ({tokens}), got {max_length}")
    if reserved_bytes < 0 or reserved_bytes >= memory_bytes:
        raise ValueError(f"reserved bytes must be in [0, memory limit {memory_bytes}), got {reserved_bytes}")
    config = PlainConfig(vocab_size=1, width=kv_heads * head_dim, heads=kv_heads, layers=layers,
                           max_length=max_length, dtype=dtype)

    def retained(length: int) -> int:
        if quantize is None:
            return expected_cache_bytes(config, 1, length)
        return quantized_cache_bytes(config, 1, length, bits, group_size, residual)

    available = memory_bytes - reserved_bytes
    request, contiguous = retained(tokens), retained(max_length)
    paged = None if quantize else retained(math.ceil(tokens / block_size) * block_size)
    if quantize is None:
        assumptions = (f"2 (keys and values) x {layers} layers x {kv_heads} KV heads x {head_dim} head width x "
                       f"{config.element_bytes} bytes of {dtype} per position")
    else:
        assumptions = (f"{quantize} codes; float16 scale and minimum per channel per {group_size} tokens (keys) and per "
                       f"token per {math.gcd(group_size, head_dim)} channels (values); the newest {residual} to "
                       f"{residual + group_size - 1} positions in {dtype}")
    return Budget(
        layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, quantize=quantize,
        group_size=group_size if quantize else None, residual=residual if quantize else None, tokens=tokens,
        max_length=max_length, block_size=block_size, memory_bytes=memory_bytes, reserved_bytes=reserved_bytes,
        bytes_per_token=request / tokens, full_precision_bytes=expected_cache_bytes(config, 1, tokens),
        request_bytes=request, contiguous_request_bytes=contiguous, paged_request_bytes=paged,
        paged_waste_bytes=None if paged is None else paged - request,
        contiguous_requests=available // contiguous, paged_requests=None if paged is None else available // paged,
        exact_requests=available // request, assumptions=assumptions,
    )
