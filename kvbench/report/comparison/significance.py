"""Significance across many measures: Welch's t-test on log values, and Holm–Bonferroni over a family of them.
Torch- and scipy-free (compare stays cheap).

A serving compare judges about 16 measures per kind. Each verdict at level alpha alone would cry wolf about once
in every 1/alpha / 16 compares of identical code; Holm's step-down procedure keeps the chance of any false alarm
in the family at most alpha, whatever the dependence between the measures (TTFT p50, p90 and p99 move together),
and rejects all that Bonferroni rejects and more.

The p-value of one measure is Welch's two-sided t-test of the two records' per-rotation values, in logs (a ratio
is what is judged, and a time's spread grows with its size). It uses each record's spread between its own
rotations, which an order-statistic interval of a median over three rotations ([min, max]) understates.
"""

from __future__ import annotations

import math
import statistics


def welch_p(old: list[float], new: list[float]) -> float:
    """Two-sided p-value of equal means of log(old) and log(new) (all values > 0); 1 when either side has one
    value (no spread to judge by), 0 when both are constant and differ."""
    if len(old) < 2 or len(new) < 2:
        return 1.0
    a, b = [math.log(v) for v in old], [math.log(v) for v in new]
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    difference = statistics.fmean(b) - statistics.fmean(a)
    if va + vb == 0:
        return 1.0 if difference == 0 else 0.0
    t = abs(difference) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return incomplete_beta(df / 2, 0.5, df / (df + t * t))  # P(|T| >= t) for Student's t with df


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (Numerical Recipes 6.4)."""
    if x <= 0 or x >= 1:
        return max(0.0, min(1.0, x))
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1) / (a + b + 2):  # converges fast on this side only: use the symmetry I_x(a, b) = 1 - I_1-x(b, a)
        return 1 - incomplete_beta(b, a, 1 - x)
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > 1e-300 else 1e-300)
    fraction = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > 1e-300 else 1e-300)
            c = 1 + numerator / c
            c = c if abs(c) > 1e-300 else 1e-300
            fraction *= c * d
        if abs(c * d - 1) < 1e-14:
            break
    return front * fraction / a


def holm(p_values: list[float], alpha: float) -> list[bool]:
    """Which of a family of hypotheses Holm–Bonferroni rejects at family-wise level alpha: the k-th smallest
    p-value (from 0) of m must be at most alpha / (m - k), and once one is not, none after it is."""
    order = sorted(range(len(p_values)), key=lambda index: p_values[index])
    rejected = [False] * len(p_values)
    for k, index in enumerate(order):
        if p_values[index] > alpha / (len(p_values) - k):
            break
        rejected[index] = True
    return rejected


__all__ = ["holm", "incomplete_beta", "welch_p"]
