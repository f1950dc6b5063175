"""Rare-event rates: exact intervals, homogeneity, the Poisson trend and the pairwise ratio bound."""

from __future__ import annotations

import math

import numpy as np
import pytest

from alibi.sweep.rates import binomial_rate, homogeneity, poisson_trend, ratio_bound


def test_zero_events_upper_bound_is_the_closed_form_clopper_pearson_bound():
    n = 10**8
    r = binomial_rate(0, n, 0.95)
    assert r.low == 0.0 and r.rate == 0.0
    # With 0 events the exact two-sided upper bound solves (1 − p)^n = 0.025.
    assert r.high == pytest.approx(1 - 0.025 ** (1 / n), rel=1e-9)


def test_homogeneity_rejects_a_doubled_rate_and_accepts_equal_rates():
    n = 10**8
    same = homogeneity([500, 520, 490], [n, n, n])
    doubled = homogeneity([500, 1000, 510], [n, n, n])
    assert same.status == "ok" and same.p_chi2 > 0.05 and same.p_exact > 0.05
    assert doubled.p_chi2 < 1e-10 and doubled.p_exact == pytest.approx(1 / (1 + doubled.draws))


def test_exact_homogeneity_p_value_is_valid_where_chi_square_expectations_are_tiny():
    """18 events over 7 groups (the paper's INT8 sweep): expected counts ≈ 2.6, the χ² approximation's
    regime ends; the Monte-Carlo conditional p-value is what a reader should trust there."""
    h = homogeneity([2, 3, 1, 4, 2, 3, 3], [10**6] * 7)
    assert h.min_expected < 5
    assert 0.5 < h.p_exact <= 1.0


def test_poisson_trend_recovers_the_exponent_of_counts_generated_with_it():
    rng = np.random.default_rng(0)
    x = [512 * 2**i for i in range(7)]
    exposure = [10**7] * 7
    rate0, b = 1e-4, 0.5
    events = [int(rng.poisson(rate0 * (k / 512) ** b * 10**7)) for k in x]
    t = poisson_trend(x, events, exposure, "K", 0.90)
    assert t.status == "ok" and t.exponent_low < b < t.exponent_high
    assert t.p_value < 1e-10
    assert t.factor == pytest.approx((x[-1] / x[0]) ** t.exponent)
    assert t.factor_low < 64**0.5 < t.factor_high


def test_poisson_trend_without_events_or_with_one_point_is_a_status():
    assert poisson_trend([1, 2], [0, 0], [10, 10], "M").status == "no-events"
    assert poisson_trend([4, 4], [1, 2], [10, 10], "M").status == "one-point"


def test_poisson_trend_with_all_events_at_one_end_leaves_that_side_unbounded():
    t = poisson_trend([1, 4, 16], [0, 0, 30], [10**6] * 3, "M")
    assert t.exponent_high is None and t.factor_high is None
    assert t.exponent_low is not None and t.exponent_low > 0


def test_ratio_bound_contains_the_true_ratio_and_is_simultaneous_over_pairs():
    x = [1, 4, 16, 64]
    n = 10**8
    events = [500, 510, 495, 1000]  # the last point at twice the rate
    rb = ratio_bound(x, events, [n] * 4, 0.90)
    assert rb.status == "ok" and rb.pairs == 6
    assert rb.pair_level == pytest.approx(1 - 0.10 / 6)
    assert rb.max_ratio > 2.0 and 64.0 in rb.pair
    equal = ratio_bound(x, [500, 500, 500, 500], [n] * 4, 0.90)
    assert 1.0 < equal.max_ratio < 1.3


def test_ratio_bound_with_a_zero_count_is_unbounded():
    assert ratio_bound([1, 4], [0, 10], [100, 100]).status == "unbounded"
    assert ratio_bound([1, 4], [0, 0], [100, 100]).status == "no-events"


def test_binomial_rate_refuses_impossible_counts():
    with pytest.raises(ValueError):
        binomial_rate(5, 4)
    assert math.isfinite(binomial_rate(4, 4).low)
