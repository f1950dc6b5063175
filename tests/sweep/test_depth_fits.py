"""The depth fits recover the parameters of data generated with them, rank the generating model first,
and give statuses (never NaN) on degenerate data.

Synthetic data: each (seed, K) row's count of differing elements is Binomial(n, p(K)) for a known
curve p, which is the noise a real sweep's fraction has when its elements are independent.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from alibi.io.typed import from_plain, to_plain
from alibi.sweep.depth_fits import MODELS, DepthData, fit_depth

KS = tuple(512 * 2**i for i in range(7))  # the paper's grid, 512 … 32768
CURVES = {
    "gen_saturation": lambda K: 1 - math.exp(-0.0035 * K**0.52),
    "sqrt_saturation": lambda K: 1 - math.exp(-0.004 * K**0.5),
    "power": lambda K: 0.01 * K**0.35,
    "constant": lambda K: 0.05,
}


def binomial_rows(curve, rng: np.random.Generator, n: int = 2**16, seeds: int = 20, Ks=KS) -> DepthData:
    rows = [(s, K, int(rng.binomial(n, curve(K)))) for s in range(seeds) for K in Ks]
    seed, K, d = zip(*rows)
    return DepthData(seed, K, tuple(x / n for x in d), (n,) * len(rows), d)


def alpha_standard_error(c: float, alpha: float, n: int, seeds: int, Ks=KS) -> float:
    """Asymptotic SE of α for unweighted least squares on binomial fractions under 1 − exp(−c·K^α).

    Sandwich formula (JᵀJ)⁻¹ JᵀΣJ (JᵀJ)⁻¹ with J the Jacobian in (ln c, α) at the true parameters and
    Σ = diag(p(1−p)/n): computed from the design alone, independently of the fitting code.
    """
    K = np.array([k for _ in range(seeds) for k in Ks], dtype=float)
    x = c * K**alpha
    p = 1 - np.exp(-x)
    dp = np.exp(-x) * x  # ∂p/∂ln c; ∂p/∂α is this times ln K
    J = np.stack([dp, dp * np.log(K)], axis=1)
    bread = np.linalg.inv(J.T @ J)
    cov = bread @ (J.T * (p * (1 - p) / n)) @ J @ bread
    return float(math.sqrt(cov[1, 1]))


def test_generalized_saturation_fit_recovers_alpha_within_four_standard_errors():
    """Tolerance: 4 asymptotic standard errors of α for this design (n = 2¹⁶ elements, 20 seeds, 7 K),
    0.0022 here. A correct least-squares fit misses by more with probability ~6e-5; the SE itself is
    asserted below 0.001 so the tolerance is tight enough to catch a biased fit. The seed bootstrap
    must measure that same uncertainty: its CI90 half-width within a factor 2 of 1.645 SE (with 20
    seeds a bootstrap SE is itself uncertain by about 1/√(2·19) ≈ 16%)."""
    c, alpha, n = 0.0035, 0.52, 2**16
    se = alpha_standard_error(c, alpha, n, seeds=20)
    assert se < 0.001
    fits = fit_depth(binomial_rows(CURVES["gen_saturation"], np.random.default_rng(7), n=n), source="t",
                     label="t", bootstrap=200)
    gen = next(m for m in fits.models if m.model == "gen_saturation")
    assert abs(gen.params.alpha - alpha) <= 4 * se
    assert gen.params.c == pytest.approx(c, rel=40 * se)  # ln c moves with α: ∂ln c/∂α ≈ −ln K₀ ≈ −8.3
    st = fits.stability
    assert st.model == "gen_saturation"
    half_width = (st.alpha_ci.high - st.alpha_ci.low) / 2
    assert 0.5 < half_width / (1.645 * se) < 2
    assert st.bootstrap_b == 200 and st.bootstrap_seed == 0 and st.bootstrap_failed == 0


def test_power_law_fit_recovers_its_exponent():
    """Tolerance 0.01 on α: the fractions 0.09–0.38 at n = 2¹⁶ give α a standard error near 0.001
    (same sandwich argument as above); 0.01 is ten of them."""
    fits = fit_depth(binomial_rows(CURVES["power"], np.random.default_rng(3)), source="t", label="t", bootstrap=0)
    power = next(m for m in fits.models if m.model == "power")
    assert abs(power.params.alpha - 0.35) < 0.01
    assert power.params.c == pytest.approx(0.01, rel=0.1)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("rng_seed", [0, 1, 2])
def test_model_ranking_selects_the_generating_model(model, rng_seed):
    fits = fit_depth(binomial_rows(CURVES[model], np.random.default_rng(rng_seed), seeds=10), source="t", label="t",
                     bootstrap=0)
    assert fits.status == "ok"
    assert fits.selected == model, (fits.ranking, [(m.model, m.loko.mse) for m in fits.models if m.loko])


def test_sqrt_saturation_data_give_alpha_near_one_half_with_alpha_free():
    fits = fit_depth(binomial_rows(CURVES["sqrt_saturation"], np.random.default_rng(5)), source="t", label="t",
                     bootstrap=100)
    assert fits.selected == "sqrt_saturation"
    alt = fits.alpha_stability
    assert alt is not None and alt.model == "gen_saturation"
    assert alt.alpha_ci.low < 0.5 < alt.alpha_ci.high


def test_held_out_errors_cover_every_seed_and_every_k():
    data = binomial_rows(CURVES["gen_saturation"], np.random.default_rng(1), seeds=5)
    fits = fit_depth(data, source="t", label="t", bootstrap=0)
    for m in fits.models:
        assert m.loso.folds == 5 and m.loko.folds == len(KS)
        assert m.loko.rmse == pytest.approx(math.sqrt(m.loko.mse))
    # Leaving a K out makes the constant predict it from the others: its error is the spread of the
    # per-K means, far above the generalized saturation's noise-level error.
    const = next(m for m in fits.models if m.model == "constant")
    gen = next(m for m in fits.models if m.model == "gen_saturation")
    assert const.loko.mse > 100 * gen.loko.mse


def test_half_range_refits_use_disjoint_k_halves():
    fits = fit_depth(binomial_rows(CURVES["gen_saturation"], np.random.default_rng(2)), source="t", label="t",
                     bootstrap=0)
    lower, upper = fits.stability.lower_half, fits.stability.upper_half
    assert lower.Ks == (512, 1024, 2048) and upper.Ks == (8192, 16384, 32768)
    assert not set(lower.Ks) & set(upper.Ks)
    assert abs(lower.alpha - 0.52) < 0.05 and abs(upper.alpha - 0.52) < 0.05


def test_all_zero_fractions_get_a_status_and_no_fits():
    n = 2**19
    data = DepthData(tuple(s for s in range(3) for _ in KS), KS * 3, (0.0,) * 21, (n,) * 21, (0,) * 21)
    fits = fit_depth(data, source="t", label="INT8 x vs y")
    assert fits.status == "all-zero" and fits.models == () and fits.selected is None
    assert fits.counts.trend.status == "no-events" and fits.counts.homogeneity.status == "no-events"
    assert "compatible with 0" in fits.statement
    json.dumps(to_plain(fits), allow_nan=False)


def test_a_single_k_gets_a_status_and_no_nan():
    data = DepthData((0, 1, 2), (4096,) * 3, (0.1, 0.12, 0.11))
    fits = fit_depth(data, source="t", label="t")
    assert fits.status == "too-few-K" and fits.selected is None
    text = json.dumps(to_plain(fits), allow_nan=False)
    assert "NaN" not in text and "Infinity" not in text


def test_statement_says_compatible_with_and_never_law():
    fits = fit_depth(binomial_rows(CURVES["gen_saturation"], np.random.default_rng(0), seeds=4), source="t",
                     label="FP8 a vs b", bootstrap=50)
    assert "compatible with" in fits.statement
    assert "law" not in fits.statement.lower()


def test_constant_rate_counts_bound_the_trend_they_could_hide():
    """Counts at a constant 5 ppm: the trend test does not reject, and the factor interval contains 1."""
    rng = np.random.default_rng(11)
    n = 256 * 2048
    d = tuple(int(rng.binomial(n, 5e-6)) for _ in range(20) for _ in KS)
    data = DepthData(tuple(s for s in range(20) for _ in KS), KS * 20, tuple(x / n for x in d), (n,) * 140, d)
    fits = fit_depth(data, source="t", label="INT8", bootstrap=0)
    trend = fits.counts.trend
    assert trend.factor_low < 1 < trend.factor_high
    assert trend.p_value > 0.01
    assert fits.counts.homogeneity.p_exact > 0.01


def test_depth_fits_round_trip_through_plain_json():
    from alibi.sweep.depth_fits import DepthFits

    fits = fit_depth(binomial_rows(CURVES["power"], np.random.default_rng(4), seeds=3), source="t", label="t",
                     bootstrap=20)
    back = from_plain(DepthFits, json.loads(json.dumps(to_plain(fits))), "fits")
    assert back == fits
