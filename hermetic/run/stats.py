"""The run's statistics: pure functions over lists of numbers, no I/O, no numpy.

Comparisons are paired by repetition: within one repetition every cell ran once, back to back, so the ratio
of two cells' medians in that repetition cancels whatever drifted between repetitions (clocks, temperature,
other tenants). The point estimate is the median of the per-repetition ratios; its intervals are the
sign-test interval (order statistics of the ratios, distribution-free) and a bootstrap over repetitions.
References and defaults: ../shared/notes/gpu-measurement.md (section 5 and table (c)).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from itertools import permutations
from statistics import NormalDist
from typing import Any


def quantile(xs: Sequence[float], q: float) -> float:
    """The q-quantile with linear interpolation between order statistics (numpy's default method)."""
    if not xs:
        raise ValueError("quantile of no values")
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median(xs: Sequence[float]) -> float:
    return quantile(xs, 0.5)


def summary(xs: Sequence[float]) -> dict[str, Any]:
    """Median and spread of one cell's samples; outliers are counted, never dropped."""
    n = len(xs)
    if n == 0:
        return {"n": 0}
    q1, med, q3 = quantile(xs, 0.25), quantile(xs, 0.5), quantile(xs, 0.75)
    iqr = q3 - q1
    mean = sum(xs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
    outliers = sum(1 for x in xs if x < q1 - 1.5 * iqr or x > q3 + 1.5 * iqr)
    return {"n": n, "median": med, "q1": q1, "q3": q3, "iqr": iqr,
            "rel_iqr": iqr / med if med else math.nan,
            "p10": quantile(xs, 0.1), "p90": quantile(xs, 0.9), "min": min(xs), "max": max(xs),
            "mean": mean, "stdev": sd, "cv": sd / mean if mean else math.nan, "outliers": outliers}


def _binom_cdf_half(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2)."""
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) for i in range(min(k, n) + 1)) / 2 ** n


def sign_test_ci(xs: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Distribution-free interval for the median: (low, high, achieved confidence).

    [x(k), x(n+1-k)] covers the median with probability 1 - 2 P(Bin(n, 1/2) <= k-1); the largest k whose
    coverage reaches ``confidence`` is taken. With too few values even [min, max] falls short: that interval
    is returned with the (lower) confidence it really has, e.g. 93.75 % for 5 values.
    """
    s = sorted(xs)
    n = len(s)
    if n == 0:
        raise ValueError("interval of no values")
    best = (s[0], s[-1], 1 - 2 * _binom_cdf_half(0, n))
    for k in range(1, n // 2 + 1):
        cover = 1 - 2 * _binom_cdf_half(k - 1, n)
        if cover < confidence:
            break
        best = (s[k - 1], s[n - k], cover)
    return best


def bootstrap_ci(xs: Sequence[float], stat: Callable[[Sequence[float]], float] = median,
                 confidence: float = 0.95, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat`` resampling the values (repetitions) with replacement."""
    if not xs:
        raise ValueError("interval of no values")
    rng = random.Random(seed)
    n = len(xs)
    vals = sorted(stat([xs[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    alpha = (1 - confidence) / 2
    return quantile(vals, alpha), quantile(vals, 1 - alpha)


def decide(ci: tuple[float, float], threshold: float) -> str:
    """faster / slower / same / unclear for a ratio interval (b over a) against 1 +- threshold."""
    lo, hi = ci
    if lo >= 1 - threshold and hi <= 1 + threshold:
        return "same"
    if lo > 1 + threshold:
        return "slower"
    if hi < 1 - threshold:
        return "faster"
    return "unclear"


def paired_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Per-repetition ratios b/a of two cells' per-repetition medians."""
    if len(a) != len(b):
        raise ValueError("paired values of different lengths")
    return [y / x for x, y in zip(a, b, strict=True)]


def compare(a: Sequence[float], b: Sequence[float], *, threshold: float, confidence: float = 0.95,
            seed: int = 0) -> dict[str, Any]:
    """Paired comparison of cell b against cell a over repetitions (values: per-repetition medians)."""
    r = paired_ratios(a, b)
    lo, hi, achieved = sign_test_ci(r, confidence)
    blo, bhi = bootstrap_ci(r, confidence=confidence, seed=seed)
    return {"ratio": median(r), "ratios": r, "n": len(r),
            "sign_ci": [lo, hi], "sign_confidence": achieved, "bootstrap_ci": [blo, bhi],
            "width": hi - lo, "contains_1": lo <= 1 <= hi,
            "decision": decide((lo, hi), threshold), "threshold": threshold}


def _ranks(xs: Sequence[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    rx, ry = _ranks(xs), _ranks(ys)
    n = len(rx)
    mx, my = sum(rx) / n, sum(ry) / n
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    den = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return num / den if den else 0.0


def spearman_trend_p(ys: Sequence[float]) -> tuple[float, float]:
    """Spearman's rho of values against their index, and its two-sided p-value (exact up to 7 values)."""
    n = len(ys)
    idx = list(range(n))
    rho = spearman(idx, ys)
    if n < 3:
        return rho, 1.0
    if n <= 7:
        rys = _ranks(ys)
        hits = sum(1 for p in permutations(rys) if abs(spearman(idx, p)) >= abs(rho) - 1e-12)
        return rho, hits / math.factorial(n)
    z = abs(rho) * math.sqrt(n - 1)
    return rho, 2 * (1 - NormalDist().cdf(z))


def drift(per_rep: Sequence[float], *, threshold: float, alpha: float = 0.05) -> dict[str, Any]:
    """A monotone trend across repetitions that is both significant and larger than the threshold."""
    n = len(per_rep)
    rho, p = spearman_trend_p(per_rep)
    half = n // 2
    shift = median(per_rep[n - half:]) / median(per_rep[:half]) if half else 1.0
    return {"rho": rho, "p": p, "second_half_over_first": shift,
            "flagged": p < alpha and abs(shift - 1) > threshold}


def repetitions_needed(ratios: Sequence[float], *, halfwidth: float, confidence: float = 0.95) -> int:
    """Repetitions for a ratio interval of +-``halfwidth``: the median's variance is pi/2 sigma^2/n (normal
    errors), sigma from the paired log-ratios; never fewer than the sign test needs to reach ``confidence``."""
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    floor = next(n for n in range(1, 64) if 1 - 2 * _binom_cdf_half(0, n) >= confidence)
    logs = [math.log(r) for r in ratios if r > 0]
    if len(logs) < 2:
        return floor
    m = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / (len(logs) - 1))
    need = math.ceil(math.pi / 2 * (z * sd / math.log1p(halfwidth)) ** 2)
    return max(floor, need)
