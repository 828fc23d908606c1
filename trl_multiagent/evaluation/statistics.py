"""The interval the evaluation reports: the mean of n values ± t(0.975, n - 1) · s / √n (Student t, n - 1 degrees of
freedom, s the sample standard deviation), the t quantile computed here (no scipy needed). Plain functions.

On hand-computed values (s = 0.2582, t(0.975, 3) = 3.1824, 3.1824 · 0.2582 / 2 = 0.4109):

>>> interval = mean_ci([0.2, 0.4, 0.6, 0.8])
>>> round(interval.mean, 4), round(interval.half_width, 4), interval.n
(0.5, 0.4109, 4)
>>> round(t_quantile(0.975, 1), 3), round(t_quantile(0.975, 9), 4)
(12.706, 2.2622)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


CONFIDENCE = 0.95
CI_METHOD = "Student t, n - 1 degrees of freedom: mean ± t(0.975, n - 1) · s / sqrt(n), over held-out prompts"


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom.

    >>> t_cdf(0.0, 5), round(t_cdf(2.5706, 5), 4)
    (0.5, 0.975)
    """
    tail = 0.5 * _betai(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The `p` quantile of Student's t with `df` degrees of freedom (bisection on `t_cdf`; no scipy needed)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile: need 0 < p < 1 and df > 0, got p={p}, df={df}.")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2.0


@dataclass
class Interval:
    """The mean of n values and its confidence interval: `mean ± half_width` = [`low`, `high`]."""

    mean: float
    half_width: float
    low: float
    high: float
    n: int
    sd: float  # the sample standard deviation (n - 1 in the denominator)
    confidence: float = CONFIDENCE


def mean_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Mean ± t(1 - (1 - confidence) / 2, n - 1) · s / √n of `values` (NaN values left out).

    With one value the interval is undefined (NaN half-width); with none, the mean is NaN too.

    >>> mean_ci([1.0, 1.0, 1.0])
    Interval(mean=1.0, half_width=0.0, low=1.0, high=1.0, n=3, sd=0.0, confidence=0.95)
    >>> math.isnan(mean_ci([0.7]).half_width)
    True
    """
    values = [float(v) for v in values if not math.isnan(float(v))]
    n = len(values)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, math.nan, 0, math.nan, confidence)
    mean = sum(values) / n
    if n == 1:
        return Interval(mean, math.nan, math.nan, math.nan, 1, math.nan, confidence)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(1.0 - (1.0 - confidence) / 2.0, n - 1) * sd / math.sqrt(n)
    return Interval(mean, half, mean - half, mean + half, n, sd, confidence)
