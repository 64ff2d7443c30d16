"""Serving-budget arithmetic: how much KV state a request retains, and how many requests fit.

The same formulas as the caches themselves: ``expected_cache_bytes`` for a float cache,
``window_cache_bytes`` for a model with sliding windows (a sliding layer stops growing at
W, for a cache that evicts what no query sees, as the window kind does),
``quantized_cache_bytes`` (int8 / int4 codes, float16 scales and minimums, the newest
positions in full precision, every position kept) for a quantized one. For a model preset
(`model_budget`) the weights come off the memory first, counted from its shapes; activations,
allocator slack and metadata are the caller's ``reserved``.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from kvbench.config import PlainConfig, positive_int
from kvbench.kinds import (
    GROUP_SIZE,
    RESIDUAL,
    check_quantized_options,
    expected_cache_bytes,
    parameter_count,
    quantized_cache_bytes,
    window_cache_bytes,
)
from kvbench.modes import spec

DTYPES = ("float32", "bfloat16", "float16")
QUANTIZATIONS = ("int8", "int4")  # the quantized kinds, quantized-int8 and quantized-int4
MAX_SIZE = 2**64  # bytes: more than any machine's memory, and finite
SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
              "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class NotASize(ValueError):
    """The text is no number with a unit parse_size knows."""


def parse_size(text: str, allow_zero: bool = False, units: dict[str, int] = SIZE_UNITS,
               largest: float = MAX_SIZE) -> int:
    """'24GiB', '80 GB', '1.5e9', '4096' -> bytes (whole: a fraction of a byte rounds down); zero only when
    `allow_zero`. The one size parser: --memory, --reserved, --kv-budget (kvbench.serving.admission)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).lower() not in units:
        raise NotASize(f"expected a size like 24GiB, 80GB or 1e9, got {text!r}")
    size = float(match.group(1)) * units[match.group(2).lower()]
    if not math.isfinite(size) or size > largest:
        raise ValueError(f"expected a size of at most {largest:,} bytes (16 EiB), got {text!r}")
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
    full_precision_bytes: int  # the same request as a float cache of `dtype` keeping every position
    request_bytes: int  # exact: what a cache holding `tokens` positions retains
    contiguous_request_bytes: int  # preallocated to max_length
    paged_request_bytes: int | None  # whole blocks of a float paged cache (None for a quantized one)
    paged_waste_bytes: int | None  # unused part of the last block
    contiguous_requests: int
    paged_requests: int | None
    exact_requests: int
    assumptions: str
    preset: str | None = None  # the model the shapes come from, when one was named
    parameters: int | None = None  # its weights, counted from its shapes
    weights_bytes: int = 0  # those weights in `dtype`, taken off the memory before any cache
    kv_memory_bytes: int = 0  # memory - weights - reserved: what the caches share
    window: int | None = None  # the sliding window, on `sliding_layers` of the layers
    sliding_layers: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


class BudgetError(ValueError):
    """A budget that cannot be computed; `argument` names the argument of model_budget at fault, so that a
    caller can name what its user gave (the command line, its option)."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument


def kv_budget(
    layers: int, kv_heads: int, head_dim: int, dtype: str, tokens: int, memory_bytes: int,
    block_size: int = 16, max_length: int | None = None, reserved_bytes: int = 0, quantize: str | None = None,
    group_size: int = GROUP_SIZE, residual: int = RESIDUAL,
) -> Budget:
    """The budget of bare cache shapes: no model, so no weights and no window."""
    for name, value in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim), ("tokens", tokens)):
        positive_int(name, value)
    check_budget_dtype(dtype)
    config = PlainConfig(vocab_size=1, width=kv_heads * head_dim, heads=kv_heads, layers=layers,
                         max_length=max(tokens, max_length or tokens), dtype=dtype)
    return model_budget(config, tokens, memory_bytes, block_size=block_size, max_length=max_length,
                        reserved_bytes=reserved_bytes, quantize=quantize, group_size=group_size, residual=residual)


def check_budget_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")


def model_budget(  # long: one check per argument, then the arithmetic of each layout
    config: PlainConfig, tokens: int, memory_bytes: int, block_size: int = 16, max_length: int | None = None,
    reserved_bytes: int = 0, quantize: str | None = None, group_size: int = GROUP_SIZE, residual: int = RESIDUAL,
    preset: str | None = None,
) -> Budget:
    """How many requests of `tokens` positions fit in `memory_bytes` for a model of `config`; with a
    `preset` named, its weights in the config's dtype come off the memory first."""
    for name, value in (("tokens", tokens), ("block_size", block_size), ("memory_bytes", memory_bytes)):
        positive_int(name, value)
    dtype = config.dtype if isinstance(config.dtype, str) else str(config.dtype).removeprefix("torch.")
    check_budget_dtype(dtype)
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ValueError(f"quantize must be one of {list(QUANTIZATIONS)} or None, got {quantize!r}")
    bits = spec(f"quantized-{quantize}").bits if quantize else None
    check_quantized_options(bits, config.head_dim, group_size, residual)
    if tokens > config.max_length:
        raise BudgetError("tokens", f"tokens per request must be <= the model's max_length {config.max_length}, "
                          f"got {tokens}")
    max_length = tokens if max_length is None else max_length
    if max_length < tokens:
        raise BudgetError("max_length", f"max_length must be >= tokens per request ({tokens}), got {max_length}")
    parameters = parameter_count(config) if preset is not None else None
    weights = parameters * config.element_bytes if parameters is not None else 0
    if weights >= memory_bytes:  # the memory is too small whatever is reserved: blame the memory limit
        raise BudgetError("memory_bytes", f"memory limit {memory_bytes:,} bytes leaves nothing for KV caches: the "
                          f"weights of {preset} alone take {weights:,} bytes ({parameters:,} parameters in {dtype})")
    if reserved_bytes < 0 or weights + reserved_bytes >= memory_bytes:
        raise BudgetError("reserved_bytes", f"reserved bytes must be in [0, memory limit {memory_bytes}"
                          + (f" less the weights' {weights}" if weights else "") + f"), got {reserved_bytes}")

    def retained(length: int) -> int:
        if quantize is not None:
            return quantized_cache_bytes(config, 1, length, bits, group_size, residual)
        return window_cache_bytes(config, 1, length)

    available = memory_bytes - weights - reserved_bytes
    request, contiguous = retained(tokens), retained(max_length)
    paged = None if quantize else expected_cache_bytes(config, 1, math.ceil(tokens / block_size) * block_size)
    sliding = config.sliding_layers
    return Budget(
        layers=config.layers, kv_heads=config.kv_heads, head_dim=config.head_dim, dtype=dtype, quantize=quantize,
        group_size=group_size if quantize else None, residual=residual if quantize else None, tokens=tokens,
        max_length=max_length, block_size=block_size, memory_bytes=memory_bytes, reserved_bytes=reserved_bytes,
        bytes_per_token=request / tokens, full_precision_bytes=expected_cache_bytes(config, 1, tokens),
        request_bytes=request, contiguous_request_bytes=contiguous, paged_request_bytes=paged,
        paged_waste_bytes=None if paged is None else paged - request,
        contiguous_requests=available // contiguous, paged_requests=None if paged is None else available // paged,
        exact_requests=available // request, assumptions=assumptions(config, quantize, group_size, residual),
        preset=preset, parameters=parameters, weights_bytes=weights, kv_memory_bytes=available,
        window=config.window, sliding_layers=sliding,
    )


def assumptions(config: PlainConfig, quantize: str | None, group_size: int, residual: int) -> str:
    """What the bytes per position count, in words."""
    dtype = str(config.dtype).removeprefix("torch.")
    if quantize is not None:
        return (f"{quantize} codes; float16 scale and minimum per channel per {group_size} tokens (keys) and per "
                f"token per {math.gcd(group_size, config.head_dim)} channels (values); the newest {residual} to "
                f"{residual + group_size - 1} positions in {dtype}" + ("; every position kept, the window's too"
                                                                        if config.window else ""))
    text = (f"2 (keys and values) x {config.layers} layers x {config.kv_heads} KV heads x {config.head_dim} head "
            f"width x {config.element_bytes} bytes of {dtype} per position")
    sliding = config.sliding_layers
    if sliding:
        text += f"; {sliding} of {config.layers} layers slide over {config.window} positions and keep only those"
    return text
