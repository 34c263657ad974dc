"""The run's statistics are pure functions: checked against values worked out by hand and known tables."""

from __future__ import annotations

import math
import random

import pytest

from hermetic.run import stats


def test_quantile_matches_linear_interpolation() -> None:
    xs = [7.0, 1.0, 3.0, 5.0]
    assert stats.quantile(xs, 0.0) == 1.0
    assert stats.quantile(xs, 1.0) == 7.0
    assert stats.median(xs) == 4.0
    assert stats.quantile(xs, 0.25) == pytest.approx(2.5)
    with pytest.raises(ValueError):
        stats.quantile([], 0.5)


def test_summary_counts_outliers_and_never_drops_them() -> None:
    xs = [10.0] * 9 + [100.0]
    s = stats.summary(xs)
    assert s["n"] == 10 and s["max"] == 100.0 and s["outliers"] == 1 and s["median"] == 10.0


def test_sign_test_interval_uses_the_order_statistics_of_the_tables() -> None:
    # n = 10 -> [x(2), x(9)] at 97.9 %; n = 20 -> [x(6), x(15)] at 95.9 % (Nair's table)
    xs10 = [float(i) for i in range(1, 11)]
    lo, hi, conf = stats.sign_test_ci(xs10, 0.95)
    assert (lo, hi) == (2.0, 9.0) and conf == pytest.approx(0.9785, abs=1e-4)
    xs20 = [float(i) for i in range(1, 21)]
    lo, hi, conf = stats.sign_test_ci(xs20, 0.95)
    assert (lo, hi) == (6.0, 15.0) and conf == pytest.approx(0.9586, abs=1e-4)
    # with 5 values even [min, max] reaches only 93.75 %: reported as such, not as 95 %
    lo, hi, conf = stats.sign_test_ci([5.0, 1.0, 4.0, 2.0, 3.0], 0.95)
    assert (lo, hi) == (1.0, 5.0) and conf == pytest.approx(0.9375)


def test_sign_interval_covers_the_median_at_its_stated_rate() -> None:
    rng = random.Random(7)
    hits = 0
    trials = 2000
    for _ in range(trials):
        xs = [rng.gauss(0, 1) for _ in range(10)]
        lo, hi, _ = stats.sign_test_ci(xs, 0.95)
        hits += lo <= 0 <= hi
    assert hits / trials == pytest.approx(0.9785, abs=0.015)


def test_bootstrap_is_seeded_and_brackets_the_median() -> None:
    xs = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.03]
    a = stats.bootstrap_ci(xs, seed=3)
    assert a == stats.bootstrap_ci(xs, seed=3)
    assert a[0] <= stats.median(xs) <= a[1]


@pytest.mark.parametrize(("ci", "decision"), [
    ((0.998, 1.003), "same"), ((1.01, 1.02), "slower"), ((0.97, 0.99), "faster"), ((0.99, 1.001), "unclear"),
    ((1.002, 1.02), "unclear"),
])
def test_decisions_against_the_threshold(ci: tuple[float, float], decision: str) -> None:
    assert stats.decide(ci, 0.005) == decision


def test_compare_is_paired_by_repetition() -> None:
    # a shared drift (x1.1 per repetition) cancels in the paired ratio; b is exactly 2 % slower
    a = [100.0 * 1.1 ** r for r in range(10)]
    b = [x * 1.02 for x in a]
    c = stats.compare(a, b, threshold=0.005)
    assert c["ratio"] == pytest.approx(1.02)
    assert c["sign_ci"][0] == pytest.approx(1.02) and c["decision"] == "slower"
    with pytest.raises(ValueError):
        stats.paired_ratios([1.0], [1.0, 2.0])


def test_drift_flags_a_real_trend_and_not_noise() -> None:
    rng = random.Random(1)
    trend = [100 + 2 * r + rng.random() for r in range(10)]
    assert stats.drift(trend, threshold=0.005)["flagged"]
    flat = [100 + rng.random() * 0.1 for _ in range(10)]
    assert not stats.drift(flat, threshold=0.005)["flagged"]
    rho, p = stats.spearman_trend_p([1.0, 2.0, 3.0, 4.0, 5.0])
    assert rho == 1.0 and p == pytest.approx(2 / 120)


def test_spearman_handles_ties() -> None:
    assert stats.spearman([1, 2, 3, 4], [1, 1, 2, 2]) == pytest.approx(math.sqrt(0.8))


def test_repetitions_needed_grows_with_noise_and_has_a_floor() -> None:
    quiet = [1.0 + 0.0005 * (-1) ** i for i in range(10)]
    noisy = [1.0 + 0.02 * (-1) ** i for i in range(10)]
    assert stats.repetitions_needed(quiet, halfwidth=0.005) == 6   # the sign test's floor at 95 %
    n = stats.repetitions_needed(noisy, halfwidth=0.005)
    # pi/2 * (1.96 * 0.0211 / 0.005)^2 = about 108
    assert 90 < n < 130
