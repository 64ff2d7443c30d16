"""Statistics for sampling, reports and comparisons: speedup estimators and intervals, trends, power-law fits.

Everything here takes plain lists of seconds and returns plain numbers, so it can
be tested against known cases without a record. Bootstraps are seeded per call
(from the caller's seed and a key such as (mode, length)), so a report of the
same record is the same text every time, whatever order its cells are computed in.
scipy is imported where it is used: it costs seconds, and `kvbench run` imports
the report module only for its table.
"""

from __future__ import annotations

import math
import statistics
import zlib
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95  # two-sided level of every interval kvbench prints
RESAMPLES = 10_000  # bootstrap resamples per interval
SEED = 0  # default bootstrap seed; same record + same seed -> same report
NOISY_SPREAD = 0.10  # IQR / median above this: spread too wide to trust the cell
RUNNING_WINDOW = 9  # steps in the running median of the per-step profile


def rng_for(seed: int, *key: object) -> np.random.Generator:
    """A generator determined by the seed and a key, independent of call order."""
    words = [seed & 0xFFFFFFFF] + [zlib.crc32(repr(part).encode()) for part in key]
    return np.random.default_rng(words)


def _percentile_interval(estimates: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2
    low, high = np.quantile(estimates, [tail, 1 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class RatioEstimate:
    """A ratio (a speedup, a change) with its interval, and how both were computed."""

    ratio: float
    low: float
    high: float
    pairs: int  # repetitions (paired) or min(len(a), len(b)) (unpaired) behind it
    estimator: str = "ratio-of-medians"
    interval: str = "percentile bootstrap"

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    @property
    def half_width(self) -> float:
        """Relative half-width of the interval: (high - low) / (2 * ratio)."""
        return (self.high - self.low) / (2 * self.ratio)


# Speedup estimators over paired repetitions (rotation r of the baseline and of a mode ran
# back to back). docs/statistics.md gives the A/A evidence behind the default.
ESTIMATORS = {
    "median-of-ratios": "median over rotations of baseline / mode seconds, each pair from one rotation",
    "ratio-of-medians": "median baseline seconds / median mode seconds",
    "ratio-of-p20": "20th percentile of baseline seconds / 20th percentile of mode seconds",
    "ratio-of-minima": "fastest baseline seconds / fastest mode seconds",
}
PERCENTILES = {"ratio-of-medians": 50, "ratio-of-p20": 20, "ratio-of-minima": 0}  # the bootstrapped estimators


def median_interval(values: np.ndarray | list[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Distribution-free interval for the median: the order statistics x_(l), x_(n+1-l) whose
    coverage P(l <= Binomial(n, 1/2) < n + 1 - l) is at least `confidence` (below 6 values,
    the range, whose coverage 1 - 2^(1-n) is below 95%)."""
    ordered = np.sort(np.asarray(values, dtype=float))
    n = len(ordered)
    tail = (1 - confidence) / 2
    below, cumulative = -1, 0.0  # the largest k with P(B <= k) <= tail, and that probability

    def mass(k: int) -> float:  # P(B = k), through logarithms: 2^-n underflows beyond n = 1074
        return math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2))

    while cumulative + mass(below + 1) <= tail:
        below += 1
        cumulative += mass(below)
    below = max(below, 0)
    return float(ordered[below]), float(ordered[n - 1 - below])


def paired_ratio(baseline: dict[int, float], cached: dict[int, float], estimator: str = "median-of-ratios", *,
                 seed: int = SEED, key: tuple = (), resamples: int = RESAMPLES,
                 confidence: float = CONFIDENCE) -> RatioEstimate | None:
    """baseline / cached by `estimator`, with its interval; None when no repetition is shared.

    The median of per-pair ratios gets the exact order-statistic interval of a median; the
    other estimators a percentile bootstrap that draws repetition indices and keeps each
    drawn pair together.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {list(ESTIMATORS)}, got {estimator!r}")
    shared = sorted(set(baseline) & set(cached))
    if not shared:
        return None
    base = np.array([baseline[r] for r in shared])
    mine = np.array([cached[r] for r in shared])
    if estimator == "median-of-ratios":
        ratios = base / mine
        ratio = float(np.median(ratios))
        low, high = median_interval(ratios, confidence)
        return RatioEstimate(ratio, min(low, ratio), max(high, ratio), len(shared), estimator, "order statistics")
    level = PERCENTILES[estimator]
    ratio = float(np.percentile(base, level) / np.percentile(mine, level))
    draws = rng_for(seed, "paired", *key).integers(0, len(shared), size=(resamples, len(shared)))
    estimates = np.percentile(base[draws], level, axis=1) / np.percentile(mine[draws], level, axis=1)
    low, high = _percentile_interval(estimates, confidence)
    return RatioEstimate(ratio, min(low, ratio), max(high, ratio), len(shared), estimator)


def paired_speedup(
    baseline: dict[int, float], cached: dict[int, float], *, seed: int = SEED, key: tuple = (),
    resamples: int = RESAMPLES, confidence: float = CONFIDENCE,
) -> RatioEstimate | None:
    """median(baseline) / median(cached) with a bootstrap CI over repetition indices.

    Both arguments map repetition index -> seconds. Repetition r of both modes ran
    back to back in one rotation of the protocol, so a resample draws repetition
    indices and keeps each drawn repetition's pair together: drift that slows a
    whole repetition moves both sides of its pair. Only repetitions present on
    both sides count (an interrupted run can leave one side short). None when no
    repetition is shared.
    """
    shared = sorted(set(baseline) & set(cached))
    if not shared:
        return None
    base = np.array([baseline[r] for r in shared])
    mine = np.array([cached[r] for r in shared])
    ratio = float(np.median(base) / np.median(mine))
    draws = rng_for(seed, "paired", *key).integers(0, len(shared), size=(resamples, len(shared)))
    estimates = np.median(base[draws], axis=1) / np.median(mine[draws], axis=1)
    low, high = _percentile_interval(estimates, confidence)
    return RatioEstimate(ratio, min(low, ratio), max(high, ratio), len(shared))


def unpaired_ratio(
    old: list[float], new: list[float], *, seed: int = SEED, key: tuple = (),
    resamples: int = RESAMPLES, confidence: float = CONFIDENCE,
) -> RatioEstimate:
    """median(new) / median(old), each sample resampled on its own (two separate runs)."""
    if not old or not new:
        raise ValueError(f"need samples on both sides, got {len(old)} old and {len(new)} new")
    a, b = np.asarray(old, dtype=float), np.asarray(new, dtype=float)
    ratio = float(np.median(b) / np.median(a))
    rng = rng_for(seed, "unpaired", *key)
    draws_a = rng.integers(0, len(a), size=(resamples, len(a)))
    draws_b = rng.integers(0, len(b), size=(resamples, len(b)))
    estimates = np.median(b[draws_b], axis=1) / np.median(a[draws_a], axis=1)
    low, high = _percentile_interval(estimates, confidence)
    return RatioEstimate(ratio, min(low, ratio), max(high, ratio), min(len(a), len(b)))


@dataclass(frozen=True)
class PowerFit:
    """time ~ a * T^b by least squares on log(time) = log(a) + b log(T)."""

    a: float
    b: float
    b_stderr: float | None  # None with two lengths: a line through two points has no residual
    b_low: float | None
    b_high: float | None
    r_squared: float | None
    points: int
    tail_b: float | None  # slope between the two longest lengths: the large-T behaviour

    def predict(self, length: float) -> float:
        return self.a * length ** self.b


def fit_power_law(lengths: list[int], seconds: list[float], confidence: float = CONFIDENCE) -> PowerFit | None:
    """Fit time ~ a * T^b over (length, median seconds) points; None below two lengths.

    The interval on b is the t-distribution interval of the slope (n - 2 degrees
    of freedom). Fixed per-call overhead flattens short lengths, so the global b
    can sit below the asymptotic exponent; tail_b shows the slope where T is largest.
    """
    points = sorted((int(n), float(s)) for n, s in zip(lengths, seconds, strict=True))
    if len({n for n, _ in points}) < 2:
        return None
    from scipy import stats as sps

    x = np.log([n for n, _ in points])
    y = np.log([s for _, s in points])
    fit = sps.linregress(x, y)
    a, b = math.exp(fit.intercept), float(fit.slope)
    tail_b = float((y[-1] - y[-2]) / (x[-1] - x[-2]))
    if len(points) < 3:
        return PowerFit(a, b, None, None, None, None, len(points), tail_b)
    stderr = float(fit.stderr)
    half = float(sps.t.ppf(0.5 + confidence / 2, len(points) - 2)) * stderr
    return PowerFit(a, b, stderr, b - half, b + half, float(fit.rvalue ** 2), len(points), tail_b)


def running_median(values: list[float], window: int = RUNNING_WINDOW) -> list[float]:
    """Running median over `window` steps centred on each step, slid inward at both ends.

    Near the ends the window keeps its full size rather than shrinking, so the
    first and last steps are as robust to a single outlier as the middle ones.
    """
    size = max(1, min(window, len(values)))
    out = []
    for i in range(len(values)):
        start = min(max(i - size // 2, 0), len(values) - size)
        out.append(statistics.median(values[start : start + size]))
    return out


def crossover_step(full: list[float], cached: list[float], window: int = RUNNING_WINDOW) -> int | None:
    """First step from which the cached step stays faster than the full-prefix step.

    Compares running medians, so an isolated slow step (a page fault, a context
    switch) neither creates nor hides a crossover. None when the cached step is
    not faster at the end of the profile.
    """
    if len(full) != len(cached):
        raise ValueError(f"per-step profiles differ in length: full has {len(full)} steps, cached {len(cached)}")
    smooth_full, smooth_cached = running_median(full, window), running_median(cached, window)
    start = None
    for step, (f, c) in enumerate(zip(smooth_full, smooth_cached)):
        if c < f:
            start = step if start is None else start
        else:
            start = None
    return start


def spread(q1: float, q3: float, median: float) -> float:
    """IQR / median: the relative width of the middle half of the repetitions."""
    return (q3 - q1) / median if median > 0 else math.inf


DEFAULT_ESTIMATOR = "median-of-ratios"
INTERVALS = {
    "within": "95% confidence interval from this run's samples alone (what the run itself can resolve)",
    "confidence": "95% confidence interval of the speedup on this machine: this run's sampling error and the "
                  "variation between runs of the same code, combined",
    "rerun": "95% interval for what an identical rerun reports: the confidence interval widened by sqrt(2) "
             "in log scale, since a rerun carries its own errors",
}
DEFAULT_INTERVAL = "rerun"
# Relative standard deviation between runs of the same code on the same machine that no sample count
# inside one run can reveal (process layout, machine state from one run to the next): a speedup, and a
# cell's median seconds. Measured from A/A runs on two 2-core VMs (docs/statistics.md, "Between runs"):
# a speedup's stayed within 0.7% on both; a cell's seconds moved 1.4% on one and 3.5% (4.8% with a
# neighbour on the run's CPU) on the other, so raw seconds get the larger. `kvbench run --between-run`
# sets the speedup's for another machine.
BETWEEN_RUN = {"speedup": 0.01, "seconds": 0.05}


def speedup(baseline: dict[int, float], cached: dict[int, float], *, estimator: str | None = None,
            interval: str | None = None, between_run: float | None = None, key: tuple = (), seed: int = SEED,
            confidence: float = CONFIDENCE) -> RatioEstimate | None:
    """kvbench's speedup: an estimator (default DEFAULT_ESTIMATOR) with an interval (default DEFAULT_INTERVAL)
    that allows for `between_run` (default BETWEEN_RUN["speedup"]) unless it is "within"."""
    interval = interval or DEFAULT_INTERVAL
    if interval not in INTERVALS:
        raise ValueError(f"interval must be one of {list(INTERVALS)}, got {interval!r}")
    estimate = paired_ratio(baseline, cached, estimator or DEFAULT_ESTIMATOR, seed=seed, key=key, confidence=confidence)
    if estimate is None or interval == "within":
        return estimate
    between_run = BETWEEN_RUN["speedup"] if between_run is None else between_run
    widened = with_between_run(estimate, between_run, confidence)
    return rerun_interval(widened) if interval == "rerun" else widened


def with_between_run(estimate: RatioEstimate, between_run: float, confidence: float = CONFIDENCE) -> RatioEstimate:
    """The interval of a run-level quantity: each side's log half-width combined in quadrature with
    z * `between_run`, the variation between runs that one run's samples cannot show (a random
    effect per run, as in Kalibera & Jones 2013, "Rigorous benchmarking in reasonable time")."""
    if not between_run:
        return estimate
    extra = normal_quantile(0.5 + confidence / 2) * between_run
    below = math.hypot(math.log(estimate.ratio / estimate.low), extra)
    above = math.hypot(math.log(estimate.high / estimate.ratio), extra)
    return RatioEstimate(estimate.ratio, estimate.ratio * math.exp(-below), estimate.ratio * math.exp(above),
                         estimate.pairs, estimate.estimator, f"{estimate.interval} + between runs {between_run:.1%}")


def median_estimate(seconds: list[float], between_run: float, confidence: float = CONFIDENCE) -> RatioEstimate:
    """A median of seconds with its confidence interval: the order-statistic interval of the median, widened by
    `between_run`, the relative standard deviation of a median between runs of the same code."""
    low, high = median_interval(seconds, confidence)
    within = RatioEstimate(statistics.median(seconds), low, high, len(seconds), "median", "order statistics")
    return with_between_run(within, between_run, confidence)


def confidence_from_rerun(estimate: RatioEstimate) -> RatioEstimate:
    """The confidence interval a rerun interval was widened from (the inverse of rerun_interval)."""
    low = estimate.ratio * (estimate.low / estimate.ratio) ** (1 / math.sqrt(2))
    high = estimate.ratio * (estimate.high / estimate.ratio) ** (1 / math.sqrt(2))
    return RatioEstimate(estimate.ratio, low, high, estimate.pairs, estimate.estimator,
                         f"confidence (rerun {estimate.interval} / sqrt 2)")


def rerun_interval(estimate: RatioEstimate) -> RatioEstimate:
    """Where an identical rerun's estimate falls: the difference of two estimates with the same
    standard error has sqrt(2) times that error, so each side of the interval (log scale) is
    widened by sqrt(2)."""
    low = estimate.ratio * (estimate.low / estimate.ratio) ** math.sqrt(2)
    high = estimate.ratio * (estimate.high / estimate.ratio) ** math.sqrt(2)
    return RatioEstimate(estimate.ratio, low, high, estimate.pairs, estimate.estimator,
                         f"rerun ({estimate.interval} x sqrt 2)")


def rerun_floor(between_run: float, confidence: float = CONFIDENCE) -> float:
    """The narrowest relative half-width a rerun interval can reach, however many samples: the
    between-run variation alone."""
    return math.sinh(math.sqrt(2) * normal_quantile(0.5 + confidence / 2) * between_run)  # as half_width measures


TREND_P = 0.01  # a cell drifts when its samples trend over time this significantly...
TREND_SIZE = 0.05  # ...and by at least this much of their median across the run


@dataclass(frozen=True)
class Trend:
    """Kendall's tau of seconds against start time, and the Theil-Sen change across the run."""

    tau: float
    p_value: float
    change: float  # fitted change from the first to the last sample, relative to the median

    @property
    def drifting(self) -> bool:
        return self.p_value < TREND_P and abs(self.change) >= TREND_SIZE


def trend(started: list[float], seconds: list[float]) -> Trend | None:
    """Whether a cell's samples drift over the run (warm-up not over, machine changing); None below 8 samples."""
    if len(seconds) < 8 or len(set(started)) < 2:
        return None
    from scipy import stats as sps

    tau, p_value = sps.kendalltau(started, seconds)
    slope = sps.theilslopes(seconds, started).slope
    change = slope * (max(started) - min(started)) / statistics.median(seconds)
    return Trend(float(tau), float(p_value) if p_value == p_value else 1.0, float(change))


def normal_quantile(probability: float) -> float:
    return statistics.NormalDist().inv_cdf(probability)


def log_standard_error(estimate: RatioEstimate, confidence: float = CONFIDENCE) -> float:
    """The standard error of log(ratio) that a `confidence` interval of this width implies."""
    return (math.log(estimate.high) - math.log(estimate.low)) / (2 * normal_quantile(0.5 + confidence / 2))


# -- what studies of many runs estimate (scripts/ call these; docs/statistics.md) -----------------


def between_run_term(first: RatioEstimate, second: RatioEstimate) -> tuple[float, float]:
    """Two consecutive runs' estimates of one quantity: (log(second / first)^2, the sum of their squared
    standard errors of log), one term of between_run_sd."""
    return (math.log(second.ratio / first.ratio) ** 2,
            log_standard_error(first) ** 2 + log_standard_error(second) ** 2)


def between_run_sd(terms: list[tuple[float, float]]) -> float:
    """The relative standard deviation between runs of the same code, by the method of moments over
    between_run_term's: var(log b/a) = SE_a^2 + SE_b^2 + 2 sd^2, so sd^2 = (mean d^2 - mean(SE_a^2 + SE_b^2)) / 2,
    0 when the runs' own errors explain every difference; nan without a term."""
    if not terms:
        return math.nan
    return math.sqrt(max(0.0, sum(squared - errors for squared, errors in terms) / len(terms) / 2))


def stop_rule(rotations: int, half_width: float | None, *, repeats: int, precision: float | None,
              max_repeats: int, elapsed: float = 0.0, max_seconds: float = math.inf) -> str | None:
    """Why sampling stops after `rotations` rotations whose widest watched interval has relative half-width
    `half_width` (None: no interval yet), or None to go on: "fixed" at `repeats` without a precision target;
    else from `repeats` on, "precise" once within `precision`, "cap" at `max_repeats`, "budget" once `elapsed`
    reaches `max_seconds` (the stop reasons of kvbench.measure.sampling, in this order). It stops on interval width,
    never on a p-value, so stopping cannot manufacture a difference."""
    if precision is None:
        return "fixed" if rotations >= repeats else None
    if rotations < repeats:
        return None
    if half_width is not None and half_width <= precision:
        return "precise"
    if rotations >= max_repeats:
        return "cap"
    if elapsed >= max_seconds:
        return "budget"
    return None
