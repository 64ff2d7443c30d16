"""Teacher-forced decode loops and the equivalence gate. No timing here.

Every mode consumes the same predetermined token ids, so generation choices never
change the workload. ``full`` re-runs the whole prefix at every step; a cache kind
feeds one new token per step and keeps the rest. Both produce, for every step t,
the logits at the last position (the prediction for token t + 1).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from kvbench.cache import CACHE_KINDS, Cache, expected_cache_bytes, make_cache
from kvbench.model import Decoder, DecoderConfig, dtype_name

FULL = "full"
MODES = (FULL, *CACHE_KINDS)

# (atol, rtol) per dtype; float32 is the source document's 1e-5.
TOLERANCES = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}


def check_modes(modes: list[str] | tuple[str, ...]) -> list[str]:
    modes = list(modes)
    if not modes:
        raise ValueError(f"at least one mode is required, choose from {list(MODES)}")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown mode {unknown[0]!r}: expected one of {list(MODES)}")
    if len(set(modes)) != len(modes):
        raise ValueError(f"modes must be distinct, got {modes}")
    return modes


def token_ids(config: DecoderConfig, batch: int, length: int, seed: int = 0) -> Tensor:
    """Predetermined ids (B, T); a shorter length gives a prefix of a longer one."""
    if length > config.max_length:
        raise ValueError(f"length must be <= max_length {config.max_length}, got {length}")
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (batch, config.max_length), generator=generator)
    return ids[:, :length].clone()


def decode_full(model: Decoder, ids: Tensor, keep_logits: bool = False) -> Tensor | None:
    """Re-run the whole prefix at every step: step t processes ids[:, :t + 1]."""
    T = ids.shape[1]
    kept = _new_logits(model, ids) if keep_logits else None
    with torch.inference_mode():
        for t in range(T):
            logits, _ = model(ids[:, : t + 1])
            if kept is not None:
                kept[:, t] = logits[:, -1]
    return kept


def decode_cached(model: Decoder, ids: Tensor, kind: str, keep_logits: bool = False) -> Tensor | None:
    """Feed one token per step into a fresh `kind` cache sized for the whole sequence."""
    kept = _new_logits(model, ids) if keep_logits else None
    cache = _cached_loop(model, ids, kind, kept)
    _release(cache)
    return kept


def _cached_loop(model: Decoder, ids: Tensor, kind: str, kept: Tensor | None) -> Cache:
    B, T = ids.shape
    with torch.inference_mode():
        cache = make_cache(kind, model.config, batch=B, capacity=T)
        for t in range(T):
            logits, cache = model(ids[:, t : t + 1], cache)
            if kept is not None:
                kept[:, t] = logits[:, -1]
    return cache


def _new_logits(model: Decoder, ids: Tensor) -> Tensor:
    B, T = ids.shape
    return torch.empty(B, T, model.config.vocab_size, dtype=model.config.dtype)


def _release(cache: Cache) -> None:
    release = getattr(cache, "release", None)  # paged caches return blocks to their pool
    if release is not None:
        release()


def cache_footprint(model: Decoder, ids: Tensor, mode: str) -> dict:
    """Bytes held at the end of a loop: measured from tensors, reserved, and the formula.

    For the full-prefix path this is the throwaway cache of its last step.
    """
    B, T = ids.shape
    if mode == FULL:
        with torch.inference_mode():
            _, cache = model(ids)
    else:
        cache = _cached_loop(model, ids, mode, None)
    footprint = {
        "expected_bytes": expected_cache_bytes(model.config, B, T),
        "measured_bytes": cache.nbytes,
        "reserved_bytes": cache.reserved_bytes,
    }
    _release(cache)
    return footprint


def decode(model: Decoder, ids: Tensor, mode: str, keep_logits: bool = False) -> Tensor | None:
    """One teacher-forced decode loop of `mode` over all of `ids`: the unit that is timed."""
    if mode == FULL:
        return decode_full(model, ids, keep_logits)
    return decode_cached(model, ids, mode, keep_logits)


@dataclass(frozen=True)
class Equivalence:
    """How closely a mode's last-position logits follow the full-prefix path's."""

    mode: str
    length: int
    passed: bool
    max_abs_diff: float
    max_rel_diff: float
    first_divergent_position: int | None  # earliest step whose logits exceed tolerance
    non_finite: int  # NaN or infinite logits (each one fails the check)
    atol: float
    rtol: float
    dtype: str

    def to_dict(self) -> dict:
        return asdict(self)


def tolerances(dtype: torch.dtype) -> tuple[float, float]:
    return TOLERANCES.get(dtype, TOLERANCES[torch.float32])


def compare_logits(mode: str, candidate: Tensor, reference: Tensor, atol: float, rtol: float) -> Equivalence:
    """candidate, reference: (B, T, V) last-position logits per step, in the model's dtype."""
    dtype = dtype_name(reference.dtype)
    if candidate.shape != reference.shape:
        raise ValueError(f"logits shapes differ: reference {tuple(reference.shape)}, {mode} {tuple(candidate.shape)}")
    candidate, reference = candidate.double(), reference.double()
    difference = (candidate - reference).abs()
    relative = difference / reference.abs().clamp_min(torch.finfo(torch.float32).tiny)
    non_finite = ~torch.isfinite(candidate)
    outside = (difference > atol + rtol * reference.abs()) | non_finite
    failing_steps = outside.any(dim=-1).any(dim=0).nonzero()
    first = int(failing_steps[0]) if len(failing_steps) else None
    # NaN/inf logits make the differences non-finite too, and JSON cannot hold them:
    # report the differences over the finite logits and count the rest.
    finite = ~non_finite
    return Equivalence(
        mode=mode,
        length=reference.shape[1],
        passed=first is None,
        max_abs_diff=float(difference[finite].max()) if finite.any() else 0.0,
        max_rel_diff=float(relative[finite].max()) if finite.any() else 0.0,
        first_divergent_position=first,
        non_finite=int(non_finite.sum()),
        atol=atol,
        rtol=rtol,
        dtype=dtype,
    )


def check_equivalence(
    model: Decoder,
    ids: Tensor,
    modes: list[str] | tuple[str, ...],
    reference: Tensor | None = None,
    atol: float | None = None,
    rtol: float | None = None,
) -> dict[str, Equivalence]:
    """The gate: compare every mode's logits with the full-prefix path's at every step.

    `reference` (B, >= T, V) may be full-prefix logits computed once for a longer
    prefix of the same ids: step t depends only on ids[:, :t + 1].
    """
    default_atol, default_rtol = tolerances(model.config.dtype)
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    T = ids.shape[1]
    if reference is None:
        reference = decode_full(model, ids, keep_logits=True)
    reference = reference[:, :T]
    results = {}
    for mode in check_modes(modes):
        candidate = reference if mode == FULL else decode(model, ids, mode, keep_logits=True)
        results[mode] = compare_logits(mode, candidate, reference, atol, rtol)
    return results
