"""Rates of rare events (differing output elements) across groups: exact CIs, homogeneity, trend, ratio bounds.

The setting: group i (one K of a depth sweep, one M of a rows sweep) has `events[i]` differing
elements out of `exposure[i]` compared elements. Elements are treated as independent Bernoulli
trials with a per-element rate `r_i`; at parts per million, Poisson(`r_i·exposure[i]`) is the
same model. What each function answers:

* `binomial_rate`: `r_i` with an exact (Clopper–Pearson) interval — `scipy.stats.binomtest`.
* `homogeneity`: is `r_i` the same for every group? Pearson χ² and the likelihood-ratio G statistic
  of the 2×k table (`scipy.stats.chi2_contingency`), whose χ² reference distribution is poor when
  expected counts are small, so also an exact conditional p-value: given the total, the counts are
  multinomial with probabilities ∝ exposure under the null, and the p-value is the Monte-Carlo share
  of multinomial draws whose Pearson statistic reaches the observed one (seed and draws recorded).
* `poisson_trend`: a log-linear trend `r ∝ x^b` in a covariate x (K or M), by Poisson maximum
  likelihood; the likelihood-ratio test of `b = 0`, the profile-likelihood interval of `b`, and the
  factor `(x_max/x_min)^b` by which the rate could change across the measured range and still be
  compatible with the counts — the trend these counts cannot exclude.
* `ratio_bound`: the largest ratio between the rates of any two groups compatible with the counts,
  from the exact conditional binomial interval of each pair, Bonferroni-adjusted over the pairs so
  the bound holds for all pairs at once.

Every result is a frozen dataclass whose `status` says when a quantity cannot be estimated (no events,
one group, a bound outside the searched range); such fields are None, never NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import combinations

import numpy as np

# Trend exponents searched: |b| ≤ 8 means a rate changing by 8 bits per doubling of x; a bound
# that needs more is reported as unbounded.
EXPONENT_SEARCH = 8.0
MONTE_CARLO_DRAWS = 20000


@dataclass(frozen=True)
class BinomialRate:
    """`events` of `exposure` trials: the rate and its exact two-sided interval at `level`."""

    events: int
    exposure: int
    rate: float
    low: float
    high: float
    level: float


def binomial_rate(events: int, exposure: int, level: float = 0.95) -> BinomialRate:
    """Clopper–Pearson interval (`binomtest(...).proportion_ci(method="exact")`)."""
    # deferred: keeps scipy out of start-up
    from scipy.stats import binomtest

    if exposure < 1 or not 0 <= events <= exposure:
        raise ValueError(f"need 0 ≤ events ≤ exposure and exposure ≥ 1, got {events} of {exposure}")
    ci = binomtest(int(events), int(exposure)).proportion_ci(confidence_level=level, method="exact")
    return BinomialRate(int(events), int(exposure), events / exposure, float(ci.low), float(ci.high), level)


@dataclass(frozen=True)
class Homogeneity:
    """Test of one common rate across groups.

    status: `ok`, `no-events` (nothing to compare: every count is 0) or `one-group`;
    chi2/dof/p_chi2: Pearson χ² of the 2×k table; g/p_g: the likelihood-ratio (Poisson deviance)
    statistic; min_expected: the smallest expected count under the null (χ² p-values are
    unreliable below about 5); p_exact: Monte-Carlo exact conditional p-value of the Pearson
    statistic (`draws` multinomial draws from `numpy.random.default_rng(seed)`).
    """

    status: str
    groups: int
    chi2: float | None = None
    dof: int | None = None
    p_chi2: float | None = None
    g: float | None = None
    p_g: float | None = None
    min_expected: float | None = None
    p_exact: float | None = None
    draws: int | None = None
    seed: int | None = None


def _pearson(counts: np.ndarray, expected: np.ndarray, exposure: np.ndarray) -> np.ndarray:
    """Pearson χ² of the 2×k table [events, exposure − events] for each row of `counts`."""
    non = exposure - counts
    exp_non = exposure - expected
    return ((counts - expected) ** 2 / expected + (non - exp_non) ** 2 / exp_non).sum(axis=-1)


def homogeneity(events: list[int], exposure: list[int], seed: int = 0,
                draws: int = MONTE_CARLO_DRAWS) -> Homogeneity:
    # deferred: keeps scipy out of start-up
    from scipy.stats import chi2_contingency

    d = np.asarray(events, dtype=np.int64)
    e = np.asarray(exposure, dtype=np.int64)
    if len(d) < 2:
        return Homogeneity("one-group", len(d))
    total = int(d.sum())
    if total == 0:
        return Homogeneity("no-events", len(d))
    table = np.stack([d, e - d])
    pearson = chi2_contingency(table, correction=False)
    g_test = chi2_contingency(table, correction=False, lambda_="log-likelihood")
    probs = e / e.sum()
    expected = total * probs
    rng = np.random.default_rng(seed)
    sims = rng.multinomial(total, probs, size=draws)
    observed = float(_pearson(d.astype(float), expected, e.astype(float)))
    simulated = _pearson(sims.astype(float), expected, e.astype(float))
    # The same statistic evaluated identically on observed and simulated tables; a tiny relative
    # slack keeps ties (common with small counts) counted as "at least as extreme".
    p_exact = (1 + int((simulated >= observed * (1 - 1e-12)).sum())) / (1 + draws)
    return Homogeneity("ok", len(d), float(pearson.statistic), int(pearson.dof), float(pearson.pvalue),
                       float(g_test.statistic), float(g_test.pvalue), float(expected.min()), p_exact, draws, seed)


@dataclass(frozen=True)
class PoissonTrend:
    """Log-linear trend `rate ∝ x^exponent` over groups at covariate values x (K or M).

    status: `ok`, `no-events`, `one-point` (a single distinct x), or `ok` with an unbounded side
    (exponent_low/high None: the interval reaches the searched |b| ≤ 8); p_value: likelihood-ratio
    test of exponent 0 (a constant rate); factor*: `(x_max/x_min)^b` at the estimate and at the
    interval's ends — how much the rate may change across the range and stay compatible.
    """

    status: str
    covariate: str
    x_min: float
    x_max: float
    level: float
    exponent: float | None = None
    exponent_low: float | None = None
    exponent_high: float | None = None
    p_value: float | None = None
    factor: float | None = None
    factor_low: float | None = None
    factor_high: float | None = None


def poisson_trend(x: list[float], events: list[int], exposure: list[int], covariate: str,
                  level: float = 0.90) -> PoissonTrend:
    """Poisson MLE of `log r = a + b·ln x`; profile likelihood in b (a eliminated in closed form).

    For fixed b the likelihood is maximized at `e^a = ΣD / Σ E·x^b`, so the profile log-likelihood
    is `ℓ(b) = ΣD·ln(ΣD / Σ E·e^{b z}) + b·ΣD·z` (z = ln x centered, constants dropped), a concave
    function of b: its maximum and the two roots of `2(ℓ_max − ℓ(b)) = χ²₁(level)` are found with
    scipy's scalar minimizer and brentq.
    """
    # deferred: keeps scipy out of start-up
    from scipy.optimize import brentq, minimize_scalar
    from scipy.stats import chi2

    xs = np.asarray(x, dtype=float)
    d = np.asarray(events, dtype=float)
    e = np.asarray(exposure, dtype=float)
    base = PoissonTrend("ok", covariate, float(xs.min()), float(xs.max()), level)
    if len(set(xs.tolist())) < 2:
        return replace(base, status="one-point")
    total = d.sum()
    if total == 0:
        return replace(base, status="no-events")
    z = np.log(xs) - np.log(xs).mean()
    span = math.log(xs.max() / xs.min())

    def profile(b: float) -> float:
        w = np.log(e) + b * z
        m = w.max()
        return float(total * (math.log(total) - (m + math.log(np.exp(w - m).sum()))) + b * (d * z).sum())

    best = minimize_scalar(lambda b: -profile(b), bounds=(-EXPONENT_SEARCH, EXPONENT_SEARCH), method="bounded",
                           options={"xatol": 1e-10})
    b_hat = float(best.x)
    l_max = profile(b_hat)
    cut = chi2.ppf(level, 1) / 2

    def excess(b: float) -> float:
        return (l_max - profile(b)) - cut

    low = brentq(excess, -EXPONENT_SEARCH, b_hat, xtol=1e-12) if excess(-EXPONENT_SEARCH) > 0 else None
    high = brentq(excess, b_hat, EXPONENT_SEARCH, xtol=1e-12) if excess(EXPONENT_SEARCH) > 0 else None
    lr = max(0.0, 2 * (l_max - profile(0.0)))
    at_edge = abs(b_hat) > EXPONENT_SEARCH - 1e-6
    return replace(base, status="ok" if not at_edge else "exponent-at-search-bound",
                    exponent=None if at_edge else b_hat, exponent_low=low, exponent_high=high,
                    p_value=float(chi2.sf(lr, 1)), factor=None if at_edge else math.exp(b_hat * span),
                    factor_low=None if low is None else math.exp(low * span),
                    factor_high=None if high is None else math.exp(high * span))


@dataclass(frozen=True)
class RatioBound:
    """The largest ratio between two groups' rates compatible with the counts, simultaneously over all pairs.

    status: `ok`, `no-events`, `one-group`, or `unbounded` (some pair has a zero count or no events,
    so its ratio has no finite bound); pair_level: the per-pair exact level after Bonferroni
    (1 − (1 − level)/pairs); max_ratio: the bound (≥ 1, direction-free); pair: the two x values
    attaining it.
    """

    status: str
    level: float
    pairs: int
    pair_level: float
    max_ratio: float | None = None
    pair: tuple[float, float] | None = None


def ratio_bound(x: list[float], events: list[int], exposure: list[int], level: float = 0.90) -> RatioBound:
    """For a pair (i, j), given D_i + D_j the count D_i is Binomial(D_i + D_j, p) with
    p = r_i E_i / (r_i E_i + r_j E_j); the exact interval of p maps to one of r_i / r_j."""
    # deferred: keeps scipy out of start-up
    from scipy.stats import binomtest

    n_pairs = len(x) * (len(x) - 1) // 2
    pair_level = 1 - (1 - level) / max(n_pairs, 1)
    base = RatioBound("ok", level, n_pairs, pair_level)
    if len(x) < 2:
        return replace(base, status="one-group")
    if sum(events) == 0:
        return replace(base, status="no-events")
    worst, worst_pair = 1.0, None
    for i, j in combinations(range(len(x)), 2):
        di, dj = int(events[i]), int(events[j])
        if di == 0 or dj == 0:
            return replace(base, status="unbounded")
        ci = binomtest(di, di + dj).proportion_ci(confidence_level=pair_level, method="exact")
        scale = exposure[j] / exposure[i]
        lo = ci.low / (1 - ci.low) * scale
        hi = ci.high / (1 - ci.high) * scale
        ratio = max(hi, 1 / lo)
        if ratio > worst:
            worst, worst_pair = ratio, (float(x[i]), float(x[j]))
    return replace(base, max_ratio=float(worst), pair=worst_pair)
