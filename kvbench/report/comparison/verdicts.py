"""Verdicts on a change between two runs: NEW / OLD with its interval, minimum detectable effect and name.

A change smaller than its MDE is "within noise"; beyond the MDE but within the factor,
"unchanged"; beyond both with the interval excluding 1, "slower" or "faster". kvbench compare,
the history page and every comparison of a figure use these, so a verdict means one thing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvbench.measure import stats

FACTOR = 1.1  # a detectable change smaller than this ratio is "unchanged"
ALPHA = 0.05  # two-sided level of every interval and of the minimum detectable effect
POWER = 0.80  # the MDE is the true change detected with this probability
SLOWER, FASTER, UNCHANGED, WITHIN_NOISE = "slower", "faster", "unchanged", "within noise"
VERDICTS = (SLOWER, FASTER, UNCHANGED, WITHIN_NOISE)
NOT_COMPARABLE = "not comparable"  # a raw time measured on two different machines


@dataclass(frozen=True)
class Change:
    """NEW / OLD of one quantity (above 1: NEW costs more), its interval, MDE and verdict."""

    ratio: float
    low: float
    high: float
    mde: float  # relative: 0.06 means a true change of 6% would be detected with POWER
    verdict: str
    log_error: float = 0.0  # standard error of log(ratio): what two changes combine by


def judged_change(ratio: float, error: float, *, factor: float, alpha: float) -> Change:
    """The interval, MDE and verdict of a ratio whose log has standard error `error`."""
    z = stats.normal_quantile(1 - alpha / 2)
    low, high = ratio * math.exp(-z * error), ratio * math.exp(z * error)
    mde = math.exp((z + stats.normal_quantile(POWER)) * error) - 1
    size = abs(math.log(ratio))
    if size < math.log1p(mde):
        verdict = WITHIN_NOISE
    elif ratio > factor and low > 1:
        verdict = SLOWER
    elif ratio < 1 / factor and high < 1:
        verdict = FASTER
    else:
        verdict = UNCHANGED
    return Change(ratio, low, high, mde, verdict, error)


def change(old: stats.RatioEstimate, new: stats.RatioEstimate, *, factor: float, alpha: float,
           invert: bool = False) -> Change:
    """NEW / OLD (or OLD / NEW with `invert`, for speedups) from two independent runs' confidence intervals.

    Each side's standard error is read off its interval in log scale; the two add in
    quadrature. The MDE is (z_{1-alpha/2} + z_{power}) standard errors of the difference.
    """
    error = math.hypot(*(stats.log_standard_error(estimate) for estimate in (old, new)))
    ratio = old.ratio / new.ratio if invert else new.ratio / old.ratio
    return judged_change(ratio, error, factor=factor, alpha=alpha)


def relative_to(value: Change, reference: Change, *, factor: float, alpha: float) -> Change:
    """`value` held against `reference` (e.g. full's time against the machine probe's): their ratio,
    the two errors combined as from independent measurements."""
    return judged_change(value.ratio / reference.ratio, math.hypot(value.log_error, reference.log_error),
                         factor=factor, alpha=alpha)
