"""kvbench.measure.stats against cases whose answers are known."""

import math

import numpy as np
import pytest
from records import noisy

from kvbench.measure import stats

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


def test_three_lengths_are_the_fewest_with_an_interval_on_b():
    fit = stats.fit_power_law([10, 20, 40], [1.0, 2.1, 3.9])
    assert fit.b_stderr > 0 and fit.b_low < fit.b < fit.b_high and 0 < fit.r_squared < 1 and fit.points == 3


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


def test_the_running_window_starts_at_the_first_step_and_ends_at_the_last():
    assert stats.running_median([1.0, 2.0, 9.0, 10.0, 11.0], 3) == [2.0, 2.0, 9.0, 10.0, 10.0]


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


def test_spread_divides_by_the_median_and_is_infinite_without_one():
    assert stats.spread(1.0, 3.0, 4.0) == 0.5  # any median but 1 tells division from multiplication
    assert stats.spread(0.2, 0.3, 0.0) == math.inf
    assert stats.spread(0.2, 0.3, -1.0) == math.inf


# --- values pinned by hand (each would survive a flipped operator otherwise) -------------------

def test_unpaired_ratio_refuses_one_empty_side():
    for old, new in (([], [1.0]), ([1.0], []), ([], [])):
        with pytest.raises(ValueError, match=f"got {len(old)} old and {len(new)} new"):
            stats.unpaired_ratio(old, new)


def test_unpaired_ratio_is_new_over_old_with_the_smaller_sample_as_pairs():
    estimate = stats.unpaired_ratio([2.0, 2.0, 2.0, 2.0, 2.0], [1.0, 1.0, 1.0])
    assert (estimate.ratio, estimate.low, estimate.high, estimate.pairs) == (0.5, 0.5, 0.5, 3)


def test_r_squared_of_an_imperfect_fit_is_the_squared_correlation_of_the_logs():
    lengths = [16, 32, 64, 128]
    seconds = [1.0, 3.0, 2.0, 9.0]
    fit = stats.fit_power_law(lengths, seconds)
    x, y = np.log(lengths), np.log(seconds)
    assert fit.r_squared == pytest.approx(np.corrcoef(x, y)[0, 1] ** 2)
    assert 0.5 < fit.r_squared < 0.9
    slope, intercept = np.polyfit(x, y, 1)
    assert (fit.b, fit.a) == (pytest.approx(slope), pytest.approx(math.exp(intercept)))
    residual = y - (intercept + slope * x)
    stderr = math.sqrt(residual @ residual / 2 / ((x - x.mean()) @ (x - x.mean())))
    assert fit.b_stderr == pytest.approx(stderr)
    half = 4.302652729911275 * stderr  # t(0.975, 2 degrees of freedom)
    assert (fit.b_low, fit.b_high) == (pytest.approx(slope - half), pytest.approx(slope + half))
    assert fit.tail_b == pytest.approx(math.log(9.0 / 2.0) / math.log(2.0))
    assert fit.points == 4


def test_the_between_run_widening_of_a_speedup_by_value():
    base = {r: 2.0 + 0.01 * r for r in range(9)}
    mine = {r: 1.0 for r in range(9)}
    within = stats.speedup(base, mine, interval="within")
    assert within == stats.paired_ratio(base, mine)
    confidence = stats.speedup(base, mine, interval="confidence", between_run=0.02)
    extra = 1.959963984540054 * 0.02
    assert confidence.ratio == within.ratio == 2.04
    assert confidence.low == pytest.approx(2.04 * math.exp(-math.hypot(math.log(2.04 / within.low), extra)))
    assert confidence.high == pytest.approx(2.04 * math.exp(math.hypot(math.log(within.high / 2.04), extra)))
    assert confidence.interval == "order statistics + between runs 2.0%"
    rerun = stats.speedup(base, mine, between_run=0.02)
    assert rerun == stats.rerun_interval(confidence)
    default = stats.speedup(base, mine, interval="confidence")  # BETWEEN_RUN["speedup"], 1%
    assert default == stats.with_between_run(within, 0.01)
    assert stats.speedup(base, mine, interval="confidence", between_run=0.0) == within
    assert stats.speedup(base, {}, interval="confidence") is None
    with pytest.raises(ValueError, match="interval must be one of"):
        stats.speedup(base, mine, interval="wide")


def test_the_rerun_floor_and_the_standard_error_an_interval_implies():
    z = 1.959963984540054
    assert stats.rerun_floor(0.01) == pytest.approx(math.sinh(math.sqrt(2) * z * 0.01))
    estimate = stats.RatioEstimate(2.0, 1.0, 4.0, 5)
    assert stats.log_standard_error(estimate) == pytest.approx(math.log(4.0) / (2 * z))
    assert estimate.half_width == 0.75  # (4 - 1) / (2 * 2)
    assert estimate.contains(1.0) and estimate.contains(4.0) and not estimate.contains(4.001)
    assert stats.normal_quantile(0.975) == pytest.approx(z)


def test_confidence_from_rerun_undoes_rerun_interval():
    estimate = stats.RatioEstimate(2.0, 1.6, 2.3, 9, "median-of-ratios", "order statistics")
    back = stats.confidence_from_rerun(stats.rerun_interval(estimate))
    assert (back.ratio, back.low, back.high, back.pairs) == (2.0, pytest.approx(1.6), pytest.approx(2.3), 9)
    assert back.interval == "confidence (rerun rerun (order statistics x sqrt 2) / sqrt 2)"


def test_a_median_estimate_is_the_order_statistic_interval_widened_between_runs():
    seconds = [float(x) for x in range(1, 11)]
    estimate = stats.median_estimate(seconds, 0.0)
    assert (estimate.ratio, estimate.low, estimate.high, estimate.pairs) == (5.5, 2.0, 9.0, 10)
    widened = stats.median_estimate(seconds, 0.05)
    assert widened == stats.with_between_run(estimate, 0.05) and widened.low < 2.0 and widened.high > 9.0


def test_bootstrapped_estimators_take_their_percentile():
    base = {r: float(r + 2) for r in range(11)}  # 2..12
    mine = {r: 1.0 + 0.1 * r for r in range(11)}  # 1..2
    minima = stats.paired_ratio(base, mine, "ratio-of-minima")
    assert minima.ratio == 2.0 and minima.low <= 2.0 <= minima.high
    assert stats.paired_ratio(base, mine, "ratio-of-medians").ratio == pytest.approx(7.0 / 1.5)
    assert stats.paired_ratio(base, mine, "ratio-of-p20").ratio == pytest.approx(4.0 / 1.2)
    assert stats.paired_ratio(base, {}, "ratio-of-minima") is None


def test_a_trend_needs_eight_samples_and_two_start_times():
    started = [float(i) for i in range(8)]
    rising = [1.0 + 0.1 * i for i in range(8)]
    found = stats.trend(started, rising)
    assert found.tau == pytest.approx(1.0)
    assert found.change == pytest.approx(0.1 * 7 / 1.35)  # slope * span / median
    assert stats.trend(started[:7], rising[:7]) is None
    assert stats.trend([0.0] * 8, rising) is None
    assert stats.trend(started, [1.0] * 8).p_value == 1.0  # a constant cell: no p-value, no trend


def test_drifting_needs_significance_and_size_in_either_direction():
    assert stats.Trend(0.5, 0.009, 0.05).drifting
    assert stats.Trend(-0.5, 0.009, -0.05).drifting
    assert not stats.Trend(0.5, 0.01, 0.5).drifting
    assert not stats.Trend(0.5, 0.001, 0.0499).drifting


def test_the_thresholds_docs_statistics_quotes():
    """docs/statistics.md states the noisy mark (IQR / median above 10%) and a running median of 9 steps."""
    assert stats.NOISY_SPREAD == 0.10
    four, five = [1.0] * 20, [1.0] * 20
    four[8:12] = [100.0] * 4
    five[8:13] = [100.0] * 5
    assert stats.running_median(four) == [1.0] * 20  # 4 spikes of 9: outvoted (a window of 8 would tie)
    assert stats.running_median(five)[10] == 100.0  # 5 of 9 win (a window of 10 would tie)


def test_estimates_and_fits_are_frozen_values():
    fit = stats.fit_power_law([10, 20], [1.0, 2.0])
    estimate = stats.RatioEstimate(2.0, 1.0, 4.0, 5)
    for value, name in ((fit, "b"), (estimate, "ratio"), (stats.Trend(0.0, 1.0, 0.0), "tau")):
        with pytest.raises(AttributeError):
            setattr(value, name, 0.0)


# -- what studies of many runs estimate ----------------------------------------------------------


def test_the_between_run_sd_solves_the_method_of_moments_for_a_known_spread():
    """Runs alternately 5% above and below with known errors: var(log b/a) = SE_a^2 + SE_b^2 + 2 sd^2."""
    z = stats.normal_quantile(0.975)
    se = 0.01  # each run's standard error of log
    estimates = [stats.RatioEstimate(math.exp(0.05 * (-1) ** i), math.exp(0.05 * (-1) ** i - z * se),
                                     math.exp(0.05 * (-1) ** i + z * se), 20) for i in range(6)]
    terms = [stats.between_run_term(a, b) for a, b in zip(estimates, estimates[1:])]
    assert terms[0] == pytest.approx((0.1 ** 2, 2 * se ** 2))
    assert stats.between_run_sd(terms) == pytest.approx(math.sqrt((0.01 - 2 * se ** 2) / 2))
    assert stats.between_run_sd([(0.0001, 0.01)]) == 0.0  # the runs' own errors explain every difference
    assert math.isnan(stats.between_run_sd([]))


@pytest.mark.parametrize("rotations, half_width, settings, expected", [
    (6, None, dict(precision=None), None), (7, None, dict(precision=None), "fixed"),
    (6, 0.01, dict(), None),  # precise already, but fewer than `repeats` rotations
    (7, 0.05, dict(), "precise"), (7, 0.051, dict(), None), (7, None, dict(), None),
    (40, 0.2, dict(), "cap"), (8, 0.2, dict(elapsed=60.0), "budget"),
    (40, 0.01, dict(elapsed=60.0), "precise"),  # precise wins over the cap and the budget
])
def test_the_stop_rule_stops_on_width_then_the_cap_then_the_budget(rotations, half_width, settings, expected):
    rule = dict(repeats=7, precision=0.05, max_repeats=40, max_seconds=60.0) | settings
    assert stats.stop_rule(rotations, half_width, **rule) == expected


def test_every_bootstrap_defaults_to_ten_thousand_resamples_from_seed_0():
    """The same record and the same seed give the same report: the defaults, pinned by what they draw."""
    rng = np.random.default_rng(3)
    base = {r: 2.0 + 0.3 * rng.random() for r in range(200)}  # enough pairs that every resample count moves
    mine = {r: 1.0 + 0.3 * rng.random() for r in range(200)}  # the interval's ends
    default = stats.paired_speedup(base, mine)
    assert default == stats.paired_speedup(base, mine, seed=0, resamples=10_000)
    assert default != stats.paired_speedup(base, mine, seed=0, resamples=9_999)  # each default is seen
    assert default != stats.paired_speedup(base, mine, seed=1, resamples=10_000)
