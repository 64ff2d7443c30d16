"""Statistics for reports and comparisons: bootstrap intervals, Mann-Whitney U, power-law fits.

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
    """A ratio of medians with its percentile-bootstrap interval."""

    ratio: float
    low: float
    high: float
    pairs: int  # repetitions (paired) or min(len(a), len(b)) (unpaired) behind it

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


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


def mann_whitney_p(old: list[float], new: list[float]) -> float | None:
    """Two-sided Mann-Whitney U p-value; None when either side has fewer than two samples.

    Exact for small samples without ties. Note the floor: with n samples per side
    the smallest possible p is 2 / C(2n, n) -- 0.1 for n = 3, 0.029 for n = 4,
    0.0079 for n = 5 -- so three repetitions can never be significant at 0.05.
    """
    if len(old) < 2 or len(new) < 2:
        return None
    if len(set(old) | set(new)) == 1:
        return 1.0  # all equal: no evidence of any difference (scipy would divide by zero)
    from scipy import stats as sps

    return float(sps.mannwhitneyu(new, old, alternative="two-sided").pvalue)


def smallest_p_value(n_old: int, n_new: int) -> float:
    """The smallest two-sided p the exact Mann-Whitney U test can give for these sample sizes."""
    return min(1.0, 2 / math.comb(n_old + n_new, n_old))


FASTER, SLOWER, UNCHANGED, UNTESTED = "faster", "slower", "unchanged", "untested"


def verdict(ratio: float, p_value: float | None, factor: float, alpha: float) -> str:
    """slower / faster only when the ratio passes the factor *and* the test is significant.

    A large ratio without significance is noise as far as kvbench can tell
    (unchanged); a significant but tiny change is below what the user cares about
    (unchanged). UNTESTED when there are too few samples to test at all.
    """
    if p_value is None:
        return UNTESTED
    if p_value >= alpha:
        return UNCHANGED
    if ratio > factor:
        return SLOWER
    if ratio < 1 / factor:
        return FASTER
    return UNCHANGED


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
