"""What a request costs a KV budget, by cache kind: plain arithmetic, torch-free, so the command line
refuses a budget too small for the trace before anything is built.

  static          reserves its capacity at admission: the positions the request will ever hold
                  (policy "request": prompt + output - 1, the default) or the model's max_length
                  (policy "max-length", what a server that knows no output length must do)
  quantized-int8/4  reserves the bytes its cache allocates for that capacity: integer codes, float16
                  scales and minimums, and the full-precision window of recent positions at the largest
                  it reaches while the prompt is prefilled in the scheduler's chunks (quantized_window)
  paged           takes blocks of one shared pool on demand: a request is admitted when the blocks for
                  its prompt are free, and grows a block at a time
  snapkv, knorm, ...  (ModeSpec.reserve: a kind that compresses its prompt) reserves the most its cache holds:
                  its uncompressed prompt, until its first decoding step compresses it; the scheduler then gives
                  back what the compression freed, keeping its budget and the steps since (Ledger.settle)

The budget is the pool: `parse_budget` reads bytes ('64MiB') or a share of free memory ('25%').
"""

from __future__ import annotations

import math
import re

from kvbench.budget import SIZE_UNITS, NotASize, parse_size
from kvbench.kinds import GROUP_SIZE, RESIDUAL, expected_cache_bytes, quantized_cache_bytes
from kvbench.modes import KVBENCH, PAGES, RESERVE, SPECS, names, spec

QUANTIZED_BITS = {name: spec(name).bits for name in names(KVBENCH) if spec(name).bits}  # quantized kinds, from their specs

PEER = "hf-continuous"  # transformers' continuous batching over its own paged cache (kvbench.serving.peer)


def serving_kinds() -> tuple[str, ...]:
    """The kinds a serving run takes: every registered one whose spec says how it is held (ModeSpec.serving, a
    plugin's included), and the peer."""
    return (*(name for name, found in SPECS.items() if found.serving), PEER)


def holds_pages(kind: str) -> bool:
    """Whether `kind` takes blocks of a shared pool on demand (ModeSpec.serving "pages"; the peer's own pages)."""
    return kind == PEER or (kind in SPECS and SPECS[kind].serving == PAGES)  # the peer is no mode of the registry


SERVING_KINDS = serving_kinds()  # the shipped ones, for the command line's help
RESERVE_POLICIES = ("request", "max-length")
DEFAULT_BLOCK_SIZE = 16  # vLLM's default block size
UNITS = {unit: size for unit, size in SIZE_UNITS.items() if not unit.startswith("t")}  # a KV budget in TB: a typo


def parse_budget(text: str, available: int | None) -> int:
    """'1048576', '64MiB', '1.5GB' bytes (kvbench.budget.parse_size, up to GiB), or 'N%' of `available` bytes
    (free memory)."""
    share = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*%\s*", text)
    if share:
        value = float(share.group(1))
        if not 0 < value <= 100 or available is None:
            raise ValueError(f"--kv-budget {text}: a share of free memory must be in (0, 100]%"
                             + ("" if available is not None else ", and free memory is unknown here"))
        return int(available * value / 100)
    try:
        size = parse_size(text, allow_zero=True, units=UNITS, largest=math.inf)  # past memory: refused by the fit
    except NotASize:
        raise ValueError(f"--kv-budget must be bytes ('64MiB', '1048576') or a share of free memory ('25%'), "
                         f"got {text!r}") from None
    except ValueError:  # not finite: no fit can hold it
        size = 0
    if size < 1:
        raise ValueError(f"--kv-budget must be at least 1 byte, got {text!r}")
    return size


def bytes_per_position(config) -> int:
    return expected_cache_bytes(config, 1, 1)


def block_bytes(config, block_size: int) -> int:
    return expected_cache_bytes(config, 1, block_size)


def blocks_for(positions: int, block_size: int) -> int:
    return -(-positions // block_size)


def quantized_reserved_bytes(config, capacity: int, bits: int, group_size: int = GROUP_SIZE,
                             residual: int = RESIDUAL, recent_positions: int | None = None) -> int:
    """What a quantized cache of `capacity` positions allocates (kvbench.cache.quantized's tensors), its window of
    recent positions allocated for `recent_positions` (by default, and at least, min(capacity, residual + group)):
    kvbench.kinds' formula, with the window allocated in place of the positions it holds."""
    return quantized_cache_bytes(config, 1, capacity, bits, group_size, residual,
                                 recent_positions=recent_positions or min(capacity, residual + group_size))


def quantized_window(prompt: int, capacity: int, max_batched_tokens: int | None, group_size: int = GROUP_SIZE,
                     residual: int = RESIDUAL) -> int:
    """The most full-precision positions a quantized cache holds at once when its `prompt` is prefilled in chunks of
    at most `max_batched_tokens` (None: the prompt whole), then decoded a token at a time.

    A chunk is staged beside the recent positions before their whole groups are quantized, so the window peaks at
    recent + chunk. After any commit fewer than residual + group positions are recent, and the scheduler's chunks
    may start anywhere (what is left of the token budget after the decoding rows varies), so the worst case is a
    chunk of the whole budget after residual + group - 1 recent positions, or the whole prompt if that is less.
    Decoding adds one position to at most residual + group - 1, within the cache's own least window."""
    longest = prompt if max_batched_tokens is None else min(prompt, max_batched_tokens)
    return max(min(capacity, residual + group_size), min(prompt, longest + residual + group_size - 1))


def capacity(request, config, policy: str) -> int:
    """Positions a reserving kind sets aside for `request` under `policy`."""
    if policy not in RESERVE_POLICIES:
        raise ValueError(f"reserve policy must be one of {list(RESERVE_POLICIES)}, got {policy!r}")
    return request.positions if policy == "request" else config.max_length


def cache_options(kind: str, request, capacity: int, options: dict | None = None,
                  max_batched_tokens: int | None = None) -> dict:
    """The options a reserving kind's cache for `request` is made with, and reserved for (reservation).

    A quantized cache's window of recent positions is allocated at its peak under the scheduler's chunk rule
    (quantized_window), rather than the chunks being cut to fit the window it starts with: cutting them would give
    the quantized kinds a prefill schedule of their own (a prompt in group-size chunks, every one a call that
    dequantizes everything stored so far), so the kinds would no longer replay the same schedule, and the time
    measured would be that schedule's. Allocated at admission, the window is what the ledger counts, from the
    start: its `reserved` is what the caches hold, and they never grow past it."""
    options = dict(options or {})
    if getattr(SPECS.get(kind), "reserve", None) is not None:  # its cache plans by it: which steps are its prompt
        options["prompt"] = request.prompt
    if kind in QUANTIZED_BITS:
        options["recent_positions"] = quantized_window(request.prompt, capacity, max_batched_tokens,
                                                       options.get("group_size", GROUP_SIZE),
                                                       options.get("residual", RESIDUAL))
    return options


def reservation(kind: str, config, positions: int, options: dict | None = None) -> int:
    """Bytes a reserving kind takes at admission for a cache of `positions` capacity made with `options` (for a
    request, cache_options': a quantized cache's window sized for its prefill)."""
    found = SPECS.get(kind)
    if found is None or found.serving != RESERVE:
        raise ValueError(f"a reserving kind is one of {', '.join(name for name, s in SPECS.items() if s.serving == RESERVE)}; "
                         f"got {kind!r}")
    if found.bits:  # what a quantized cache allocates, its window of recent positions included
        return quantized_reserved_bytes(config, positions, found.bits, **(options or {}))
    if found.reserve is not None:  # the most it holds for its request: `prompt` is cache_options'
        sized = {name: value for name, value in (options or {}).items() if name in (*found.options, "prompt")}
        if "prompt" not in sized:
            raise ValueError(f"{kind} reserves for a request's prompt: expected options with its 'prompt' "
                             f"(cache_options), got {sorted(options or {})}")
        return found.reserve(config, positions, **sized)
    return found.bytes(config, 1, positions, **(options or {}))  # the most it holds: its formula at its capacity


def minimum_budget(kind: str, config, trace, policy: str = "request", block_size: int = DEFAULT_BLOCK_SIZE,
                   options: dict | None = None, share_prefix: bool = False,
                   max_batched_tokens: int | None = None) -> int:
    """The least budget that serves every request of `trace` alone: its largest request's need (for paged
    with a shared prefix, plus the prefix's blocks, which the pool keeps while a request may fork them; for
    quantized, prefilled in chunks of max_batched_tokens, None being whole prompts: the largest window)."""
    if kind not in serving_kinds():
        raise ValueError(f"a serving kind is one of {list(serving_kinds())}, got {kind!r}")
    if holds_pages(kind):  # the peer's pages are blocks of block_size positions in every layer
        held = blocks_for(trace.prefix, block_size) if share_prefix else 0  # the prefix holder's blocks
        largest = max(blocks_for(request.positions, block_size) for request in trace.requests)
        return (held + largest) * block_bytes(config, block_size)
    return max(reservation(kind, config, capacity(r, config, policy),
                           cache_options(kind, r, capacity(r, config, policy), options, max_batched_tokens))
               for r in trace.requests)
