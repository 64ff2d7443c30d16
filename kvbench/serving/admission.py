"""What a request costs a KV budget, by cache kind: plain arithmetic, torch-free, so the command line
refuses a budget too small for the trace before anything is built.

  static          reserves its capacity at admission: the positions the request will ever hold
                  (policy "request": prompt + output - 1, the default) or the model's max_length
                  (policy "max-length", what a server that knows no output length must do)
  quantized-int8/4  reserves the bytes its cache allocates for that capacity: integer codes, float16
                  scales and minimums, and the full-precision residual window (kvbench.cache.quantized)
  paged           takes blocks of one shared pool on demand: a request is admitted when the blocks for
                  its prompt are free, and grows a block at a time

The budget is the pool: `parse_budget` reads bytes ('64MiB') or a share of free memory ('25%').
"""

from __future__ import annotations

import math
import re

from kvbench.kinds import GROUP_SIZE, RESIDUAL, expected_cache_bytes
from kvbench.modes import KVBENCH, names, spec

QUANTIZED_BITS = {name: spec(name).bits for name in names(KVBENCH) if spec(name).bits}  # quantized kinds, from their specs

PEER = "hf-continuous"  # transformers' continuous batching over its own paged cache (kvbench.serving.peer)
SERVING_KINDS = ("static", "paged", "quantized-int8", "quantized-int4", PEER)
RESERVE_POLICIES = ("request", "max-length")
DEFAULT_BLOCK_SIZE = 16  # vLLM's default block size
UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9}


def parse_budget(text: str, available: int | None) -> int:
    """'1048576', '64MiB', '1.5GB' bytes, or 'N%' of `available` bytes (free memory)."""
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*(%|[kmg]i?b|b)?\s*", text.lower())
    if not found:
        raise ValueError(f"--kv-budget must be bytes ('64MiB', '1048576') or a share of free memory ('25%'), "
                         f"got {text!r}")
    value, unit = float(found.group(1)), found.group(2) or ""
    if unit == "%":
        if not 0 < value <= 100 or available is None:
            raise ValueError(f"--kv-budget {text}: a share of free memory must be in (0, 100]%"
                             + ("" if available is not None else ", and free memory is unknown here"))
        return int(available * value / 100)
    size = value * UNITS[unit]
    if not math.isfinite(size) or size < 1:
        raise ValueError(f"--kv-budget must be at least 1 byte, got {text!r}")
    return int(size)


def bytes_per_position(config) -> int:
    return expected_cache_bytes(config, 1, 1)


def block_bytes(config, block_size: int) -> int:
    return expected_cache_bytes(config, 1, block_size)


def blocks_for(positions: int, block_size: int) -> int:
    return -(-positions // block_size)


def quantized_reserved_bytes(config, capacity: int, bits: int, group_size: int = GROUP_SIZE,
                             residual: int = RESIDUAL) -> int:
    """What a quantized cache of `capacity` positions allocates (kvbench.cache.quantized's tensors)."""
    lead, D = config.layers * config.kv_heads, config.head_dim
    stored = group_size * max(0, (capacity - residual) // group_size)
    codes = 2 * lead * stored * D * bits // 8
    scales = lead * (stored // group_size) * 2 * D * 2 + lead * stored * (D // math.gcd(group_size, D)) * 2 * 2
    recent = lead * 2 * min(capacity, residual + group_size) * D * config.element_bytes
    return codes + scales + recent


def capacity(request, config, policy: str) -> int:
    """Positions a reserving kind sets aside for `request` under `policy`."""
    if policy not in RESERVE_POLICIES:
        raise ValueError(f"reserve policy must be one of {list(RESERVE_POLICIES)}, got {policy!r}")
    return request.positions if policy == "request" else config.max_length


def reservation(kind: str, config, positions: int, options: dict | None = None) -> int:
    """Bytes a reserving kind takes at admission for a cache of `positions` capacity."""
    if kind == "static":
        return expected_cache_bytes(config, 1, positions)
    if kind in QUANTIZED_BITS:
        return quantized_reserved_bytes(config, positions, QUANTIZED_BITS[kind], **(options or {}))
    raise ValueError(f"a reserving kind is one of static, {', '.join(QUANTIZED_BITS)}; got {kind!r}")


def minimum_budget(kind: str, config, trace, policy: str = "request", block_size: int = DEFAULT_BLOCK_SIZE,
                   options: dict | None = None, share_prefix: bool = False) -> int:
    """The least budget that serves every request of `trace` alone: its largest request's need (for paged
    with a shared prefix, plus the prefix's blocks, which the pool keeps while a request may fork them)."""
    if kind not in SERVING_KINDS:
        raise ValueError(f"a serving kind is one of {list(SERVING_KINDS)}, got {kind!r}")
    if kind in ("paged", PEER):  # the peer's pages are blocks of block_size positions in every layer
        held = blocks_for(trace.prefix, block_size) if share_prefix else 0  # the prefix holder's blocks
        largest = max(blocks_for(request.positions, block_size) for request in trace.requests)
        return (held + largest) * block_bytes(config, block_size)
    return max(reservation(kind, config, capacity(r, config, policy), options) for r in trace.requests)
