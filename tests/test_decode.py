"""kvbench.workloads.decode: predetermined ids, the two loops, and the equivalence gate (which must fail when it
should)."""

import math
from dataclasses import replace

import pytest
import torch

import kvbench.workloads.decode as decode_module
from kvbench.cache import CACHE_KINDS, KINDS, ConcatCache, expected_cache_bytes
from kvbench.config import DTYPES
from kvbench.kinds import DRIFTED, NOT_FINITE, REFERENCE_NOT_FINITE
from kvbench.model import DecoderConfig, build_model
from kvbench.modes import FULL, MODES, spec
from kvbench.report.format import check_text
from kvbench.workloads.workload import cache_footprint
from kvbench.workloads.decode import (
    check_equivalence,
    check_modes,
    compare_drift,
    compare_logits,
    decode,
    decode_cached,
    decode_full,
    run_gate,
    token_ids,
    tolerances,
)

BROKEN_FROM = 3  # the step at which the broken caches below start to go wrong


# -- token ids ------------------------------------------------------------------------------


def test_token_ids_are_deterministic_and_in_range():
    config = DecoderConfig(max_length=64)
    a, b = token_ids(config, 2, 16, seed=5), token_ids(config, 2, 16, seed=5)
    assert a.shape == (2, 16) and a.dtype == torch.int64
    assert torch.equal(a, b)
    assert int(a.min()) >= 0 and int(a.max()) < config.vocab_size
    assert not torch.equal(a, token_ids(config, 2, 16, seed=6))
    assert not torch.equal(a[0], a[1])  # the two sequences of a batch differ


def test_token_ids_shorter_length_is_a_prefix_of_longer():
    config = DecoderConfig(max_length=64)
    longest = token_ids(config, 2, 64, seed=1)
    for length in (1, 4, 15, 16, 63):
        assert torch.equal(token_ids(config, 2, length, seed=1), longest[:, :length])


def test_token_ids_do_not_consume_the_global_rng():
    config = DecoderConfig(max_length=64)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    token_ids(config, 1, 8)
    assert torch.equal(torch.rand(3), expected)


def test_token_ids_length_beyond_max_length_is_rejected():
    config = DecoderConfig(max_length=64)
    assert token_ids(config, 1, 64).shape == (1, 64)  # exactly max_length is fine
    with pytest.raises(ValueError, match="max_length 64, got 65"):
        token_ids(config, 1, 65)


# -- the loops ------------------------------------------------------------------------------


# Small quantization groups, so that the quantized kinds really quantize within these short sequences
# (with the default residual of 128 nothing would be, and they would pass as exact without being tested).
SMALL_GROUPS = {kind: {"group_size": 4, "residual": 3} for kind in CACHE_KINDS if not spec(kind).exact}


def assert_follows_full(kind, cached, full, config):
    """An exact kind reproduces the full-prefix logits within float32's tolerance; a lossy kind stays
    within its own drift limits while differing measurably (its positions were quantized)."""
    if spec(kind).exact:
        torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-5)
        return
    drift = compare_drift(kind, cached, full, spec(kind).limits_for(config), atol=1e-5, rtol=1e-5)
    assert drift.passed, drift
    assert drift.max_abs_diff > 1e-6  # something was quantized


@pytest.mark.parametrize("kind", CACHE_KINDS)
@pytest.mark.parametrize("batch", [1, 2])
def test_cached_logits_follow_full_prefix_logits(model_for, kind, batch):
    tiny_model = model_for(kind)
    ids = token_ids(tiny_model.config, batch, 12, seed=2)
    full = decode_full(tiny_model, ids, keep_logits=True)
    cached = decode_cached(tiny_model, ids, kind, keep_logits=True, options=SMALL_GROUPS)
    assert full.shape == cached.shape == (batch, 12, tiny_model.config.vocab_size)
    assert_follows_full(kind, cached, full, tiny_model.config)
    # Step t is the prediction after ids[:, :t + 1]: the last position of a plain forward.
    with torch.inference_mode():
        logits, _ = tiny_model(ids[:, :5])
    torch.testing.assert_close(full[:, 4], logits[:, -1], atol=0, rtol=0)


@pytest.mark.parametrize("kind", CACHE_KINDS)
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_cached_logits_follow_full_prefix_logits_under_grouped_query_attention(kind, family):
    window = 4 if kind == "window" else None
    model = build_model(DecoderConfig(max_length=32, heads=4, kv_heads=2, layers=2, window=window, family=family), seed=3)
    ids = token_ids(model.config, 1, 10)
    full = decode_full(model, ids, keep_logits=True)
    assert_follows_full(kind, decode_cached(model, ids, kind, keep_logits=True, options=SMALL_GROUPS), full, model.config)


@pytest.mark.parametrize("mode", MODES)
def test_decode_returns_logits_only_when_asked(model_for, mode):
    tiny_model = model_for(mode)
    ids = token_ids(tiny_model.config, 1, 4)
    assert decode(tiny_model, ids, mode) is None
    assert decode(tiny_model, ids, mode, keep_logits=True).shape == (1, 4, tiny_model.config.vocab_size)


# -- compare_logits on hand-made tensors ----------------------------------------------------


def test_compare_logits_identical_passes():
    reference = torch.randn(2, 5, 7)
    result = compare_logits("concat", reference.clone(), reference, atol=1e-5, rtol=1e-5)
    assert result.passed is True
    assert result.first_divergent_position is None
    assert result.max_abs_diff == 0.0 and result.max_rel_diff == 0.0
    assert (result.mode, result.length, result.dtype) == ("concat", 5, "float32")


def test_compare_logits_reports_exact_first_position_and_diffs():
    reference = torch.full((2, 6, 3), 2.0)
    candidate = reference.clone()
    candidate[1, 4, 0] = 2.5  # diverges at step 4 (abs 0.5, rel 0.25)
    candidate[0, 2, 2] = 2.0 + 1e-6  # within tolerance at step 2
    result = compare_logits("static", candidate, reference, atol=1e-5, rtol=1e-5)
    assert result.passed is False
    assert result.first_divergent_position == 4
    assert result.max_abs_diff == pytest.approx(0.5)
    assert result.max_rel_diff == pytest.approx(0.25)
    # The earliest failing step wins even when a later one is worse.
    candidate[0, 5, 1] = 10.0
    candidate[0, 1, 1] = 2.01
    result = compare_logits("static", candidate, reference, atol=1e-5, rtol=1e-5)
    assert result.first_divergent_position == 1
    assert result.max_abs_diff == pytest.approx(8.0)
    assert result.max_rel_diff == pytest.approx(4.0)


def test_compare_logits_tolerance_is_atol_plus_rtol_times_reference():
    reference = torch.full((1, 2, 1), 100.0, dtype=torch.float64)
    inside = reference + 1e-3 * 0.99  # allowed: 1e-5 + 1e-5 * 100 = 1.01e-3
    assert compare_logits("m", inside, reference, atol=1e-5, rtol=1e-5).passed
    outside = reference.clone()
    outside[0, 1, 0] += 1.1e-3
    result = compare_logits("m", outside, reference, atol=1e-5, rtol=1e-5)
    assert not result.passed and result.first_divergent_position == 1


def test_compare_logits_non_finite_candidate_fails():
    reference = torch.zeros(1, 4, 3)
    candidate = reference.clone()
    candidate[0, 2, 1] = float("inf")
    result = compare_logits("paged", candidate, reference, atol=1e-5, rtol=1e-5)
    assert not result.passed and result.first_divergent_position == 2


NON_FINITE = {"nan": float("nan"), "+inf": float("inf"), "-inf": float("-inf")}


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("value", list(NON_FINITE), ids=list(NON_FINITE))
@pytest.mark.parametrize("side", ["reference", "candidate"])
def test_a_non_finite_value_on_either_side_fails_the_step_and_names_the_side(dtype, value, side):
    """NaN compares False with every bound: without an explicit check a NaN in the full-prefix
    logits would pass every mode judged against it (the gate's hole this test closes)."""
    atol, rtol = tolerances(dtype)
    reference = torch.linspace(-2, 2, 2 * 6 * 5).view(2, 6, 5).to(dtype)
    candidate = reference.clone()
    (reference if side == "reference" else candidate)[1, 3, 2] = NON_FINITE[value]
    result = compare_logits("static", candidate, reference, atol, rtol)
    assert result.passed is False
    assert result.first_divergent_position == 3
    if side == "reference":
        assert result.failure == REFERENCE_NOT_FINITE
        assert (result.reference_non_finite, result.first_reference_non_finite, result.non_finite) == (1, 3, 0)
    else:
        assert result.failure == NOT_FINITE
        assert (result.reference_non_finite, result.first_reference_non_finite, result.non_finite) == (0, None, 1)
    # The differences are over the logits finite on both sides (JSON holds no NaN): here all equal.
    assert result.max_abs_diff == 0.0 and result.tolerance_used == 0.0
    assert math.isfinite(result.reference_max_abs) and result.reference_max_abs == pytest.approx(2.0)
    assert check_text(result.to_dict()).startswith(
        "FAILED reference not finite" if side == "reference" else "FAILED 1 non-finite @ 3")


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_a_reference_that_is_not_finite_anywhere_fails_without_crashing(dtype):
    reference = torch.full((1, 3, 4), float("nan"), dtype=dtype)
    result = compare_logits("full", reference, reference, *tolerances(dtype))
    assert not result.passed and result.failure == REFERENCE_NOT_FINITE
    assert (result.reference_non_finite, result.first_reference_non_finite, result.reference_max_abs) == (12, 0, 0.0)
    # nothing is finite on both sides: no difference to report, rather than NaN in a JSON record
    assert (result.max_abs_diff, result.max_rel_diff, result.tolerance_used) == (0.0, 0.0, 0.0)


def test_the_earliest_failing_step_wins_whichever_side_fails():
    reference = torch.zeros(1, 8, 3)
    candidate = reference.clone()
    candidate[0, 2, 0] = 1.0  # the cached path diverges at step 2 ...
    reference[0, 6, 1] = float("inf")  # ... and the reference overflows at step 6
    result = compare_logits("concat", candidate, reference, atol=1e-5, rtol=1e-5)
    assert result.first_divergent_position == 2 and result.first_reference_non_finite == 6
    assert result.failure == REFERENCE_NOT_FINITE  # nothing can be judged against a broken reference
    assert result.max_abs_diff == 1.0


@pytest.mark.parametrize("side", ["reference", "candidate"])
def test_a_non_finite_value_fails_a_lossy_kinds_drift_check_too(side):
    limits = {"max_abs_diff": 1.0, "kl_mean": 1.0, "kl_max": 1.0, "top1_agreement": 0.0}  # generous: only NaN fails
    reference = torch.linspace(-1, 1, 1 * 5 * 4).view(1, 5, 4)
    candidate = reference + 1e-4
    (reference if side == "reference" else candidate)[0, 1, 3] = float("nan")
    result = compare_drift("quantized-int8", candidate, reference, limits, atol=1e-5, rtol=1e-5)
    assert result.passed is False
    assert result.failure == (REFERENCE_NOT_FINITE if side == "reference" else NOT_FINITE)
    assert all(math.isfinite(value) for value in (result.kl_mean, result.kl_max, result.top1_agreement))
    assert result.top1_agreement == pytest.approx(4 / 5)  # the step without a distribution does not agree


def test_the_gate_fails_every_mode_when_the_full_prefix_path_overflows(tiny_model):
    """What a float16 model that overflows looks like to the gate: every check fails, and says the
    reference is to blame, not the caches."""
    ids = token_ids(tiny_model.config, 1, 6)
    reference = decode_full(tiny_model, ids, keep_logits=True)
    reference[0, 4, 7] = float("inf")
    checks = run_gate(tiny_model, ids, [6], ["full", "static", "quantized-int8"], reference=reference)
    assert {mode: check["failure"] for (mode, _), check in checks.items()} == dict.fromkeys(
        ("full", "static", "quantized-int8"), REFERENCE_NOT_FINITE)
    assert all(check["first_reference_non_finite"] == 4 and not check["passed"] for check in checks.values())


def test_compare_logits_shape_mismatch_is_a_value_error():
    with pytest.raises(ValueError, match="shapes differ"):
        compare_logits("concat", torch.zeros(1, 3, 4), torch.zeros(1, 4, 4), atol=1e-5, rtol=1e-5)


# -- the gate -------------------------------------------------------------------------------


def test_check_equivalence_passes_for_every_mode(windowed_model):
    """On a model with a sliding window every mode applies: the window kind keeps the window, the
    others keep every position and attention leaves out what the window hides. (An evicting kind needs full
    attention: tests/test_scored.py checks it refuses a window.)"""
    ids = token_ids(windowed_model.config, 1, 10)
    windowable = [mode for mode in MODES if not spec(mode).evicts]
    results = check_equivalence(windowed_model, ids, windowable, options=SMALL_GROUPS)
    assert list(results) == windowable
    for mode, result in results.items():
        assert result.passed, result
        assert result.mode == mode and result.length == 10
        assert (result.atol, result.rtol, result.dtype) == (1e-5, 1e-5, "float32")
        if mode in SMALL_GROUPS:  # lossy: judged by drift, never called exact, and really quantized
            assert result.exact is False and 1e-6 < result.max_abs_diff <= result.limits["max_abs_diff"]
        else:
            assert result.exact is True and result.first_divergent_position is None
            assert result.max_abs_diff <= 1e-5
    assert results[FULL].max_abs_diff == 0.0


def test_check_equivalence_accepts_a_longer_reference(tiny_model):
    longest = token_ids(tiny_model.config, 1, 16)
    reference = decode_full(tiny_model, longest, keep_logits=True)
    results = check_equivalence(tiny_model, longest[:, :6], ["full", "static"], reference=reference)
    assert results["full"].length == 6 and results["full"].max_abs_diff == 0.0
    assert results["static"].passed


class CorruptingCache(ConcatCache):
    """Correct until step BROKEN_FROM, then perturbs every new value vector."""

    def update(self, layer, k, v):
        if self.length >= BROKEN_FROM:
            v = v + 1.0
        return super().update(layer, k, v)


class ResettingCache(ConcatCache):
    """Forgets everything after step BROKEN_FROM - 1: later tokens restart at position 0."""

    def commit(self, length):
        super().commit(length)
        if self.length == BROKEN_FROM:
            fresh = ConcatCache(self.config, self.batch, self.capacity)
            self.__dict__.update(fresh.__dict__)


@pytest.mark.parametrize("broken", [CorruptingCache, ResettingCache])
def test_check_equivalence_fails_for_a_broken_cache(tiny_model, monkeypatch, broken):
    real_make_cache = decode_module.make_cache

    def make_cache(kind, config, batch=1, capacity=None, **options):
        if kind == "concat":
            return broken(config, batch, capacity)
        return real_make_cache(kind, config, batch, capacity, **options)

    monkeypatch.setattr(decode_module, "make_cache", make_cache)
    ids = token_ids(tiny_model.config, 1, 8)
    results = check_equivalence(tiny_model, ids, ["full", "concat", "static"])
    bad = results["concat"]
    assert bad.passed is False
    assert bad.first_divergent_position == BROKEN_FROM
    assert bad.max_abs_diff > bad.atol
    assert results["static"].passed and results["full"].passed
    # Steps before the break really are equal; the step at the break really is not.
    full = decode_full(tiny_model, ids, keep_logits=True)
    broken_logits = decode_cached(tiny_model, ids, "concat", keep_logits=True)
    torch.testing.assert_close(broken_logits[:, :BROKEN_FROM], full[:, :BROKEN_FROM], atol=1e-5, rtol=1e-5)
    assert (broken_logits[:, BROKEN_FROM] - full[:, BROKEN_FROM]).abs().max() > 1e-5
    assert bad.max_abs_diff == pytest.approx(float((broken_logits - full).abs().max()), rel=1e-6)


def test_check_equivalence_respects_explicit_tolerances(tiny_model):
    ids = token_ids(tiny_model.config, 1, 8)
    result = check_equivalence(tiny_model, ids, ["concat"], atol=0.0, rtol=0.0)["concat"]
    assert (result.atol, result.rtol) == (0.0, 0.0)
    assert result.passed == (result.max_abs_diff == 0.0)


# -- mode validation ------------------------------------------------------------------------


def test_check_modes_accepts_known_distinct_modes():
    assert check_modes(("static", "full")) == ["static", "full"]
    assert check_modes(list(MODES)) == list(MODES)


@pytest.mark.parametrize(
    "modes, message",
    [
        (["full", "bogus"], "unknown mode 'bogus'"),
        (["full", "concat", "full"], "distinct"),
        ([], "at least one mode"),
    ],
)
def test_check_modes_errors(modes, message):
    with pytest.raises(ValueError, match=message):
        check_modes(modes)


# -- cache footprint ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [mode for mode in MODES if not spec(mode).evicts])  # scored: tests/test_scored.py
@pytest.mark.parametrize("batch, length", [(1, 5), (2, 9)])
def test_cache_footprint_measured_equals_expected(model_for, mode, batch, length):
    tiny_model = model_for(mode)
    ids = token_ids(tiny_model.config, batch, length)
    footprint = cache_footprint(tiny_model, ids, mode)
    config = tiny_model.config
    # the window kind keeps the last W positions of a sliding layer, every position of the others
    held = [min(length, window or length) if mode == "window" else length for window in config.layer_windows]
    # 2 (k, v) * B * KVH kv heads * positions held in each layer * D head dim * 4 bytes
    expected = 2 * batch * config.kv_heads * sum(held) * config.head_dim * 4
    if mode != "window":
        assert expected == expected_cache_bytes(config, batch, length)
    assert footprint["expected_bytes"] == expected
    assert footprint["measured_bytes"] == expected
    assert footprint["reserved_bytes"] >= footprint["measured_bytes"]


# -- the gate pinned by value ------------------------------------------------------------------------


def test_a_difference_of_exactly_the_tolerance_passes_and_tolerance_used_is_its_share():
    # bound = atol + rtol * |reference| = 0.5 + 0.25 * [2, 4] = [1, 1.5], exact in binary
    reference = torch.tensor([[[2.0, -4.0], [2.0, -4.0]]], dtype=torch.float64)
    candidate = reference + torch.tensor([[[1.0, 0.75], [-1.0, 0.0]]], dtype=torch.float64)
    result = compare_logits("static", candidate, reference, atol=0.5, rtol=0.25)
    assert result.passed and result.failure is None and result.first_divergent_position is None
    assert (result.tolerance_used, result.max_abs_diff, result.max_rel_diff) == (1.0, 1.0, 0.5)
    assert (result.reference_max_abs, result.atol, result.rtol, result.dtype) == (4.0, 0.5, 0.25, "float64")
    candidate[0, 1, 1] -= 1.5 + 2 ** -20  # step 1 just beyond its bound
    beyond = compare_logits("static", candidate, reference, atol=0.5, rtol=0.25)
    assert not beyond.passed and beyond.failure == "diverged" and beyond.first_divergent_position == 1
    assert beyond.tolerance_used == pytest.approx((1.5 + 2 ** -20) / 1.5)
    assert beyond.to_dict()["tolerance_used"] == beyond.tolerance_used


def test_tolerances_are_the_dtypes_and_float32s_for_any_other():
    assert tolerances(torch.float16) == (2e-3, 2e-3)
    assert tolerances(torch.float64) == (1e-10, 1e-10)
    assert tolerances(torch.int8) == tolerances(torch.float32) == (1e-5, 1e-5)


def test_first_step_is_the_earliest_step_bad_in_any_sequence_and_logit():
    bad = torch.zeros(2, 5, 3, dtype=torch.bool)
    assert decode_module.first_step(bad) is None
    bad[0, 3, 1] = bad[1, 2, 2] = True
    assert decode_module.first_step(bad) == 2
    bad[1, 0, 0] = True
    assert decode_module.first_step(bad) == 0


def test_top1_agrees_within_the_tolerance_of_the_best_logit_inclusive():
    reference = torch.tensor([[[4.0, 3.0, 1.0], [4.0, 3.0, 1.0]]], dtype=torch.float64)
    candidate = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]], dtype=torch.float64)  # picks 3.0, then 1.0
    # step 0 is 1.0 below the best, exactly atol + rtol * 4 = 0.5 + 0.125 * 4: agreement; step 1 is 3.0 below
    assert decode_module.top1_agrees(candidate, reference, 0.5, 0.125).tolist() == [[True, False]]
    assert decode_module.top1_agrees(candidate, reference, 0.5, 0.1).tolist() == [[False, False]]


def test_judge_logits_applies_each_kinds_rule(tiny_model):
    reference = torch.randn(1, 3, 5, generator=torch.Generator().manual_seed(0))
    config = tiny_model.config
    assert type(decode_module.judge_logits("static", reference, reference, 1e-5, 1e-5, config)).__name__ == "Equivalence"
    for lossy in ("quantized-int8", "hf-quantized-int8"):
        drift = decode_module.judge_logits(lossy, reference, reference, 1e-5, 1e-5, config)
        assert type(drift).__name__ == "Drift" and drift.passed and drift.exact is False
        assert drift.limits == spec("quantized-int8").limits_for(config)
    assert decode_module.judge_logits("hf-dynamic", reference, reference, 1e-5, 1e-5, config).exact is True


def test_token_ids_are_the_pinned_workload():
    """Every record's workload: the same ids in every version, or records stop being comparable."""
    assert token_ids(DecoderConfig(max_length=64), 2, 6, seed=0).tolist() == [[44, 47, 117, 64, 67, 123],
                                                                               [55, 28, 34, 0, 0, 36]]


def test_a_mode_that_raises_is_a_failed_check_that_cannot_be_timed(tiny_model, monkeypatch):
    class ExplodingCache(ConcatCache):
        def update(self, layer, k, v):
            raise RuntimeError("boom\nsecond line")

    monkeypatch.setitem(KINDS, "concat", ExplodingCache)
    ids = token_ids(tiny_model.config, 1, 4)
    checks = run_gate(tiny_model, ids, [2, 4], ["concat", "static"])
    assert set(checks) == {(mode, length) for mode in ("concat", "static") for length in (2, 4)}
    atol, rtol = tolerances(tiny_model.config.dtype)
    assert checks[("concat", 4)] == {"mode": "concat", "length": 4, "passed": False, "max_abs_diff": None,
                                     "max_rel_diff": None, "first_divergent_position": None, "non_finite": 0,
                                     "atol": atol, "rtol": rtol, "dtype": "float32", "error": "RuntimeError: boom"}
    assert checks[("static", 2)]["passed"] and checks[("static", 2)]["length"] == 2
    assert not decode_module.timeable(checks[("concat", 2)]) and decode_module.timeable(checks[("static", 2)])
    assert not decode_module.timeable(None)



@pytest.mark.parametrize("signal", [KeyboardInterrupt, MemoryError])
def test_an_interrupt_or_exhausted_memory_in_the_gate_is_not_a_failed_check(tiny_model, monkeypatch, signal):
    """Ctrl-C and a MemoryError stop the run (it saves what it has): they say nothing about the kind."""
    class InterruptedCache(ConcatCache):
        def update(self, layer, k, v):
            raise signal()

    monkeypatch.setitem(KINDS, "concat", InterruptedCache)
    with pytest.raises(signal):
        run_gate(tiny_model, token_ids(tiny_model.config, 1, 4), [4], ["static", "concat"])


def test_a_lossy_kind_with_no_finite_step_has_no_kl_to_report():
    reference = torch.zeros(1, 3, 4)
    candidate = torch.full((1, 3, 4), float("nan"))
    drift = compare_drift("quantized-int8", candidate, reference, {"max_abs_diff": 1.0}, 1e-5, 1e-5)
    assert (drift.passed, drift.failure, drift.non_finite) == (False, NOT_FINITE, 12)
    assert (drift.kl_mean, drift.kl_max) == (0.0, 0.0)

def test_a_failed_checks_error_keeps_its_first_300_characters(tiny_model, monkeypatch):
    class VerboseCache(ConcatCache):
        def update(self, layer, k, v):
            raise RuntimeError("x" * 400)

    monkeypatch.setitem(KINDS, "concat", VerboseCache)
    checks = run_gate(tiny_model, token_ids(tiny_model.config, 1, 4), [4], ["concat"])
    assert checks[("concat", 4)]["error"] == "RuntimeError: " + "x" * (300 - len("RuntimeError: "))

def test_equivalence_and_drift_are_frozen_and_say_whether_they_are_exact():
    reference = torch.zeros(1, 2, 3)
    exact = compare_logits("static", reference, reference, 1e-5, 1e-5)
    drift = compare_drift("quantized-int8", reference, reference, {"max_abs_diff": 0.0}, 1e-5, 1e-5)
    assert (exact.exact, drift.exact) == (True, False)
    assert (drift.top1_disagreements, drift.reference_non_finite, drift.first_reference_non_finite) == (0, 0, None)
    with pytest.raises(AttributeError):
        exact.passed = False
    with pytest.raises(AttributeError):
        drift.passed = False


def test_a_finite_lossy_kind_beyond_its_limits_has_drifted():
    reference = torch.linspace(-1, 1, 1 * 5 * 4).view(1, 5, 4)
    candidate = reference + 1e-3  # finite, beyond the exact tolerance, and beyond a max_abs_diff limit of 1e-4
    result = compare_drift("quantized-int8", candidate, reference, {"max_abs_diff": 1e-4}, atol=1e-5, rtol=1e-5)
    assert (result.passed, result.failure) == (False, DRIFTED)
    assert result.max_abs_diff == pytest.approx(1e-3, rel=1e-3) and result.first_divergent_position is None  # top-1 agrees
    within = compare_drift("quantized-int8", candidate, reference, {"max_abs_diff": 1e-2}, atol=1e-5, rtol=1e-5)
    assert (within.passed, within.failure) == (True, None)


def test_a_lossy_kinds_first_divergent_position_is_its_earliest_top1_disagreement_in_any_sequence():
    reference = torch.tensor([0.0, 1.0, 3.0]).repeat(2, 6, 1)  # token 2 is the top-1 at every step
    candidate = reference.clone()
    candidate[0, 4] = torch.tensor([5.0, 1.0, 3.0])  # sequence 0 picks token 0 at step 4
    candidate[1, 2] = candidate[1, 5] = torch.tensor([5.0, 1.0, 3.0])  # sequence 1 at steps 2 and 5
    result = compare_drift("quantized-int8", candidate, reference, {"top1_agreement": 0.0}, atol=1e-5, rtol=1e-5)
    assert (result.first_divergent_position, result.top1_disagreements) == (2, 3)
    assert result.top1_agreement == pytest.approx(9 / 12)


def test_a_transformers_mode_feeds_one_token_a_step_like_the_cached_kinds():
    from kvbench.model import preset_config

    tiny_model = build_model(preset_config("llama-tiny", vocab_size=128, max_length=64), seed=0)  # llama: hf's twin
    ids = token_ids(tiny_model.config, 2, 6)
    with torch.inference_mode():
        logits = decode(tiny_model, ids, "hf-dynamic", keep_logits=True)
        reference = decode_full(tiny_model, ids, keep_logits=True)
    assert logits.shape == reference.shape == (2, 6, tiny_model.config.vocab_size)
    torch.testing.assert_close(logits, reference, atol=1e-5, rtol=1e-5)


def test_the_loops_keep_no_logits_unless_asked(tiny_model):
    ids = token_ids(tiny_model.config, 1, 3)
    with torch.inference_mode():
        assert decode_full(tiny_model, ids) is None and decode_cached(tiny_model, ids, "static") is None
        assert decode_cached(tiny_model, ids, "static", keep_logits=True).shape == (1, 3, tiny_model.config.vocab_size)


def test_a_footprint_expects_the_kinds_formula_and_for_transformers_what_was_measured():
    config = DecoderConfig(max_length=64)
    from kvbench.modes import expected_bytes

    assert expected_bytes("static", config, 2, 8, measured=1) == expected_cache_bytes(config, 2, 8)
    assert expected_bytes(FULL, config, 1, 8, measured=1) == expected_cache_bytes(config, 1, 8)
    assert expected_bytes("hf-dynamic", config, 2, 8, measured=12345) == 12345


def test_the_stepper_continues_forks_of_a_shared_paged_prefix_and_leaves_them_to_their_owner(tiny_model):
    """A serving scheduler's shape: one prompt prefix prefilled once into a pool, then forked per request; each
    fork is stepped by the one stepper from where it stands and stays the caller's (not released)."""
    from kvbench.cache import BlockPool, PagedCache
    from kvbench.workloads.decode import steps

    config, shared = tiny_model.config, 10
    first, second = token_ids(config, 1, 24, seed=1), token_ids(config, 1, 24, seed=2)
    second[:, :shared] = first[:, :shared]  # the same prefix, different continuations
    pool = BlockPool(config, num_blocks=32, block_size=4)
    prefix = PagedCache(config, 1, capacity=24, pool=pool)
    with torch.inference_mode():
        tiny_model(first[:, :shared], prefix)
        for ids in (first, second):
            fork = prefix.fork()
            free_before = pool.free_blocks
            logits = torch.stack([out for out, _ in steps(tiny_model, ids, "paged", prompt=14, cache=fork)], dim=1)
            full = decode_full(tiny_model, ids, keep_logits=True)[:, 13:]
            torch.testing.assert_close(logits, full, atol=1e-5, rtol=1e-5)
            assert fork.length == 24 and not getattr(fork, "released", False) and pool.free_blocks < free_before
            fork.release()
            assert pool.free_blocks == free_before
    assert prefix.length == shared  # the forks appended to copies of the shared, partly filled block


@pytest.mark.parametrize("mode", ["full", "static"])
def test_the_stepper_by_default_starts_from_one_token_and_yields_a_step_per_later_one(tiny_model, mode):
    from kvbench.workloads.decode import steps

    ids = token_ids(tiny_model.config, 1, 6)
    logits = torch.stack([out for out, _ in steps(tiny_model, ids, mode)], dim=1)
    torch.testing.assert_close(logits, decode_full(tiny_model, ids, keep_logits=True), atol=1e-5, rtol=1e-5)

def test_the_stepper_refuses_a_cache_it_cannot_continue(tiny_model):
    from kvbench.workloads.decode import steps

    ids = token_ids(tiny_model.config, 1, 12)
    held = ConcatCache(tiny_model.config, 1, capacity=12)
    with pytest.raises(ValueError, match="mode 'static' steps a StaticCache, got ConcatCache"):
        next(steps(tiny_model, ids, "static", prompt=4, cache=held))
    with torch.inference_mode():
        tiny_model(ids[:, :4], held)
    with pytest.raises(ValueError, match="the cache holds 4 positions: expected fewer than the prompt's 4"):
        next(steps(tiny_model, ids, "concat", prompt=4, cache=held))
    with pytest.raises(ValueError, match="full keeps no cache between steps: expected cache=None, got ConcatCache"):
        next(steps(tiny_model, ids, FULL, prompt=4, cache=held))
    with pytest.raises(ValueError, match=r"prompt must be in \[1, 12\] tokens of the 12 ids, got 0"):
        steps(tiny_model, ids, "concat", prompt=0)


def test_bfloat16_tolerance_covers_twice_each_paths_own_rounding_and_still_catches_a_shifted_step():
    """bf16's bound comes from bf16's own error: each path against float64 on the very same weights. The
    cached and the full-prefix paths round differently (one-row steps, c-row prefixes) and each may err
    either way, so the bound must cover twice the larger error; it must still fail a step read one position
    off, the kind of bug the gate is for."""
    config = DecoderConfig.from_preset("llama-mini", dtype=torch.bfloat16, max_length=64)
    model = build_model(config, seed=0)
    truth_model = build_model(DecoderConfig.from_preset("llama-mini", dtype=torch.float64, max_length=64), seed=0)
    truth_model.load_state_dict({name: tensor.double() for name, tensor in model.state_dict().items()})
    ids = token_ids(config, 1, 48)
    atol, rtol = tolerances(config.dtype, config.layers)
    assert (atol, rtol) == pytest.approx((0.06, 0.06))  # 0.03 x sqrt(4 layers)
    truth = decode_full(truth_model, ids, keep_logits=True)
    full, static = decode_full(model, ids, keep_logits=True), decode_cached(model, ids, "static", keep_logits=True)
    for path in (full, static):
        error = (path.double() - truth).abs()
        assert float(error.max()) > 0.005  # bf16 really rounds: the bound is not for exact arithmetic
        assert bool((2 * error <= atol + rtol * truth.abs()).all())
    assert check_equivalence(model, ids, ["static"], reference=full)["static"].passed
    shifted = compare_logits("static", static[:, 1:], full[:, :-1], atol, rtol)
    assert not shifted.passed and shifted.first_divergent_position == 0


def test_a_kind_that_compresses_its_prompt_is_judged_after_it_and_told_in_the_loops_length(tiny_model):
    """knorm is gated from the first half of the ids on (its prompt, then compressed): the steps judged are the
    last T - prompt + 1, and the check is told as the loop's, over all T positions."""
    ids = token_ids(tiny_model.config, 1, 16, seed=0)
    result = check_equivalence(tiny_model, ids, ["knorm"])["knorm"]
    assert decode_module.gate_prompt("knorm", 16) == 8 and decode_module.gate_prompt("static", 16) == 1
    assert result.length == 16 and result.passed and result.first_divergent_position is None


def test_an_evicting_kind_is_judged_against_the_full_path_masked_to_the_positions_it_kept(tiny_model):
    """evicting_logits: a batch of two, the prompt compressed by half, every step after it against the same rows of
    the full path masked to what the cache kept."""
    ids = token_ids(tiny_model.config, 2, 12, seed=1)
    for prompt in (1, 6):
        kept, reference = decode_module.evicting_logits(tiny_model, ids, "knorm", prompt,
                                                        {"knorm": {"evict_ratio": 0.5}})
        assert kept.shape == reference.shape == (2, 12 - prompt + 1, tiny_model.config.vocab_size)
        torch.testing.assert_close(kept, reference, atol=1e-5, rtol=1e-4)


def test_a_cache_the_loop_made_is_released_when_the_loop_ends(tiny_model, monkeypatch):
    made, make = [], decode_module.make_cache

    def making(*args, **kwargs):
        made.append(make(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(decode_module, "make_cache", making)
    decode_cached(tiny_model, token_ids(tiny_model.config, 1, 40, seed=0), "paged")
    (cache,) = made
    assert cache.pool.free_blocks == cache.pool.num_blocks  # every block given back


def test_a_model_is_trained_when_it_carries_its_gate_tolerance(tiny_model):
    assert not decode_module.is_trained(tiny_model)
    trained = build_model(tiny_model.config, seed=0)
    trained.gate_tolerance = (1e-3, 1e-3)
    assert decode_module.is_trained(trained)


def test_a_check_judged_from_the_prompt_on_is_told_at_the_loops_positions(tiny_model):
    ids = token_ids(tiny_model.config, 1, 16, seed=0)
    result = check_equivalence(tiny_model, ids, ["static"])["static"]
    moved = decode_module.from_prompt(replace(result, length=9, first_divergent_position=2,
                                              first_reference_non_finite=3), prompt=8, length=16)
    assert (moved.length, moved.first_divergent_position, moved.first_reference_non_finite) == (16, 9, 10)
