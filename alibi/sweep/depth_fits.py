"""Fits of the fraction of differing outputs against the reduction depth K (`alibi analyze depth`).

Data: one row per (seed, K) with the fraction `f` of output elements that differ bitwise between
two kernels (and, when known, the counts behind it). Four models, all fitted under one objective —
least squares on the fraction, every row kept (no averaging over seeds first):

    constant          f = c
    power             f = c·K^α
    sqrt_saturation   f = 1 − exp(−c·√K)
    gen_saturation    f = 1 − exp(−c·K^α)          (α free)

The fits run on `u = K/K₀` (K₀ the geometric mean of the distinct K) with the scale as `ln b`,
`b = c·K₀^α`, so that the parameters are of order one for `scipy.optimize.least_squares`; `c` is
reported in the units of K. Each model is refitted on held-out splits — leave-one-seed-out (LOSO:
does the curve predict a new seed?) and leave-one-K-out (LOKO: does the curve's *shape* predict a K
it has not seen, the ends included?). Models are ranked by LOKO mean squared error; the selected
model is the simplest one within one standard error (over the K folds) of the lowest, the usual
one-standard-error rule, so that a model with an extra parameter has to earn it on held-out data.

For the selected model (and, if it has no free α, for the best-ranked model that has one) the
exponent's stability: a seed bootstrap (seeds resampled with replacement, B and the generator seed
recorded) with a percentile CI90 and a pointwise band for the curve; a seed jackknife; the range of
α over leave-one-K-out refits; refits on the disjoint lower and upper halves of the K range.

With counts (INT8 sweeps, or any input giving `n` and `n_differing`): per-K pooled rates with exact
intervals, homogeneity across K (χ², G, exact conditional) and the Poisson trend in K with the
factor of change across the K range that the counts cannot exclude (`alibi.sweep.rates`).

Every statement says "compatible with"; a fit is a description of these data, not a law. Degenerate
input gets a status, never NaN: `all-zero` (no differing element anywhere), `too-few-K` (fewer
than 3 distinct K: no shape can be told from another), and per model `failed` if scipy gives up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from alibi.sweep.rates import (
    BinomialRate,
    Homogeneity,
    PoissonTrend,
    binomial_rate,
    homogeneity,
    poisson_trend,
)

MODELS: tuple[str, ...] = ("constant", "power", "sqrt_saturation", "gen_saturation")
FORMULAS = {"constant": "c", "power": "c·K^α", "sqrt_saturation": "1 − exp(−c·√K)",
            "gen_saturation": "1 − exp(−c·K^α)"}
N_PARAMS = {"constant": 1, "power": 2, "sqrt_saturation": 1, "gen_saturation": 2}
FREE_ALPHA = {"power", "gen_saturation"}
ALPHA_BOUNDS = (-4.0, 4.0)
AT_BOUND = 1e-3  # an exponent this close to ALPHA_BOUNDS is the optimizer pressing on the box, not an estimate
LOG_B_BOUNDS = (-80.0, 30.0)
MIN_DISTINCT_K = 3
BAND_POINTS = 41
LEVEL = 0.90


# --- data -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DepthData:
    """Rows (seed, K, frac_differ) and optionally the counts `n` (elements) and `n_differing`."""

    seed: tuple[int, ...]
    K: tuple[int, ...]
    frac: tuple[float, ...]
    n: tuple[int, ...] | None = None
    n_differing: tuple[int, ...] | None = None

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return np.asarray(self.seed), np.asarray(self.K, dtype=float), np.asarray(self.frac, dtype=float)


# --- models ---------------------------------------------------------------------------------------

def _predict(model: str, theta: np.ndarray, u: np.ndarray) -> np.ndarray:
    if model == "constant":
        return np.full_like(u, theta[0])
    b = math.exp(theta[0])
    if model == "power":
        return b * u ** theta[1]
    if model == "sqrt_saturation":
        return -np.expm1(-b * np.sqrt(u))
    return -np.expm1(-b * u ** theta[1])


def _starts(model: str, u: np.ndarray, f: np.ndarray) -> list[np.ndarray]:
    """Starting points: a log-log regression on the linearized model where the data allow, plus a grid."""
    pos = f > 0
    mean = float(f.mean()) if f.size else 0.0
    if model == "sqrt_saturation":
        ok = pos & (f < 1)
        y = -np.log1p(-f[ok]) / np.sqrt(u[ok]) if ok.any() else np.array([max(mean, 1e-12)])
        return [np.array([math.log(max(float(np.median(y)), 1e-30))])]
    lin = -np.log1p(-np.clip(f, 0, 1 - 1e-12)) if model == "gen_saturation" else f
    starts = []
    ok = (lin > 0) & np.isfinite(lin)
    if ok.sum() >= 2 and len(set(u[ok].tolist())) >= 2:
        slope, intercept = np.polyfit(np.log(u[ok]), np.log(lin[ok]), 1)
        starts.append(np.array([intercept, float(np.clip(slope, *ALPHA_BOUNDS))]))
    level = math.log(max(float(lin[ok].mean()) if ok.any() else mean, 1e-30))
    starts += [np.array([level, a]) for a in (0.0, 0.5, 1.0)]
    return starts


@dataclass(frozen=True)
class _Fit:
    theta: np.ndarray
    sse: float


def _fit(model: str, u: np.ndarray, f: np.ndarray, starts: list[np.ndarray]) -> _Fit | None:
    """Least squares on the fraction; None if no start converges to finite parameters."""
    if model == "constant":
        c = float(f.mean())
        return _Fit(np.array([c]), float(((f - c) ** 2).sum()))
    # deferred: keeps scipy out of start-up
    from scipy.optimize import least_squares

    lo = [LOG_B_BOUNDS[0]] + ([ALPHA_BOUNDS[0]] if N_PARAMS[model] == 2 else [])
    hi = [LOG_B_BOUNDS[1]] + ([ALPHA_BOUNDS[1]] if N_PARAMS[model] == 2 else [])
    best: _Fit | None = None
    for x0 in starts:
        x0 = np.clip(np.asarray(x0, dtype=float), np.array(lo) + 1e-9, np.array(hi) - 1e-9)
        try:
            sol = least_squares(lambda th: _predict(model, th, u) - f, x0, bounds=(lo, hi), method="trf",
                                x_scale="jac", ftol=1e-13, xtol=1e-13, gtol=1e-13, max_nfev=4000)
        except (ValueError, FloatingPointError):
            continue
        if not np.all(np.isfinite(sol.x)):
            continue
        sse = float((sol.fun ** 2).sum())
        if math.isfinite(sse) and (best is None or sse < best.sse):
            best = _Fit(sol.x.copy(), sse)
    return best


@dataclass(frozen=True)
class Params:
    """A model's parameters in the units of K: `c` and `α` (None for the constant; 0.5 and not
    free for the square-root saturation)."""

    c: float
    alpha: float | None
    alpha_free: bool


def _params(model: str, theta: np.ndarray, K0: float) -> Params:
    if model == "constant":
        return Params(float(theta[0]), None, False)
    alpha = 0.5 if model == "sqrt_saturation" else float(theta[1])
    return Params(math.exp(theta[0] - alpha * math.log(K0)), alpha, model in FREE_ALPHA)


# --- held-out error -------------------------------------------------------------------------------

@dataclass(frozen=True)
class HeldOut:
    """Held-out error of one model over one split: `mse` pooled over every held-out row, `rmse`,
    and `fold_se` the standard error of the mean over folds (None with one fold)."""

    split: str
    folds: int
    mse: float
    rmse: float
    fold_se: float | None


def _held_out(model: str, u: np.ndarray, f: np.ndarray, groups: np.ndarray, split: str,
              warm: np.ndarray) -> HeldOut | None:
    keys = sorted(set(groups.tolist()))
    if len(keys) < 2:
        return None
    sq = np.empty_like(f)
    fold_mse = []
    for key in keys:
        test = groups == key
        train = ~test
        if split == "leave-one-K-out" and len(set(u[train].tolist())) < N_PARAMS[model]:
            return None
        fit = _fit(model, u[train], f[train], [warm, *_starts(model, u[train], f[train])])
        if fit is None:
            return None
        err = (_predict(model, fit.theta, u[test]) - f[test]) ** 2
        sq[test] = err
        fold_mse.append(float(err.mean()))
    mse = float(sq.mean())
    se = float(np.std(fold_mse, ddof=1) / math.sqrt(len(fold_mse))) if len(fold_mse) > 1 else None
    return HeldOut(split, len(keys), mse, math.sqrt(mse), se)


@dataclass(frozen=True)
class ModelFit:
    """One model on all rows: status `ok` or `failed`; params; in-sample `rmse`; held-out errors;
    `rank` by leave-one-K-out error (1 = lowest); `within_one_se` of the lowest."""

    model: str
    formula: str
    n_params: int
    status: str
    params: Params | None = None
    rmse: float | None = None
    loso: HeldOut | None = None
    loko: HeldOut | None = None
    rank: int | None = None
    within_one_se: bool | None = None
    alpha_at_bound: bool | None = None


# --- stability of the exponent ------------------------------------------------------------------

@dataclass(frozen=True)
class Interval:
    low: float
    high: float


@dataclass(frozen=True)
class HalfRefit:
    """A refit on one half of the K range: the K values used and α there (None if the fit failed)."""

    Ks: tuple[int, ...]
    alpha: float | None
    c: float | None


@dataclass(frozen=True)
class Stability:
    """How firmly the data pin one model's parameters.

    bootstrap_*: percentile CI at `level` over `bootstrap_b` seed resamples drawn by
    `numpy.random.default_rng(bootstrap_seed)` (`bootstrap_failed` refits failed and are left out);
    jackknife_*: leave-one-seed-out α values (mean, standard error √((n−1)/n·Σ(αᵢ−ᾱ)²), range);
    loko_alpha: range of α over leave-one-K-out refits; lower_half / upper_half: refits on the
    disjoint lower and upper halves of the distinct K (the middle K left out when their number is
    odd); band_*: the pointwise bootstrap band of the curve on `band_K` (level as above).
    Fields are None where the design does not allow them (one seed: no bootstrap or jackknife).
    """

    model: str
    status: str
    level: float
    alpha: float | None
    c: float
    bootstrap_b: int
    bootstrap_seed: int
    bootstrap_failed: int
    alpha_ci: Interval | None = None
    c_ci: Interval | None = None
    jackknife_mean: float | None = None
    jackknife_se: float | None = None
    jackknife_range: Interval | None = None
    loko_alpha: Interval | None = None
    lower_half: HalfRefit | None = None
    upper_half: HalfRefit | None = None
    band_K: tuple[float, ...] = ()
    band_low: tuple[float, ...] = ()
    band_mid: tuple[float, ...] = ()
    band_high: tuple[float, ...] = ()


def _interval(values: list[float], level: float) -> Interval | None:
    if not values:
        return None
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return Interval(float(lo), float(hi))


def _stability(model: str, seeds: np.ndarray, u: np.ndarray, f: np.ndarray, K0: float, theta: np.ndarray,
               B: int, boot_seed: int, level: float) -> Stability:
    p = _params(model, theta, K0)
    distinct_seeds = sorted(set(seeds.tolist()))
    out = Stability(model, "ok", level, p.alpha if p.alpha_free else None, p.c, B, boot_seed, 0)
    grid = np.geomspace(u.min(), u.max(), BAND_POINTS)
    mid = _predict(model, theta, grid)

    def refit(mask: np.ndarray) -> np.ndarray | None:
        fit = _fit(model, u[mask], f[mask], [theta])
        return None if fit is None else fit.theta

    # Seed bootstrap: resample seeds, keep every row of each drawn seed (rows of a seed are not
    # independent of each other under nested prefixes: the seed is the unit).
    rows_of = {s: np.flatnonzero(seeds == s) for s in distinct_seeds}
    alphas, cs, curves, failed = [], [], [], 0
    if len(distinct_seeds) >= 2 and B > 0:
        rng = np.random.default_rng(boot_seed)
        for _ in range(B):
            pick = rng.choice(distinct_seeds, size=len(distinct_seeds), replace=True)
            idx = np.concatenate([rows_of[s] for s in pick])
            fit = _fit(model, u[idx], f[idx], [theta])
            if fit is None:
                failed += 1
                continue
            q = _params(model, fit.theta, K0)
            cs.append(q.c)
            if q.alpha_free:
                alphas.append(q.alpha)
            curves.append(_predict(model, fit.theta, grid))
        band = np.quantile(np.array(curves), [(1 - level) / 2, (1 + level) / 2], axis=0) if curves else None
        out = replace(out, bootstrap_failed=failed, alpha_ci=_interval(alphas, level), c_ci=_interval(cs, level),
                      band_K=tuple(float(g * K0) for g in grid), band_mid=tuple(float(v) for v in mid),
                      band_low=() if band is None else tuple(float(v) for v in band[0]),
                      band_high=() if band is None else tuple(float(v) for v in band[1]))
    else:
        out = replace(out, status="one seed: no bootstrap or jackknife",
                      band_K=tuple(float(g * K0) for g in grid), band_mid=tuple(float(v) for v in mid))
    if not p.alpha_free:
        return out
    if len(distinct_seeds) >= 2:
        jack = [t for s in distinct_seeds if (t := refit(seeds != s)) is not None]
        ja = np.array([_params(model, t, K0).alpha for t in jack])
        if len(ja):
            n = len(ja)
            out = replace(out, jackknife_mean=float(ja.mean()),
                          jackknife_se=float(math.sqrt((n - 1) / n * ((ja - ja.mean()) ** 2).sum())),
                          jackknife_range=Interval(float(ja.min()), float(ja.max())))
    distinct_u = sorted(set(u.tolist()))
    loko = [t for k in distinct_u if len(distinct_u) > 2 and (t := refit(u != k)) is not None]
    if loko:
        la = [_params(model, t, K0).alpha for t in loko]
        out = replace(out, loko_alpha=Interval(float(min(la)), float(max(la))))
    half = len(distinct_u) // 2
    if half >= N_PARAMS[model]:
        def half_refit(keep: list[float]) -> HalfRefit:
            mask = np.isin(u, keep)
            t = _fit(model, u[mask], f[mask], [theta, *_starts(model, u[mask], f[mask])])
            q = None if t is None else _params(model, t.theta, K0)
            return HalfRefit(tuple(round(k * K0) for k in keep), None if q is None else q.alpha,
                             None if q is None else q.c)
        out = replace(out, lower_half=half_refit(distinct_u[:half]), upper_half=half_refit(distinct_u[-half:]))
    return out


# --- counts ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KSummary:
    """One K over all seeds: seeds, mean/min/max fraction, and (with counts) the pooled rate."""

    K: int
    seeds: int
    frac_mean: float
    frac_min: float
    frac_max: float
    pooled: BinomialRate | None = None


@dataclass(frozen=True)
class CountTests:
    """Constant-rate tests on the pooled counts per K (see `alibi.sweep.rates`)."""

    total_events: int
    total_elements: int
    homogeneity: Homogeneity
    trend: PoissonTrend


# --- the analysis ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class DepthFits:
    """Fits of one sweep. `source`/`label`: where the rows came from and a display name; `format`,
    `kernel_a`, `kernel_b` when known (None from a bare CSV); `status`: `ok`, `all-zero` or
    `too-few-K`; `K0`: the normalizing K; `models` in MODELS order; `ranking`: model names by
    leave-one-K-out error; `selected`: the one-standard-error choice; `stability` for the selected
    model and, when it has no free α, `alpha_stability` for the best-ranked model with one;
    `per_k`; `counts` (None without counts); `statement`: one sentence of the result."""

    source: str
    label: str
    format: str | None
    kernel_a: str | None
    kernel_b: str | None
    status: str
    rows: int
    seeds: int
    Ks: tuple[int, ...]
    K0: float
    criterion: str
    models: tuple[ModelFit, ...]
    ranking: tuple[str, ...]
    selected: str | None
    stability: Stability | None
    alpha_stability: Stability | None
    per_k: tuple[KSummary, ...]
    counts: CountTests | None
    statement: str


CRITERION = ("leave-one-K-out mean squared error; selected: the fewest parameters within one standard "
             "error (over K folds) of the lowest")


def fit_depth(data: DepthData, *, source: str, label: str, format: str | None = None,
              kernel_a: str | None = None, kernel_b: str | None = None, bootstrap: int = 1000,
              bootstrap_seed: int = 0, level: float = LEVEL) -> DepthFits:
    """The whole analysis of one sweep (see the module docstring)."""
    seeds, K, f = data.arrays()
    Ks = tuple(sorted({int(k) for k in data.K}))
    K0 = float(math.exp(np.log(np.array(Ks, dtype=float)).mean()))
    u = K / K0
    per_k = _per_k(data, Ks, level=0.95)
    counts = _count_tests(data, Ks)
    base = DepthFits(source, label, format, kernel_a, kernel_b, "ok", len(f), len(set(seeds.tolist())), Ks, K0,
                     CRITERION, (), (), None, None, None, per_k, counts, "")
    if not (f > 0).any():
        return replace(base, status="all-zero", statement=_statement(replace(base, status="all-zero")))
    if len(Ks) < MIN_DISTINCT_K:
        out = replace(base, status="too-few-K")
        return replace(out, statement=_statement(out))

    fits: dict[str, ModelFit] = {}
    thetas: dict[str, np.ndarray] = {}
    for model in MODELS:
        fit = _fit(model, u, f, _starts(model, u, f))
        if fit is None:
            fits[model] = ModelFit(model, FORMULAS[model], N_PARAMS[model], "failed")
            continue
        thetas[model] = fit.theta
        loso = _held_out(model, u, f, seeds, "leave-one-seed-out", fit.theta)
        loko = _held_out(model, u, f, K, "leave-one-K-out", fit.theta)
        at_bound = bool(model in FREE_ALPHA and
                        min(abs(fit.theta[1] - ALPHA_BOUNDS[0]), abs(fit.theta[1] - ALPHA_BOUNDS[1])) < AT_BOUND)
        fits[model] = ModelFit(model, FORMULAS[model], N_PARAMS[model], "ok", _params(model, fit.theta, K0),
                               math.sqrt(fit.sse / len(f)), loso, loko,
                               alpha_at_bound=at_bound if model in FREE_ALPHA else None)
    ranked = sorted((m for m in MODELS if fits[m].status == "ok" and fits[m].loko is not None),
                    key=lambda m: (fits[m].loko.mse, N_PARAMS[m]))  # type: ignore[union-attr]
    selected = None
    if ranked:
        top = fits[ranked[0]].loko
        cutoff = top.mse + (top.fold_se or 0.0)  # type: ignore[union-attr]
        eligible = [m for m in ranked if fits[m].loko.mse <= cutoff]  # type: ignore[union-attr]
        selected = min(eligible, key=lambda m: (N_PARAMS[m], fits[m].loko.mse))  # type: ignore[union-attr]
        for i, m in enumerate(ranked, 1):
            fits[m] = replace(fits[m], rank=i, within_one_se=m in eligible)
    stability = alpha_stability = None
    if selected is not None:
        stability = _stability(selected, seeds, u, f, K0, thetas[selected], bootstrap, bootstrap_seed, level)
        if selected not in FREE_ALPHA:
            alt = next((m for m in ranked if m in FREE_ALPHA and not fits[m].alpha_at_bound), None)
            if alt is not None:
                alpha_stability = _stability(alt, seeds, u, f, K0, thetas[alt], bootstrap, bootstrap_seed, level)
    out = replace(base, models=tuple(fits[m] for m in MODELS), ranking=tuple(ranked), selected=selected,
                  stability=stability, alpha_stability=alpha_stability)
    return replace(out, statement=_statement(out))


def _per_k(data: DepthData, Ks: tuple[int, ...], level: float) -> tuple[KSummary, ...]:
    K = np.asarray(data.K)
    f = np.asarray(data.frac, dtype=float)
    out = []
    for k in Ks:
        sel = K == k
        pooled = None
        if data.n is not None and data.n_differing is not None:
            pooled = binomial_rate(int(np.asarray(data.n_differing)[sel].sum()), int(np.asarray(data.n)[sel].sum()),
                                   level)
        out.append(KSummary(k, int(sel.sum()), float(f[sel].mean()), float(f[sel].min()), float(f[sel].max()),
                            pooled))
    return tuple(out)


def _count_tests(data: DepthData, Ks: tuple[int, ...]) -> CountTests | None:
    if data.n is None or data.n_differing is None:
        return None
    K = np.asarray(data.K)
    d = [int(np.asarray(data.n_differing)[K == k].sum()) for k in Ks]
    e = [int(np.asarray(data.n)[K == k].sum()) for k in Ks]
    return CountTests(sum(d), sum(e), homogeneity(d, e), poisson_trend([float(k) for k in Ks], d, e, "K", LEVEL))


def _fmt(x: float | None, digits: int = 4) -> str:
    return "–" if x is None else f"{x:.{digits}g}"


def format_p(p: float | None) -> str:
    """A p-value with its relation for text: `p = 0.277`, or `p < 1e-16` where doubles underflow."""
    return "p –" if p is None else ("p < 1e-16" if p < 1e-16 else f"p = {p:.3g}")


def _statement(fits: DepthFits) -> str:
    """One sentence; says "compatible with" and never claims a law."""
    who = fits.label
    if fits.status == "all-zero":
        s = f"{who}: no differing element in {fits.rows} rows"
        if fits.counts is not None:
            ub = binomial_rate(0, fits.counts.total_elements, 0.95).high
            s += f" ({fits.counts.total_elements} elements; rate compatible with 0, 95% upper bound {ub:.3g})"
        return s + "; no curve is fitted."
    if fits.status == "too-few-K":
        return f"{who}: {len(fits.Ks)} distinct K — fewer than {MIN_DISTINCT_K}, so no curve shape can be told from another."
    parts = []
    if fits.selected is not None:
        m = next(x for x in fits.models if x.model == fits.selected)
        st = fits.stability
        desc = f"{who}: the fraction differing is compatible with {m.formula}"
        if m.alpha_at_bound:
            desc += f" (its exponent sits on the search bound {ALPHA_BOUNDS}: a boundary, not an estimate)"
        elif m.params is not None and m.params.alpha_free and st is not None:
            ci = st.alpha_ci
            desc += (f", α = {m.params.alpha:.4f}" +
                     (f" (seed-bootstrap CI90 [{ci.low:.4f}, {ci.high:.4f}], B = {st.bootstrap_b})" if ci else ""))
        elif m.params is not None:
            desc += f", c = {m.params.c:.4g}"
        lowest = fits.ranking[0]
        if lowest == fits.selected:
            desc += f" (lowest held-out error of {len(fits.ranking)} models)"
        else:
            desc += (f" (the simplest model within one standard error of the lowest held-out error, that of "
                     f"{FORMULAS[lowest]})")
        parts.append(desc)
        if fits.alpha_stability is not None and fits.alpha_stability.alpha_ci is not None:
            a = fits.alpha_stability
            parts.append(f"with α free, {FORMULAS[a.model]} gives α = {a.alpha:.4f} "
                         f"(CI90 [{a.alpha_ci.low:.4f}, {a.alpha_ci.high:.4f}])")
    if fits.counts is not None and fits.counts.trend.status.startswith("ok"):
        t = fits.counts.trend
        span = f"K = {fits.Ks[0]}…{fits.Ks[-1]}"
        if t.factor_low is not None and t.factor_high is not None:
            parts.append(f"the counts are compatible with a rate changing by a factor between {t.factor_low:.3g} and "
                         f"{t.factor_high:.3g} over {span} (90%; constant-rate trend {format_p(t.p_value)}, "
                         f"χ² {format_p(fits.counts.homogeneity.p_chi2)})")
    return "; ".join(parts) + "."
