"""kvbench.stats against cases whose answers are known."""

import math

import numpy as np
import pytest
from records import noisy

from kvbench import stats
from kvbench.report.compare import FACTOR

# --- paired speedup (within one record) ---------------------------------------------------

def test_identical_paired_samples_give_ratio_one_with_a_zero_width_interval():
    samples = dict(enumerate(noisy(0.01, 7, spread=0.05)))
    estimate = stats.paired_speedup(samples, samples)
    assert estimate.ratio == 1.0
    assert (estimate.low, estimate.high) == (1.0, 1.0)
    assert estimate.pairs == 7


def test_paired_bootstrap_keeps_each_repetition_pair_together():
    # A drift that slows whole repetitions (1x .. 7x) moves both sides of every pair:
    # resampling repetition indices sees an exact 2x in every resample.
    cached = {r: 0.01 * (r + 1) for r in range(7)}
    full = {r: 2 * s for r, s in cached.items()}
    paired = stats.paired_speedup(full, cached)
    assert paired.ratio == pytest.approx(2.0)
    assert paired.low == pytest.approx(2.0) and paired.high == pytest.approx(2.0)
    # Ignoring the pairing, the same numbers give a wide interval.
    unpaired = stats.unpaired_ratio(list(cached.values()), list(full.values()))
    assert unpaired.high - unpaired.low > 1.0


def test_paired_speedup_uses_only_repetitions_both_modes_completed():
    full = {0: 2.0, 1: 2.0, 2: 2.0}
    cached = {0: 1.0, 1: 1.0}  # an interrupted run stopped before repetition 2 of this mode
    estimate = stats.paired_speedup(full, cached)
    assert estimate.pairs == 2 and estimate.ratio == 2.0
    assert stats.paired_speedup(full, {}) is None


def test_bootstrap_is_seeded_and_independent_of_call_order():
    full = dict(enumerate(noisy(0.02, 7, spread=0.2, seed=1)))
    cached = dict(enumerate(noisy(0.01, 7, spread=0.2, seed=2)))
    first = stats.paired_speedup(full, cached, key=("concat", 64))
    stats.paired_speedup(full, cached, key=("static", 64))  # another cell in between
    again = stats.paired_speedup(full, cached, key=("concat", 64))
    assert first == again
    assert first.low < first.ratio < first.high


def test_interval_contains_the_true_ratio_for_a_known_speedup():
    full = dict(enumerate(noisy(0.030, 9, spread=0.02, seed=3)))
    cached = dict(enumerate(noisy(0.010, 9, spread=0.02, seed=4)))
    estimate = stats.paired_speedup(full, cached)
    assert estimate.contains(3.0)
    assert 2.8 < estimate.low and estimate.high < 3.2


# --- comparing two records: unpaired ratio, Mann-Whitney U, verdict --------------------------

def test_identical_samples_compare_as_ratio_one_with_a_tight_interval_and_unchanged():
    old = noisy(0.01, 7, spread=0.01)
    estimate = stats.unpaired_ratio(old, list(old))
    assert estimate.ratio == 1.0
    assert estimate.contains(1.0)
    assert estimate.high - estimate.low < 0.04  # +-1 % noise gives an interval of a few percent
    p_value = stats.mann_whitney_p(old, list(old))
    assert p_value == pytest.approx(1.0)
    assert stats.verdict(estimate.ratio, p_value, FACTOR, 0.05) == stats.UNCHANGED




def test_a_2x_slowdown_is_slower_and_significant():
    old = noisy(0.01, 7, spread=0.03, seed=5)
    new = noisy(0.02, 7, spread=0.03, seed=6)
    estimate = stats.unpaired_ratio(old, new)
    p_value = stats.mann_whitney_p(old, new)
    assert estimate.ratio == pytest.approx(2.0, rel=0.05)
    assert estimate.low > 1.8 and estimate.contains(2.0)
    assert p_value < 0.001  # exact test, complete separation of 7 vs 7: 2 / C(14, 7)
    assert stats.verdict(estimate.ratio, p_value, 1.1, 0.05) == stats.SLOWER


def test_a_2x_speedup_is_faster():
    old = noisy(0.02, 7, spread=0.03, seed=7)
    new = noisy(0.01, 7, spread=0.03, seed=8)
    estimate = stats.unpaired_ratio(old, new)
    assert stats.verdict(estimate.ratio, stats.mann_whitney_p(old, new), 1.1, 0.05) == stats.FASTER


def test_a_noise_level_change_is_unchanged():
    old = noisy(0.01, 7, spread=0.03, seed=9)
    new = noisy(0.0101, 7, spread=0.03, seed=10)  # +1 % under +-3 % noise
    estimate = stats.unpaired_ratio(old, new)
    p_value = stats.mann_whitney_p(old, new)
    assert estimate.contains(1.0)
    assert p_value > 0.05
    assert stats.verdict(estimate.ratio, p_value, 1.1, 0.05) == stats.UNCHANGED


def test_a_significant_change_below_the_factor_is_unchanged():
    old = noisy(0.01, 7, spread=0.001, seed=11)
    new = [s * 1.03 for s in old]  # a clean 3 % shift: significant, but below 1.1x
    p_value = stats.mann_whitney_p(old, new)
    assert p_value < 0.05
    assert stats.verdict(1.03, p_value, 1.1, 0.05) == stats.UNCHANGED


def test_three_repetitions_can_never_be_significant():
    old, new = [1.0, 1.01, 1.02], [3.0, 3.01, 3.02]  # 3x slower, complete separation
    p_value = stats.mann_whitney_p(old, new)
    assert p_value == pytest.approx(0.1)  # the floor 2 / C(6, 3)
    assert stats.verdict(3.0, p_value, 1.1, 0.05) == stats.UNCHANGED


def test_too_few_samples_are_untested():
    assert stats.mann_whitney_p([1.0], [2.0, 3.0]) is None
    assert stats.verdict(2.0, None, 1.1, 0.05) == stats.UNTESTED
    with pytest.raises(ValueError, match="need samples on both sides"):
        stats.unpaired_ratio([], [1.0])


def test_all_equal_samples_have_p_one():
    assert stats.mann_whitney_p([1.0] * 5, [1.0] * 5) == 1.0


@pytest.mark.parametrize("ratio, p_value, expected", [
    (1.5, 0.01, stats.SLOWER), (1.5, 0.2, stats.UNCHANGED), (1.05, 0.001, stats.UNCHANGED),
    (0.5, 0.01, stats.FASTER), (1 / 1.1 - 1e-9, 0.01, stats.FASTER), (1.1, 0.01, stats.UNCHANGED),
    (0.5, 0.05, stats.UNCHANGED),  # p must be below alpha
])
def test_verdict_needs_both_factor_and_significance(ratio, p_value, expected):
    assert stats.verdict(ratio, p_value, 1.1, 0.05) == expected


# --- scaling fit ----------------------------------------------------------------------------

def test_fit_recovers_a_quadratic_exactly():
    lengths = [16, 32, 64, 128, 256]
    fit = stats.fit_power_law(lengths, [3e-7 * n ** 2 for n in lengths])
    assert fit.b == pytest.approx(2.0)
    assert fit.a == pytest.approx(3e-7)
    assert fit.b_stderr == pytest.approx(0.0, abs=1e-9)
    assert fit.r_squared == pytest.approx(1.0)
    assert fit.tail_b == pytest.approx(2.0)
    assert fit.predict(512) == pytest.approx(3e-7 * 512 ** 2)


def test_fit_recovers_b_within_its_interval_under_noise():
    rng = np.random.default_rng(12)
    lengths = [16, 32, 64, 128, 256, 512]
    seconds = [2e-6 * n ** 2 * math.exp(rng.normal(0, 0.05)) for n in lengths]
    fit = stats.fit_power_law(lengths, seconds)
    assert fit.b_low < 2.0 < fit.b_high
    assert fit.b == pytest.approx(2.0, abs=0.1)
    assert 0 < fit.b_stderr < 0.1


def test_fit_with_two_lengths_has_no_uncertainty_and_one_length_no_fit():
    fit = stats.fit_power_law([10, 20], [1.0, 2.0])
    assert fit.b == pytest.approx(1.0) and fit.b_stderr is None and fit.b_low is None
    assert stats.fit_power_law([10], [1.0]) is None


def test_fixed_overhead_flattens_b_but_not_the_tail_slope():
    lengths = [16, 32, 64, 128, 256, 512]
    fit = stats.fit_power_law(lengths, [1e-3 + 1e-7 * n ** 2 for n in lengths])
    assert fit.b < 1.5  # overhead dominates the short lengths
    assert fit.tail_b > 1.7  # the two longest lengths are nearly pure T^2


# --- per-step profile -------------------------------------------------------------------------

def test_running_median_removes_isolated_spikes_even_at_the_ends():
    values = [1.0] * 20
    values[0] = values[10] = values[19] = 100.0
    assert stats.running_median(values, 5) == [1.0] * 20
    assert stats.running_median([3.0, 1.0], 9) == [2.0, 2.0]  # window wider than the profile


def test_crossover_is_the_first_step_from_which_caching_stays_cheaper():
    full = [100.0 + 10 * t for t in range(40)]  # the full prefix grows with the step
    cached = [150.0] * 40  # the cached step is flat but carries more fixed cost
    assert stats.crossover_step(full, cached) == 6  # 100 + 10 t > 150 from t = 6
    spiky = list(cached)
    spiky[20] = 10_000.0  # one slow step later on does not move the crossover
    assert stats.crossover_step(full, spiky) == 6


def test_crossover_is_none_when_caching_never_pays_and_zero_when_always():
    assert stats.crossover_step([1.0] * 30, [2.0] * 30) is None
    assert stats.crossover_step([2.0] * 30, [1.0] * 30) == 0
    with pytest.raises(ValueError, match="full has 3 steps, cached 2"):
        stats.crossover_step([1.0] * 3, [1.0] * 2)


def test_spread():
    assert stats.spread(0.9, 1.1, 1.0) == pytest.approx(0.2)
