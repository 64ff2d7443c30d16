"""The quantized kinds: honest bytes (the named formula, from the tensors), codes that round-trip, bounded drift."""

from __future__ import annotations

import pytest
import torch

from kvbench.cache import QuantizedCache, QuantizedInt4Cache, expected_cache_bytes, make_cache, quantized_cache_bytes
from kvbench.modes import expected_bytes
from kvbench.config import preset_config
from kvbench.workloads.decode import check_equivalence, compare_drift, token_ids
from kvbench.model import DecoderConfig, build_model

SEED = DecoderConfig(max_length=512)


def test_the_formula_by_hand_on_the_medium_preset():
    """T=1024, G=32, R=128: 896 positions quantized, 128 kept; D=32, 8 KV heads, 4 layers, float32."""
    medium = preset_config("medium")
    full = expected_cache_bytes(medium, 1, 1024)
    assert full == 2 * 4 * 8 * 1024 * 32 * 4
    per_layer_int8 = 2 * 8 * 896 * 32 + 8 * 28 * 32 * 4 + 8 * 896 * 1 * 4 + 2 * 8 * 128 * 32 * 4
    assert quantized_cache_bytes(medium, 1, 1024, bits=8) == 4 * per_layer_int8 == 3_112_960
    per_layer_int4 = 2 * 8 * 896 * 16 + 8 * 28 * 32 * 4 + 8 * 896 * 1 * 4 + 2 * 8 * 128 * 32 * 4
    assert quantized_cache_bytes(medium, 1, 1024, bits=4) == 4 * per_layer_int4 == 2_195_456
    assert quantized_cache_bytes(medium, 1, 1024, bits=8) / full == pytest.approx(0.371, abs=5e-4)
    assert quantized_cache_bytes(medium, 1, 1024, bits=4) / full == pytest.approx(0.262, abs=5e-4)


def test_the_formula_keeps_short_sequences_in_full_precision():
    assert quantized_cache_bytes(SEED, 1, 100, bits=4) == expected_cache_bytes(SEED, 1, 100)
    assert quantized_cache_bytes(SEED, 1, 159, bits=4) == expected_cache_bytes(SEED, 1, 159)  # < R + G
    assert quantized_cache_bytes(SEED, 1, 160, bits=4) < expected_cache_bytes(SEED, 1, 160)


@pytest.mark.parametrize("cls", [QuantizedCache, QuantizedInt4Cache])
@pytest.mark.parametrize("batch, group, residual", [(1, 32, 128), (2, 4, 3), (1, 16, 0)])
def test_nbytes_counted_from_the_tensors_equals_the_formula(cls, batch, group, residual):
    model = build_model(SEED, seed=0)
    ids = token_ids(SEED, batch, 300)
    cache = cls(SEED, batch, capacity=300, group_size=group, residual=residual)
    with torch.inference_mode():
        for t, piece in enumerate((ids[:, :37], ids[:, 37:38], ids[:, 38:200], *ids[:, 200:].split(1, dim=1))):
            _, cache = model(piece, cache)
            assert cache.nbytes == expected_bytes(cls.kind, SEED, batch, cache.length, group_size=group, residual=residual)
    assert cache.quantized == group * ((300 - residual) // group)
    assert cache.reserved_bytes >= cache.nbytes


@pytest.mark.parametrize("cls", [QuantizedCache, QuantizedInt4Cache])
def test_dequantized_values_are_within_about_half_a_step_of_the_originals(cls):
    """Half a quantization step, plus what float16 scales and minimums round away."""
    cache = cls(SEED, 1, capacity=64, group_size=8, residual=0)
    generator = torch.Generator().manual_seed(0)
    cache._recent = torch.randn(1, 1, 4, 2, 64, 8, generator=generator)  # layers, B, KVH, keys/values, T, D
    originals = cache._recent.clone()
    cache.length = 64
    cache._quantize(0, 64)
    scale_k = cache._key_scales[0, ..., 0, :].float().repeat_interleave(8, dim=-2)  # per channel, 8 tokens a group
    assert ((cache.keys(0) - originals[0, :, :, 0]).abs() <= 0.65 * scale_k + 3e-3).all()
    scale_v = cache._value_scales[0, ..., 0].float().repeat_interleave(8, dim=-1)  # per token, 8 channels a group
    assert ((cache.values(0) - originals[0, :, :, 1]).abs() <= 0.65 * scale_v + 3e-3).all()
    assert cache.quantized == 64 and cache.nbytes == expected_bytes(cls.kind, SEED, 1, 64, group_size=8, residual=0)


def test_int4_packs_two_codes_per_byte_and_unpacks_them():
    cache = QuantizedInt4Cache(SEED, 1, capacity=64)
    codes = torch.arange(16, dtype=torch.uint8).repeat(2).view(1, 32)
    packed = cache._pack(codes)
    assert packed.shape == (1, 16) and packed.dtype == torch.uint8
    assert torch.equal(cache._unpack(packed), codes)
    with pytest.raises(ValueError, match="even head width, got 5"):
        QuantizedInt4Cache(DecoderConfig(width=20, heads=4), 1)


@pytest.mark.parametrize("kind", ["quantized-int8", "quantized-int4"])
def test_the_default_kinds_drift_within_their_limits_and_really_drift(kind):
    """Seed lab, T=256 with the defaults: 96 positions quantized."""
    model = build_model(SEED, seed=0)
    ids = token_ids(SEED, 1, 256)
    (check,) = check_equivalence(model, ids, [kind]).values()
    assert not check.exact and check.passed, check
    assert 0 < check.max_abs_diff and check.kl_mean > 0  # lossy: never exactly the full prefix
    assert check.limits == make_cache(kind, SEED).drift_limits


def test_drift_metrics_on_known_logits():
    reference = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [1.0, 1.0, 5.0]]])
    same = compare_drift("x", reference.clone(), reference, {"kl_mean": 0.0}, 1e-5, 1e-5)
    assert same.passed and same.kl_mean == 0 and same.top1_agreement == 1 and same.first_divergent_position is None
    assert same.top1_disagreements == 0
    swapped = reference.clone()
    swapped[0, 1] = torch.tensor([3.0, 0.0, 0.0])  # step 1 now prefers token 0
    swapped[0, 2] = torch.tensor([6.0, 1.0, 5.0])  # and step 2 too
    drift = compare_drift("x", swapped, reference, {"top1_agreement": 0.9}, 1e-5, 1e-5)
    assert drift.top1_agreement == pytest.approx(1 / 3) and drift.top1_disagreements == 2
    assert drift.first_divergent_position == 1
    assert not drift.passed and drift.kl_max > drift.kl_mean > 0
    p = torch.softmax(reference[0, 1].double(), 0)
    q = torch.softmax(swapped[0, 1].double(), 0)
    assert drift.kl_max == pytest.approx(float((p * (p / q).log()).sum()))


def test_one_disagreeing_step_is_below_the_resolution_of_a_rate_limit():
    """0.99 on three steps cannot be judged: one flip is 67%. KL still judges the same logits."""
    reference = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [1.0, 1.0, 5.0]]])
    flipped = reference.clone()
    flipped[0, 1] = torch.tensor([3.0, 0.0, 0.0])
    drift = compare_drift("x", flipped, reference, {"top1_agreement": 0.99}, 1e-5, 1e-5)
    assert drift.top1_disagreements == 1 and drift.top1_agreement == pytest.approx(2 / 3)
    assert drift.passed and drift.first_divergent_position == 1
    judged_by_kl = compare_drift("x", flipped, reference, {"top1_agreement": 0.99, "kl_max": 1e-3}, 1e-5, 1e-5)
    assert not judged_by_kl.passed


def test_a_tie_in_the_reference_is_not_a_disagreement():
    """Tokens the full-prefix path ranks equal within float32's tolerance are the same choice."""
    reference = torch.tensor([[[1.359400, 1.359394, 0.0], [1.0, 1.0001, 0.0]]])
    candidate = torch.tensor([[[1.359390, 1.359400, 0.0], [1.0001, 1.0, 0.0]]])
    drift = compare_drift("x", candidate, reference, {"top1_agreement": 0.99}, 1e-5, 1e-5)
    assert drift.top1_disagreements == 1  # 6e-6 apart is a tie; 1e-4 apart is not
    assert drift.first_divergent_position == 1


def test_a_step_without_a_distribution_never_agrees():
    reference = torch.tensor([[[2.0, 0.0], [0.0, 3.0]]])
    candidate = torch.tensor([[[2.0, 0.0], [float("nan"), 3.0]]])
    drift = compare_drift("x", candidate, reference, {"top1_agreement": 0.5}, 1e-5, 1e-5)
    assert drift.top1_disagreements == 1 and drift.non_finite == 1 and not drift.passed


# --- the llama family: keys quantized after rotation --------------------------------------

LLAMA = preset_config("llama-tiny", max_length=512)


def test_rotated_keys_are_what_gets_quantized():
    """The quantized store holds the keys attention sees: rotated at their absolute positions, per channel."""
    model = build_model(LLAMA, seed=0)
    ids = token_ids(LLAMA, 1, 64)
    with torch.inference_mode():
        _, quantized = model(ids, make_cache("quantized-int8", LLAMA, capacity=64, group_size=8, residual=0))
        _, concat = model(ids, make_cache("concat", LLAMA))
    assert quantized.quantized == 64
    step = quantized._key_scales[0, ..., 0, :].float().repeat_interleave(8, dim=-2)  # per channel, 8 tokens a group
    error = (quantized.keys(0) - concat.keys(0)).abs()
    assert (error <= 0.65 * step + 3e-3).all()  # within half a step of the rotated keys
    positions = torch.arange(64)
    unrotated = concat.keys(0) * model.cos[positions, 0] - concat.keys(0).roll(8, dims=-1) * model.sin[positions, 0]
    assert (quantized.keys(0) - unrotated).abs().max() > 100 * error.max()  # not of the keys before rotation


@pytest.mark.parametrize("kind", ["quantized-int8", "quantized-int4"])
def test_the_llama_family_drifts_within_its_own_limits_and_really_drifts(kind):
    model = build_model(LLAMA, seed=0)
    (check,) = check_equivalence(model, token_ids(LLAMA, 1, 256), [kind]).values()
    assert not check.exact and check.passed, check
    assert check.max_abs_diff > 0 and check.kl_mean > 0
    assert check.limits == make_cache(kind, LLAMA).drift_limits != make_cache(kind, SEED).drift_limits


def test_the_footprint_counts_the_positions_a_quantized_kind_held_quantized():
    """Inside R + G nothing is quantized: the record must be able to say so (the report marks it, run warns)."""
    from kvbench.workloads.workload import cache_footprint

    model = build_model(DecoderConfig(), seed=0)
    ids = token_ids(model.config, 1, 64)
    assert cache_footprint(model, ids, "quantized-int8")["quantized_positions"] == 0  # R = 128 > 64
    options = {"quantized-int4": {"group_size": 4, "residual": 3}}
    assert cache_footprint(model, ids[:, :18], "quantized-int4", options)["quantized_positions"] == 12  # 4 * (15 // 4)
    assert "quantized_positions" not in cache_footprint(model, ids, "static")
