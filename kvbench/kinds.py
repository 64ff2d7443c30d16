"""The arithmetic the modes are described with: what a cache retains, what a model weighs, how a check is judged.

Plain data and arithmetic, importable without torch, so that reading a record, a budget and
the command line's checks never wait seconds for it. kvbench.modes builds each mode's spec
(its byte formula, its drift limits) from these; kvbench.workloads.decode judges the gate's checks with
the rules here.
"""

from __future__ import annotations

import math
import re

from kvbench.config import positive_int

# One-token steps compiled with torch.compile (kvbench.models.compiled): what they need to run here.
COMPILED_DTYPES = ("float32", "bfloat16")  # what inductor's CPU code is gated at here
COMPILERS = ("g++", "c++", "clang++")  # what inductor builds its C++ with, when $CXX is not set
WORKLOADS = ("loop", "request", "contexts")  # what one sample times (kvbench.workloads)
# The contexts workload: after a prefill of c tokens, untimed warm-up steps (the first of them the cold step after
# the prefill, which a client does see), then the consecutive steady-state steps a sample times.
CONTEXT_WARMUP_STEPS, CONTEXT_TIMED_STEPS = 4, 16
# The needle workload (kvbench.workloads.needle): contexts in the model's tokens, depths in percent of them; and the
# cache option several runs of one evicting kind may differ by, which its safe-ratio rule reads.
NEEDLE_CONTEXTS, NEEDLE_DEPTHS, EVICT_RATIO = (1024, 2048, 4096), (0, 25, 50, 75, 100), "evict_ratio"
KIND_NAME = re.compile(r"[a-z][a-z0-9_-]{0,39}")  # plain words: nothing a terminal, markdown or HTML interprets

# The quantized kinds' defaults (KIVI's G and R; transformers' residual_length is R too).
GROUP_SIZE = 32  # tokens per key group, channels per value group at most
RESIDUAL = 128  # newest positions kept in full precision at least
SCALE_BYTES = 2  # scales and minimums are float16


def cxx_compiler() -> str | None:
    """The C++ compiler torch.compile's inductor would build with ($CXX, else the first of COMPILERS on PATH)."""
    import os
    import shutil

    for name in ((os.environ["CXX"],) if os.environ.get("CXX") else COMPILERS):
        found = shutil.which(name)
        if found:
            return found
    return None


def require_compiled(mode: str, config) -> None:
    """ValueError, in one line, unless compiled `mode` can run here on `config` (a kvbench.config.PlainConfig)."""
    if cxx_compiler() is None:
        raise ValueError(f"{mode} needs a C++ compiler for torch.compile's inductor backend: none of "
                         f"{list(COMPILERS)} is on PATH (or set CXX)")
    dtype = str(config.dtype).removeprefix("torch.")
    if dtype not in COMPILED_DTYPES:
        raise ValueError(f"{mode} compiles for dtypes {list(COMPILED_DTYPES)}, got {dtype}")
    if config.family != "llama":
        raise ValueError(f"{mode} steps the llama family's block, got family {config.family!r}")


# -- what a kind retains ------------------------------------------------------------------
# `config` is a kvbench.config.PlainConfig or DecoderConfig: the formulas read its layers,
# kv_heads, head_dim, element_bytes, window and sliding_layers.


def _count(**values: int) -> None:
    for name, value in values.items():
        positive_int(name, value, lowest=0)


def expected_cache_bytes(config, batch: int, length: int) -> int:
    """Key plus value element storage for `length` positions: 2 * layers * B * KVH * T * D * elt."""
    _count(batch=batch, length=length)
    return 2 * config.layers * batch * config.kv_heads * length * config.head_dim * config.element_bytes


def window_cache_bytes(config, batch: int, length: int, **options) -> int:
    """A cache that evicts what no query can see: the last W positions and the K sinks at most on a sliding
    layer, every position on the others: 2 * B * KVH * D * elt * sum over layers of min(T, W_layer + K)."""
    _count(batch=batch, length=length)
    sliding = config.sliding_layers  # counted, not listed: the cost stays flat in the layer count
    kept = config.window + getattr(config, "sinks", 0) if config.window else length
    positions = sliding * min(length, kept) + (config.layers - sliding) * length
    return 2 * batch * config.kv_heads * positions * config.head_dim * config.element_bytes


def parameter_count(config) -> int:
    """Weights of the model kvbench builds from `config` (kvbench.model), counted from the shapes: every
    parameter once (a tied head is the token embedding). The rotary tables are not weights: see
    rotary_table_bytes."""
    C, V, I, D = config.width, config.vocab_size, config.intermediate_size, config.head_dim
    H, KVH = config.heads, config.kv_heads
    qkv = (H + 2 * KVH) * D
    if config.family == "gpt2":  # biases on every projection, LayerNorm's weight and bias, learned positions
        per_layer = (C * qkv + qkv) + (H * D * C + C) + (C * I + I) + (I * C + C) + 2 * 2 * C
        return V * C + config.max_length * C + config.layers * per_layer + 2 * C + (C * V + V)
    per_layer = C * qkv + (qkv if config.qkv_bias else 0) + H * D * C + 3 * C * I + 2 * C  # RMSNorm: a weight
    return V * C + config.layers * per_layer + C + (0 if config.tie_embeddings else C * V)


def parameters_text(count: int) -> str:
    """A parameter count in three significant figures: '932', '86.6K', '135M', '8.03B' (billions alone print
    the seed's 86,624 as '0.00B')."""
    if count < 1000:
        return str(count)
    for unit, scale in (("K", 1e3), ("M", 1e6), ("B", 1e9)):
        text = f"{count / scale:.3g}"
        if float(text) < 1000:  # 999,999 rounds to '1e+03K': the next unit's '1M' instead
            return text + unit
    return f"{count / 1e9:,.0f}B"


def weight_bytes(config) -> int:
    """The model's weights in its dtype."""
    return parameter_count(config) * config.element_bytes


def rotary_table_bytes(config) -> int:
    """The llama family's cos and sin of every position (max_length, D) each, kept in the model's dtype."""
    return 0 if config.family == "gpt2" else 2 * config.max_length * config.head_dim * config.element_bytes


# A quantized kind that holds fewer than this share of its positions quantized at the end of a loop (the rest in
# its full-precision residual) is measuring mostly float's bytes and drift, not its format's: at lengths inside
# R + G it quantizes nothing, and its "of float 1.00" and KL of 1e-11 say nothing about int8 or int4. The report
# marks such a cell and `kvbench run` warns of it (the "unquantized" mark of kvbench.report.record.model).
QUANTIZED_SHARE_FLOOR = 0.5


def quantized_positions(length: int, group_size: int = GROUP_SIZE, residual: int = RESIDUAL) -> int:
    """Positions kvbench's quantized kinds hold in the integer store after `length`: whole groups of G that are
    no longer among the newest R, Tq = G * floor((T - R) / G) (0 while T < R + G)."""
    return group_size * max(0, (length - residual) // group_size)


def quantized_cache_parts(config, batch: int, length: int, bits: int, group_size: int = GROUP_SIZE,
                          residual: int = RESIDUAL, recent_positions: int | None = None) -> dict[str, int]:
    """Retained bytes of a quantized cache holding `length` positions, by part. Assumptions, all counted:

    - the newest positions stay in the model's dtype: Tq = G * floor((T - R) / G) positions are
      quantized (0 while T < R + G), T - Tq are not ("residual");
    - quantized elements take bits / 8 bytes (int4: two per byte; the head width is even) ("codes");
    - keys: one float16 scale and one float16 minimum per channel per group of G tokens ("key_scales");
    - values: one float16 scale and one float16 minimum per token per group of gcd(G, D) channels
      ("value_scales");
    - keys and values, every layer, every sequence of the batch, every key/value head.

    `recent_positions`: the full-precision positions counted instead of T - Tq (what a cache allocates for its
    window of recent positions rather than what it holds, kvbench.serving.admission).
    """
    _count(batch=batch, length=length)
    D, heads = config.head_dim, config.layers * batch * config.kv_heads
    quantized = quantized_positions(length, group_size, residual)
    return {
        "codes": heads * 2 * quantized * D * bits // 8,
        "key_scales": heads * (quantized // group_size) * D * 2 * SCALE_BYTES,
        "value_scales": heads * quantized * (D // math.gcd(group_size, D)) * 2 * SCALE_BYTES,
        "residual": heads * 2 * (length - quantized if recent_positions is None else recent_positions) * D
                    * config.element_bytes,
    }


def quantized_cache_bytes(config, batch: int, length: int, bits: int, group_size: int = GROUP_SIZE,
                          residual: int = RESIDUAL, recent_positions: int | None = None) -> int:
    """Retained bytes of a quantized cache holding `length` positions: the parts of quantized_cache_parts."""
    return sum(quantized_cache_parts(config, batch, length, bits, group_size, residual, recent_positions).values())


def check_quantized_options(bits: int | None, head_dim: int, group_size: int, residual: int) -> None:
    """What a quantized representation needs, for the cache and for `kvbench budget` alike."""
    for name, value, lowest in (("group_size", group_size, 1), ("residual", residual, 0)):
        positive_int(name, value, lowest)
    if bits == 4 and head_dim % 2:
        raise ValueError(f"int4 packs two values per byte: expected an even head width, got {head_dim}")


# -- how a check is judged ----------------------------------------------------------------

# (atol, rtol) per dtype name; float32 is the source document's 1e-5.
TOLERANCES = {"float64": (1e-10, 1e-10), "float32": (1e-5, 1e-5), "float16": (2e-3, 2e-3), "bfloat16": (2e-2, 2e-2)}
# bfloat16 keeps 8 significant bits, and every layer rounds the residual stream: measured against float64 on
# the same weights (results/limit/bf16-error.json), each path's logits are off by up to 0.017 (llama-mini,
# 4 layers) and 0.063 (qwen2.5-0.5b, 24 layers), growing as sqrt(layers); the cached and the full-prefix paths
# run different kernels (a one-row step, a c-row prefix) and may err in opposite directions, so their
# difference may reach twice that. Hence atol = rtol = this x sqrt(layers), at least TOLERANCES' (docs/protocol.md).
DEPTH_SCALED = {"bfloat16": 3e-2}
# A device's kernels (device type -> dtype -> floor of (atol, rtol)): on CUDA, with TF32 off, a one-row step and a
# c-row prefix still run different cuBLAS and SDPA kernels (split-K, flash or memory-efficient attention) whose
# reduction orders differ from each other and from the CPU's. UNMEASURED: set from the rounding of those kernels
# (float32's 2^-24 over sums of thousands of terms) before any GPU run; scripts/gpu_check.sh's gate records the
# differences that will replace them (docs/gpu.md).
DEVICE_TOLERANCES = {"cuda": {"float32": (1e-4, 1e-4), "float16": (5e-3, 5e-3), "bfloat16": (4e-2, 4e-2)}}


def tolerance_for(dtype: str, layers: int = 1, device: str = "cpu") -> tuple[float, float]:
    """(atol, rtol) of the exact gate for a model of `layers` layers in `dtype` (a name) on `device` (a type)."""
    atol, rtol = TOLERANCES.get(dtype, TOLERANCES["float32"])
    floor = DEVICE_TOLERANCES.get(device, {}).get(dtype)
    if floor is not None:
        atol, rtol = max(atol, floor[0]), max(rtol, floor[1])
    if dtype in DEPTH_SCALED:
        scaled = DEPTH_SCALED[dtype] * math.sqrt(layers)
        atol, rtol = max(atol, scaled), max(rtol, scaled)
    return atol, rtol

# A trained model's (kvbench.models.gguf): on SmolLM2-135M (30 layers, logits up to 36) transformers' own DynamicCache
# departs from its own full prefix by up to 1.7e-4 in float32, 17 times the seed's bound, and kvbench's caches by
# 2.1e-4: rounding along two paths through thirty trained layers, not a bug (docs/drift.md). 5e-4 leaves room for
# longer contexts and is still 4 orders of magnitude below what a wrong block does (norms or a rotation missed:
# differences of 1 to 30). Other dtypes: ten times their random-weight bound, unmeasured.
TRAINED_TOLERANCES = {"float64": (1e-9, 1e-9), "float32": (5e-4, 5e-4), "float16": (2e-2, 2e-2),
                      "bfloat16": (2e-1, 2e-1)}

# Why a check failed, in the words the record and the report use. A non-finite reference is told
# apart from a cached path that diverged: the full-prefix path is the yardstick, and when it is
# NaN or infinite (a float16 model overflowing) nothing can be judged against it.
REFERENCE_NOT_FINITE = "reference not finite"
NOT_FINITE = "not finite"  # this mode's own logits
DIVERGED = "diverged"  # an exact kind beyond the dtype's tolerance
DRIFTED = "drift beyond limits"  # a lossy kind beyond its own limits
FAILURES = (REFERENCE_NOT_FINITE, NOT_FINITE, DIVERGED, DRIFTED)


def top1_within(drift: dict, limit: float) -> bool:
    """A rate cannot be judged on fewer steps than its resolution: at 0.99 on 40 steps one
    disagreement is already 97.5%. So a single disagreeing step never fails a kind by
    itself (KL and |Δ| still judge it). A record from before the count was kept
    (no `top1_disagreements`) is judged on the rate alone, as it was written."""
    return drift["top1_agreement"] >= limit or drift.get("top1_disagreements") in (0, 1)


DRIFT_METRICS = {  # metric -> whether a drift passes its limit on it
    "max_abs_diff": lambda drift, limit: drift["max_abs_diff"] <= limit,
    "kl_mean": lambda drift, limit: drift["kl_mean"] <= limit,
    "kl_max": lambda drift, limit: drift["kl_max"] <= limit,
    "top1_agreement": top1_within,
}


def within_limits(drift: dict, limits: dict) -> bool:
    """Every metric within its limit, and no step without a distribution on either side."""
    return (drift["non_finite"] == 0 and drift.get("reference_non_finite", 0) == 0
            and all(DRIFT_METRICS[name](drift, limit) for name, limit in limits.items()))


# -- what a score-based evicting kind keeps (kvbench.cache.scored) ---------------------------------

EVICTION_OPTIONS = ("evict_ratio", "kv_keep", "evict_every")  # --evict-ratio, --kv-keep, --evict-every
DEFAULT_EVICT_RATIO = 0.5  # kvpress's examples' compression ratio
SNAPKV_WINDOW, PYRAMID_BETA = 64, 20  # kvpress's SnapKVPress window (PyramidKVPress's too) and beta
POSITION_BYTES = 8  # an int64 absolute position per retained key and key/value head


def keep_budget(length: int, evict_ratio: float | None = None, kv_keep: int | None = None) -> int:
    """Positions each head keeps once `length` were appended: kvpress's max(1, int(T * (1 - r))), or kv_keep."""
    if kv_keep is not None:
        return min(kv_keep, length)
    ratio = DEFAULT_EVICT_RATIO if evict_ratio is None else evict_ratio
    return max(1, int(length * (1 - ratio)))


def pyramid_budget(layer: int, layers: int, length: int, evict_ratio: float | None = None,
                   kv_keep: int | None = None) -> int:
    """kvpress's PyramidKVPress.get_layer_budget: more positions in lower layers, SnapKV's total; SnapKV's budget
    where the pyramid does not fit (a short prompt, one layer). kv_keep N reads as the ratio keeping N on average."""
    ratio = (DEFAULT_EVICT_RATIO if evict_ratio is None else evict_ratio) if kv_keep is None else \
        1 - min(kv_keep, length) / length
    capacity = SNAPKV_WINDOW + length * (1 - ratio)
    least = (capacity - SNAPKV_WINDOW) / PYRAMID_BETA
    most = (capacity - SNAPKV_WINDOW) * 2 - least
    if most >= length - SNAPKV_WINDOW:
        most = length - SNAPKV_WINDOW
        least = (capacity - SNAPKV_WINDOW) * 2 - most
    if layers == 1 or not length >= most >= least >= SNAPKV_WINDOW:
        budget = round(length * (1 - ratio))
    else:
        budget = round(most - layer * (most - least) / (layers - 1))
    return min(length, max(1, budget))


def scored_cache_bytes(config, batch: int, length: int, pyramid: bool = False, evict_ratio: float | None = None,
                       kv_keep: int | None = None, evict_every: int | None = None) -> int:
    """What a score-based kind holds for `length` positions once compressed (kvbench.cache.scored: after its
    prompt, and at every evict_every-th step): each layer's budget of keys, values and each one's int64 position
    per key/value head. Between compressions it holds the positions decoded since as well."""
    _count(batch=batch, length=length)
    per_position = batch * config.kv_heads * (2 * config.head_dim * config.element_bytes + POSITION_BYTES)
    if pyramid:
        return per_position * sum(pyramid_budget(layer, config.layers, length, evict_ratio, kv_keep)
                                  for layer in range(config.layers))
    return per_position * config.layers * keep_budget(length, evict_ratio, kv_keep)


def scored_held_bytes(config, capacity: int, prompt: int, pyramid: bool = False, observation: int = 0,
                      totals: bool = False, evict_ratio: float | None = None, kv_keep: int | None = None,
                      evict_every: int | None = None) -> list[int]:
    """What a score-based kind's cache for one request holds between its steps (kvbench.cache.scored made with
    `prompt`): [0] its whole prompt, uncompressed (the most any of its prefill chunks reaches), then [t] after t
    one-token steps (capacity - prompt of them), the first compressing each layer back to its budget before it
    attends, and every evict_every-th after it. Per layer: each held position's key, value and int64 position per
    key/value head, its running score where the kind keeps `totals` (h2o), and the `observation` newest queries
    a kind that scores from queries keeps (snapkv's window)."""
    _count(capacity=capacity, prompt=prompt)
    if not 1 <= prompt <= capacity:
        raise ValueError(f"a request's prompt is in [1, capacity {capacity}] positions, got {prompt}")
    element = config.element_bytes
    per_position = config.kv_heads * (2 * config.head_dim * element + POSITION_BYTES + (element if totals else 0))
    per_query = config.layers * config.heads * config.head_dim * element
    layers = range(config.layers) if pyramid else range(1)  # without a pyramid every layer keeps the same
    weight = 1 if pyramid else config.layers

    def budget(layer: int, length: int) -> int:
        if pyramid:
            return pyramid_budget(layer, config.layers, length, evict_ratio, kv_keep)
        return keep_budget(length, evict_ratio, kv_keep)

    held = [prompt for _ in layers]
    timeline = [per_position * weight * sum(held) + per_query * min(observation, prompt)]
    for step in range(capacity - prompt):
        if step == 0 or (evict_every is not None and step % evict_every == 0):
            held = [min(kept, budget(layer, prompt + step)) for kept, layer in zip(held, layers)]
        held = [kept + 1 for kept in held]
        timeline.append(per_position * weight * sum(held) + per_query * min(observation, prompt + step + 1))
    return timeline


def scored_reserved_bytes(config, capacity: int, prompt: int, **options) -> int:
    """The most a score-based kind's cache for one request ever holds (scored_held_bytes): what a serving run
    reserves at admission, before the compression that gives part of it back."""
    return max(scored_held_bytes(config, capacity, prompt, **options))
