"""Teacher-forced decode loops, the one stepper every loop drives, and the equivalence gate. No timing here.

Every mode consumes the same predetermined token ids, so generation choices never change the workload: ``full``
re-runs the whole prefix at every step, a cache kind feeds one new token per step; both give, for every step t, the
logits at the last position. Every loop in kvbench (timed loop, request, steps at a context, per-step profile,
footprint, gate, asv suites) drives one stepper, :func:`steps`; each mode's spec (kvbench.modes) names it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace

import torch
from torch import Tensor

from kvbench import modes as registry  # `modes` is the gate's parameter: a list of mode names
from kvbench.cache import Cache, make_cache
from kvbench.cache.evicting import masked_reference
from kvbench.config import DecoderConfig, dtype_name
from kvbench.kinds import DIVERGED, DRIFTED, NOT_FINITE, REFERENCE_NOT_FINITE, tolerance_for, within_limits
from kvbench.kinds import TOLERANCES as TOLERANCES_BY_NAME
from kvbench.model import Decoder
from kvbench.modes import FULL
from kvbench.modes import MODES as MODES  # benchmarks/common.py reads decode.MODES at every commit asv measures


def known_modes() -> tuple[str, ...]:
    """Every mode this process can run: the shipped ones, transformers' caches and any kind registered since."""
    return registry.names()


TOLERANCES = {getattr(torch, name): bounds for name, bounds in TOLERANCES_BY_NAME.items()}  # (atol, rtol) per dtype


def check_modes(mode_names: list[str] | tuple[str, ...]) -> list[str]:
    """The modes as a list, or ValueError naming the first unknown or repeated one (registered kinds included)."""
    return registry.check_modes(mode_names)


def token_ids(config: DecoderConfig, batch: int, length: int, seed: int = 0, device=None) -> Tensor:
    """Predetermined ids (B, T) on `device` (None: the CPU); a shorter length gives a prefix of a longer one."""
    if length > config.max_length:
        raise ValueError(f"length must be <= max_length {config.max_length}, got {length}")
    generator = torch.Generator().manual_seed(seed)
    # Drawn on the host by the host's generator, whatever the device: every device runs the same ids.
    ids = torch.randint(0, config.vocab_size, (batch, config.max_length), generator=generator, device="cpu")
    return ids[:, :length].clone().to(device or "cpu")


def steps(model: Decoder, ids: Tensor, mode: str, prompt: int = 1, cache=None,
          options: dict | None = None) -> Iterator[tuple[Tensor, Cache]]:
    """The one stepper: yields (last-position logits (B, V), the cache) for the first `prompt` tokens of ids
    (B, T) in one call, then for each later token, one a step: T - prompt + 1 steps. Prompt 1 is the decode
    loop, prompt P a request, prompt c then a few steps the steps at a context.

    The mode's spec names the stepper behind it. A stepper that makes its own cache sizes it for the whole of
    ids and releases it when the generator finishes or is closed; `cache`, one the caller owns (a fork drawn
    from a shared BlockPool, say), is continued from the positions it holds and never released here. `options`
    maps a mode to the keyword arguments its cache is made with. Drive it inside torch.inference_mode(): the
    generator leaves the autograd mode to its caller, so it costs nothing per step.
    """
    T = ids.shape[1]
    if isinstance(prompt, bool) or not isinstance(prompt, int) or not 1 <= prompt <= T:
        raise ValueError(f"prompt must be in [1, {T}] tokens of the {T} ids, got {prompt!r}")
    spec = registry.spec(mode)
    return spec.steps()(model, ids, mode, prompt, cache, (options or {}).get(mode, {}))


def full_steps(model: Decoder, ids: Tensor, mode: str, prompt: int, cache, options: dict) -> Iterator[tuple[Tensor, Cache]]:
    """The full-prefix path: each step re-runs ids[:, :end] and yields that call's throwaway cache."""
    if cache is not None:
        raise ValueError(f"{mode} keeps no cache between steps: expected cache=None, got {type(cache).__name__}")
    for end in range(prompt, ids.shape[1] + 1):
        logits, throwaway = model(ids[:, :end])
        yield logits[:, -1], throwaway


def cache_steps(model: Decoder, ids: Tensor, mode: str, prompt: int, cache: Cache | None,
                options: dict) -> Iterator[tuple[Tensor, Cache]]:
    """A kvbench cache kind: the prompt's tokens not yet in the cache in one call, then one token a step."""
    B, T = ids.shape
    owned = cache is None
    if owned:
        cache = make_cache(mode, model.config, batch=B, capacity=T, device=model.device, **options)
    else:
        check_callers_cache(mode, cache, prompt)
    try:
        logits, cache = model(ids[:, cache.length : prompt], cache)
        yield logits[:, -1], cache
        for t in range(prompt, T):
            logits, cache = model(ids[:, t : t + 1], cache)
            yield logits[:, -1], cache
    finally:
        if owned:
            cache.release()


def check_callers_cache(mode: str, cache: Cache, prompt: int) -> None:
    """A cache the caller owns must be of the mode's kind and hold fewer positions than the prompt: its first
    step computes the logits of position prompt - 1."""
    factory = registry.spec(mode).cache_factory()
    if not isinstance(cache, factory):
        raise ValueError(f"mode {mode!r} steps a {factory.__name__}, got {type(cache).__name__}")
    if cache.length >= prompt:
        raise ValueError(f"the cache holds {cache.length} positions: expected fewer than the prompt's {prompt}, "
                         "whose last position's logits the first step computes")


def decode(model: Decoder, ids: Tensor, mode: str, keep_logits: bool = False, options: dict | None = None) -> Tensor | None:
    """One teacher-forced decode loop of `mode` over all of `ids`: the unit that is timed."""
    if registry.spec(mode).source == registry.FULL_PREFIX:  # the asv suites time the two paths by these two names
        return decode_full(model, ids, keep_logits)
    return decode_cached(model, ids, mode, keep_logits, options)


def decode_full(model: Decoder, ids: Tensor, keep_logits: bool = False) -> Tensor | None:
    """Re-run the whole prefix at every step: step t processes ids[:, :t + 1]."""
    return drain(model, ids, FULL, keep_logits, None)


def decode_cached(model: Decoder, ids: Tensor, kind: str, keep_logits=False, options=None) -> Tensor | None:
    """Feed one token per step into a fresh `kind` cache sized for the whole sequence."""
    return drain(model, ids, kind, keep_logits, options)


def drain(model: Decoder, ids: Tensor, mode: str, keep_logits: bool, options: dict | None,
          prompt: int = 1, cache: Cache | None = None) -> Tensor | None:
    """Run every step of `mode` over ids (continuing `cache` when given); (B, steps, V) logits when kept."""
    B, T = ids.shape
    kept = torch.empty(B, T - prompt + 1, model.config.vocab_size, dtype=model.config.dtype,
                       device=model.device) if keep_logits else None
    with torch.inference_mode():
        for t, (logits, _) in enumerate(steps(model, ids, mode, prompt, cache, options)):
            if kept is not None:
                kept[:, t] = logits
    return kept


def evicting_logits(model: Decoder, ids: Tensor, mode: str, prompt=1, options=None) -> tuple[Tensor, Tensor]:
    """An evicting kind's (B, steps, V) last-position logits over ids from `prompt` on, and the reference its
    mechanics are judged by: the same rows of the full path masked to exactly the positions it kept."""
    cache = make_cache(mode, model.config, batch=ids.shape[0], capacity=ids.shape[1], device=model.device,
                       **(options or {}).get(mode, {}))
    cache.history = []  # the positions each step's keys had: the reference's mask
    try:
        kept = drain(model, ids, mode, True, options, prompt, cache)
    finally:
        cache.release()
    return kept, masked_reference(model, ids, cache.history)[:, prompt - 1 :]


def gated_logits(model: Decoder, ids: Tensor, mode: str, prompt: int, reference: Tensor, options=None) -> tuple:
    """(candidate, reference) a mode is judged on from `prompt` on: its logits and full's (`reference`), or for a
    kind that evicts by its own rule, its logits and the full path masked to what it kept."""
    spec = registry.spec(mode)
    if spec.evicts:
        return evicting_logits(model, ids, mode, prompt, options)
    if spec.source == registry.FULL_PREFIX:  # the reference is full's own logits: judging them needs no second run
        return reference, reference
    return drain(model, ids, mode, True, options, prompt), reference


@dataclass(frozen=True)
class Equivalence:
    """How closely a mode's last-position logits follow the full-prefix path's."""

    mode: str
    length: int
    passed: bool
    max_abs_diff: float
    max_rel_diff: float
    first_divergent_position: int | None  # earliest step that fails: beyond tolerance, or not finite on either side
    non_finite: int  # NaN or infinite logits of this mode (each one fails the check)
    atol: float
    rtol: float
    dtype: str
    tolerance_used: float  # largest |diff| / (atol + rtol |reference|): above 1 fails
    exact: bool = True
    reference_max_abs: float | None = None  # largest finite |reference logit|: no passing |diff| exceeds atol + rtol * it
    reference_non_finite: int = 0  # NaN or infinite full-prefix logits (each one fails the check)
    first_reference_non_finite: int | None = None  # earliest step whose full-prefix logits are not finite
    failure: str | None = None  # None when passed, else one of kvbench.kinds.FAILURES (the reference's first)

    def to_dict(self) -> dict:
        return asdict(self)


def tolerances(dtype: torch.dtype, layers: int = 1, device: str = "cpu") -> tuple[float, float]:
    """(atol, rtol) of the exact gate in `dtype` for a model of `layers` layers on a device type
    (kvbench.kinds.tolerance_for)."""
    return tolerance_for(dtype_name(dtype), layers, device)


def is_trained(model: Decoder) -> bool:
    """Whether the model holds trained weights (kvbench.models.gguf marks them with their gate tolerance)."""
    return getattr(model, "gate_tolerance", None) is not None


def model_tolerances(model: Decoder) -> tuple[float, float]:
    """The gate's (atol, rtol): its dtype's, or those a trained model carries (`gate_tolerance`, docs/drift.md)."""
    return getattr(model, "gate_tolerance", None) or tolerances(model.config.dtype, model.config.layers,
                                                                model.device.type)


def first_step(bad: Tensor) -> int | None:
    """The earliest step t at which `bad` (B, T, V) is True for any sequence and logit."""
    return int(found[0]) if len(found := bad.any(dim=-1).any(dim=0).nonzero()) else None


def compare_logits(mode: str, candidate: Tensor, reference: Tensor, atol: float, rtol: float) -> Equivalence:
    """candidate, reference: (B, T, V) last-position logits per step, in the model's dtype.

    A NaN or infinite value on either side fails the step: NaN compares False with any
    bound, so without this a NaN in the reference would pass every mode checked against it.
    """
    dtype = dtype_name(reference.dtype)
    if candidate.shape != reference.shape:
        raise ValueError(f"logits shapes differ: reference {tuple(reference.shape)}, {mode} {tuple(candidate.shape)}")
    candidate, reference = candidate.double(), reference.double()
    candidate_bad, reference_bad = ~torch.isfinite(candidate), ~torch.isfinite(reference)
    finite = ~(candidate_bad | reference_bad)
    difference = (candidate - reference).abs()
    relative = difference / reference.abs().clamp_min(torch.finfo(torch.float32).tiny)
    bound = atol + rtol * reference.abs()
    first = first_step((difference > bound) | ~finite)
    non_finite, reference_non_finite = int(candidate_bad.sum()), int(reference_bad.sum())
    failure = (None if first is None else REFERENCE_NOT_FINITE if reference_non_finite
               else NOT_FINITE if non_finite else DIVERGED)
    # JSON cannot hold NaN or inf: the differences are over the logits finite on both sides; the rest are counted.
    used = difference / bound.clamp_min(torch.finfo(torch.float64).tiny)
    kept = reference.abs()[~reference_bad]
    return Equivalence(
        mode=mode,
        length=reference.shape[1],
        passed=first is None,
        max_abs_diff=float(difference[finite].max()) if finite.any() else 0.0,
        max_rel_diff=float(relative[finite].max()) if finite.any() else 0.0,
        first_divergent_position=first,
        non_finite=non_finite,
        atol=atol,
        rtol=rtol,
        dtype=dtype,
        tolerance_used=float(used[finite].max()) if finite.any() else 0.0,
        reference_max_abs=float(kept.max()) if kept.numel() else 0.0,
        reference_non_finite=reference_non_finite,
        first_reference_non_finite=first_step(reference_bad),
        failure=failure,
    )


@dataclass(frozen=True)
class Drift:
    """How far a lossy kind's logits drift from the full-prefix path's, judged by the kind's own limits.

    A lossy kind is never called exact: it passes when every metric is within its limit.
    KL is of the next-token distributions, full-prefix as the truth: KL(P_full || P_kind).
    """

    mode: str
    length: int
    passed: bool
    max_abs_diff: float
    max_rel_diff: float
    first_divergent_position: int | None  # earliest step whose top-1 token differs
    non_finite: int
    atol: float
    rtol: float
    dtype: str
    kl_mean: float
    kl_max: float
    top1_agreement: float  # share of steps (and sequences) whose top-1 token agrees
    limits: dict
    exact: bool = False
    top1_disagreements: int = 0  # (sequence, step) pairs whose top-1 token differs
    reference_non_finite: int = 0  # NaN or infinite full-prefix logits: nothing can be judged against them
    first_reference_non_finite: int | None = None
    failure: str | None = None  # None when passed, else REFERENCE_NOT_FINITE, NOT_FINITE or DRIFTED

    def to_dict(self) -> dict:
        return asdict(self)


def top1_agrees(candidate: Tensor, reference: Tensor, atol: float, rtol: float) -> Tensor:
    """(B, T) True where the kind's top-1 token is a top-1 token of the full-prefix path.

    Random-weight logits have exact near-ties: two tokens whose full-prefix logits differ by
    less than float32's tolerance are the same choice to the reference itself, so picking
    either is agreement. A disagreement is a token the reference ranks measurably lower.
    """
    best = reference.max(dim=-1).values
    picked = reference.gather(-1, candidate.argmax(dim=-1, keepdim=True)).squeeze(-1)
    return best - picked <= atol + rtol * best.abs()


def compare_drift(mode: str, candidate: Tensor, reference: Tensor, limits: dict, atol: float, rtol: float) -> Drift:
    """candidate, reference: (B, T, V) last-position logits per step."""
    exact = compare_logits(mode, candidate, reference, atol, rtol)
    candidate, reference = candidate.double(), reference.double()
    finite = (torch.isfinite(candidate) & torch.isfinite(reference)).all(dim=-1)  # (B, T) steps with both distributions
    truth = torch.log_softmax(reference, dim=-1)
    kl = (truth.exp() * (truth - torch.log_softmax(candidate, dim=-1))).sum(dim=-1)[finite]  # nats per step
    agree = top1_agrees(candidate, reference, atol, rtol) & finite  # (B, T)
    disagreeing = (~agree).any(dim=0).nonzero()
    metrics = {"max_abs_diff": exact.max_abs_diff, "kl_mean": float(kl.mean()) if kl.numel() else 0.0,
               "kl_max": float(kl.max()) if kl.numel() else 0.0, "top1_agreement": float(agree.double().mean()),
               "non_finite": exact.non_finite, "top1_disagreements": int((~agree).sum()),
               "reference_non_finite": exact.reference_non_finite}
    passed = within_limits(metrics, limits)
    failure = None if passed else exact.failure if exact.failure in (REFERENCE_NOT_FINITE, NOT_FINITE) else DRIFTED
    return Drift(
        mode=mode, length=reference.shape[1], passed=passed, max_abs_diff=exact.max_abs_diff,
        max_rel_diff=exact.max_rel_diff, first_divergent_position=int(disagreeing[0]) if len(disagreeing) else None,
        non_finite=exact.non_finite, atol=atol, rtol=rtol, dtype=exact.dtype, kl_mean=metrics["kl_mean"],
        kl_max=metrics["kl_max"], top1_agreement=metrics["top1_agreement"], limits=dict(limits),
        top1_disagreements=metrics["top1_disagreements"], reference_non_finite=exact.reference_non_finite,
        first_reference_non_finite=exact.first_reference_non_finite, failure=failure,
    )


def check_equivalence(
    model: Decoder,
    ids: Tensor,
    modes: list[str] | tuple[str, ...],
    reference: Tensor | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    options: dict | None = None,
) -> dict[str, Equivalence | Drift]:
    """Compare every mode's logits with the full-prefix path's at every step: an exact kind
    within the dtype's tolerance (Equivalence), a lossy kind within its own drift limits (Drift).

    `reference` (B, >= T, V) may be full-prefix logits computed once for a longer
    prefix of the same ids: step t depends only on ids[:, :t + 1].
    """
    default_atol, default_rtol = model_tolerances(model)
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    T = ids.shape[1]
    if reference is None:
        reference = decode_full(model, ids, keep_logits=True)
    reference = reference[:, :T]
    results = {}
    for mode in check_modes(modes):
        prompt = gate_prompt(mode, T)
        candidate, judged_by = gated_logits(model, ids, mode, prompt, reference, options)
        result = judge_logits(mode, candidate, judged_by, atol, rtol, model.config, is_trained(model))
        results[mode] = result if prompt == 1 else from_prompt(result, prompt, T)
    return results


def gate_prompt(mode: str, length: int) -> int:
    """The prompt a mode is gated with: one token, or for a kind that compresses its prompt (ModeSpec
    .compresses_prompt) the first half of the ids, so the steps judged are those after a compression."""
    return max(1, length // 2) if registry.spec(mode).compresses_prompt else 1


def from_prompt(result: Equivalence | Drift, prompt: int, length: int) -> Equivalence | Drift:
    """A check judged from row prompt - 1 on, told in the loop's terms: its length, and its steps' positions."""
    def shifted(step: int | None) -> int | None:
        return None if step is None else step + prompt - 1

    moved = {name: shifted(getattr(result, name)) for name in ("first_divergent_position", "first_reference_non_finite")
             if hasattr(result, name)}
    return replace(result, length=length, **moved)


def judge_logits(mode: str, candidate: Tensor, reference: Tensor, atol: float, rtol: float,
                 config: DecoderConfig, trained: bool = False) -> Equivalence | Drift:
    """A mode's logits against the full-prefix path's, by its kind's rule: a lossy kind within its own
    drift limits for this model's family (or for trained weights), every other mode within the tolerance."""
    spec = registry.SPECS.get(mode)
    if spec is not None and not spec.exact:
        return compare_drift(mode, candidate, reference, spec.limits_for(config, trained), atol, rtol)
    return compare_logits(mode, candidate, reference, atol, rtol)


def run_gate(model: Decoder, ids: Tensor, lengths: list[int], modes: list[str],
             reference: Tensor | None = None, options: dict | None = None) -> dict[tuple[str, int], dict]:
    """The gate of a run: every mode at every length against the full-prefix logits.

    `ids` holds the longest sequence; each length checks its prefix, against one
    reference computed once at the longest length. Returns {(mode, length): check
    dict}. A mode that raises becomes a failed check carrying the error, so one broken
    kind cannot cost the others.

    The policy for a mode that fails, everywhere in kvbench: it is never reported as a
    valid speedup. A mode whose logits differ still runs, so ``kvbench run`` times it and
    marks every number derived from it invalid (the record shows what the incorrect
    code costs); asv stores bare numbers with no validity flag, so its suites refuse to
    time it (the benchmark fails). A mode that raised cannot be timed anywhere.
    """
    if reference is None:
        reference = decode_full(model, ids[:, : max(lengths)], keep_logits=True)
    checks = {}
    for length in lengths:
        for mode in check_modes(modes):
            try:
                result = check_equivalence(model, ids[:, :length], [mode], reference=reference, options=options)[mode]
                checks[(mode, length)] = result.to_dict()
            except (KeyboardInterrupt, MemoryError):
                raise
            except Exception as error:  # noqa: BLE001 - any failure of the kind under test is its result
                checks[(mode, length)] = failed_check(mode, length, model.config.dtype, error)
    return checks


def failed_check(mode: str, length: int, dtype: torch.dtype, error: BaseException) -> dict:
    """The check of a mode that raised: failed, with the error and no differences to report."""
    atol, rtol = tolerances(dtype)  # the dtype's floor: a check that raised compared nothing
    text = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    return {"mode": mode, "length": length, "passed": False, "max_abs_diff": None, "max_rel_diff": None,
            "first_divergent_position": None, "non_finite": 0, "atol": atol, "rtol": rtol,
            "dtype": dtype_name(dtype), "error": text}


def timeable(check: dict | None) -> bool:
    """Whether a mode can be timed after the gate (it ran, whatever its logits)."""
    return check is not None and "error" not in check
