"""kvbench.stats against cases whose answers are known."""

import math

import numpy as np
import pytest
from records import noisy

from kvbench import stats

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


# --- comparing two records: the unpaired ratio ------------------------------------------------

def test_identical_samples_compare_as_ratio_one_with_a_tight_interval():
    old = noisy(1e-3, 9)
    estimate = stats.unpaired_ratio(old, list(old))
    assert estimate.ratio == 1.0 and estimate.contains(1.0) and estimate.high - estimate.low < 0.03


def test_a_2x_slowdown_is_inside_its_unpaired_interval():
    estimate = stats.unpaired_ratio(noisy(1e-3, 9, seed=1), noisy(2e-3, 9, seed=2))
    assert estimate.contains(2.0) and estimate.low > 1.9


# --- the speedup estimators ------------------------------------------------------------------------

def test_the_median_interval_uses_the_order_statistics_of_the_binomial():
    assert stats.median_interval(list(range(1, 11))) == (2.0, 9.0)  # n = 10: x(2), x(9), coverage 97.9 %
    assert stats.median_interval(list(range(1, 32))) == (10.0, 22.0)  # n = 31: x(10), x(22), coverage 97.1 %
    assert stats.median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few for 95 %: the range


def test_the_median_interval_covers_the_median_as_promised():
    rng = np.random.default_rng(7)
    covered = sum(lo <= 0.0 <= hi for lo, hi in (stats.median_interval(rng.normal(size=15)) for _ in range(2000)))
    assert 0.95 <= covered / 2000 <= 0.995  # exact coverage 96.5 % for n = 15


@pytest.mark.parametrize("estimator", list(stats.ESTIMATORS))
def test_every_estimator_recovers_a_known_speedup_inside_its_interval(estimator):
    base = dict(enumerate(noisy(3e-3, 31, seed=1)))
    mine = dict(enumerate(noisy(1e-3, 31, seed=2)))
    estimate = stats.paired_ratio(base, mine, estimator, key=("x",))
    assert estimate.contains(3.0) and estimate.estimator == estimator and estimate.pairs == 31
    assert 0 < estimate.half_width < 0.05


def test_median_of_ratios_keeps_pairs_together():
    """Drift that slows both sides of a rotation alike cancels in each per-rotation ratio."""
    drift = [1.0 + 0.5 * (r % 5) for r in range(21)]
    base = {r: 2e-3 * d for r, d in enumerate(drift)}
    mine = {r: 1e-3 * d for r, d in enumerate(drift)}
    estimate = stats.paired_ratio(base, mine, "median-of-ratios")
    assert (estimate.ratio, estimate.low, estimate.high) == (2.0, 2.0, 2.0)


def test_the_rerun_interval_is_sqrt_2_wider_in_log_scale():
    estimate = stats.RatioEstimate(2.0, 1.8, 2.2, 31, "median-of-ratios", "order statistics")
    rerun = stats.rerun_interval(estimate)
    assert math.log(2.0 / rerun.low) == pytest.approx(math.sqrt(2) * math.log(2.0 / 1.8))
    assert math.log(rerun.high / 2.0) == pytest.approx(math.sqrt(2) * math.log(2.2 / 2.0))
    assert rerun.interval.startswith("rerun")


def test_speedup_is_the_default_estimator_with_the_default_interval():
    base, mine = dict(enumerate(noisy(3e-3, 15, seed=3))), dict(enumerate(noisy(1e-3, 15, seed=4)))
    default = stats.speedup(base, mine)
    assert default.estimator == stats.DEFAULT_ESTIMATOR
    confidence = stats.speedup(base, mine, interval="confidence")
    assert confidence.half_width < default.half_width
    with pytest.raises(ValueError, match="estimator must be one of"):
        stats.paired_ratio(base, mine, "mean")


def test_a_trend_over_the_run_is_found_and_a_flat_cell_is_not():
    started = [float(i) for i in range(30)]
    rising = [1.0 + 0.01 * i for i in range(30)]
    flat = noisy(1.0, 30, spread=0.01, seed=5)
    assert stats.trend(started, rising).drifting and stats.trend(started, rising).change > 0.25
    assert not stats.trend(started, flat).drifting
    assert stats.trend(started[:5], rising[:5]) is None


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
