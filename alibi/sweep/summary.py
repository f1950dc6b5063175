"""fits.md: the Markdown rendering of a `DepthAnalysis` (every number read from the typed result)."""

from __future__ import annotations

from alibi.sweep.analysis import DepthAnalysis
from alibi.sweep.depth_fits import CRITERION, DepthFits, Stability, format_p
from alibi.sweep.rates import Homogeneity, PoissonTrend
from alibi.sweep.records import RowsSweep


def _g(x: float | None, digits: int = 4) -> str:
    return "–" if x is None else f"{x:.{digits}g}"


def _ci(iv) -> str:
    return "–" if iv is None else f"[{iv.low:.4f}, {iv.high:.4f}]"


def fits_markdown(analysis: DepthAnalysis) -> str:
    lines = ["# Depth fits", "",
             (f"Least squares on the fraction differing, every (seed, K) row kept. Models ranked by {CRITERION}. "
             f"Seed bootstrap: B = {analysis.bootstrap}, generator seed {analysis.bootstrap_seed}, "
             f"level {analysis.level:.0%}. Results say which curves the data are *compatible with*; none is "
             "claimed to hold beyond the measured range."), ""]
    for fits in analysis.analyses:
        lines += _sweep(fits)
    if analysis.rows is not None:
        lines += _rows(analysis.rows, analysis.rows_source)
    return "\n".join(lines).rstrip() + "\n"


def _sweep(f: DepthFits) -> list[str]:
    out = [f"## {f.label}", "", (f"Source `{f.source}`; {f.rows} rows, {f.seeds} seeds, K = {', '.join(map(str, f.Ks))}; "
           f"status **{f.status}**."), "", f"> {f.statement}", ""]
    if f.models:
        out += ["| model | formula | c | α | RMSE | LOSO RMSE | LOKO RMSE | rank | within 1 SE |",
                "|---|---|---|---|---|---|---|---|---|"]
        for m in f.models:
            p = m.params
            alpha = "–" if p is None or p.alpha is None else (f"{p.alpha:.4f}" if p.alpha_free else f"{p.alpha:g} (fixed)")
            sel = " **(selected)**" if m.model == f.selected else ""
            out.append(f"| {m.model}{sel} | {m.formula} | {_g(None if p is None else p.c)} | {alpha} | {_g(m.rmse)} | "
                       f"{_g(None if m.loso is None else m.loso.rmse)} | {_g(None if m.loko is None else m.loko.rmse)} | "
                       f"{m.rank or '–'} | {'yes' if m.within_one_se else ('no' if m.within_one_se is False else '–')} |")
        out.append("")
    for st in (f.stability, f.alpha_stability):
        if st is not None:
            out += _stability(st)
    out += ["| K | seeds | mean fraction | min | max | pooled differing / elements | pooled rate (exact 95% CI) |",
            "|---|---|---|---|---|---|---|"]
    for s in f.per_k:
        pooled = "–" if s.pooled is None else f"{s.pooled.events} / {s.pooled.exposure}"
        rate = "–" if s.pooled is None else f"{s.pooled.rate:.4g} [{s.pooled.low:.3g}, {s.pooled.high:.3g}]"
        out.append(f"| {s.K} | {s.seeds} | {s.frac_mean:.4g} | {s.frac_min:.4g} | {s.frac_max:.4g} | {pooled} | {rate} |")
    out.append("")
    if f.counts is not None:
        out += ["Constant-rate tests on the pooled counts:", ""]
        out += _homogeneity(f.counts.homogeneity) + _trend(f.counts.trend) + [""]
    return out


def _stability(st: Stability) -> list[str]:
    out = [f"Stability of `{st.model}` ({st.status}):", "", "| quantity | value |", "|---|---|"]
    if st.alpha is not None:
        out.append(f"| α (all rows) | {st.alpha:.4f} |")
        out.append(f"| α seed-bootstrap CI{st.level * 100:.0f} (B = {st.bootstrap_b}, seed {st.bootstrap_seed}, "
                   f"{st.bootstrap_failed} failed) | {_ci(st.alpha_ci)} |")
        if st.jackknife_mean is not None:
            out.append(f"| α seed jackknife mean ± SE, range | {st.jackknife_mean:.4f} ± {st.jackknife_se:.4f}, "
                       f"{_ci(st.jackknife_range)} |")
        out.append(f"| α leave-one-K-out range | {_ci(st.loko_alpha)} |")
        for name, half in (("lower", st.lower_half), ("upper", st.upper_half)):
            if half is not None:
                out.append(f"| α on the {name} half, K = {', '.join(map(str, half.Ks))} | {_g(half.alpha)} |")
    out.append(f"| c (all rows) | {st.c:.4g} |")
    if st.c_ci is not None:
        out.append(f"| c seed-bootstrap CI{st.level * 100:.0f} | [{st.c_ci.low:.4g}, {st.c_ci.high:.4g}] |")
    return out + [""]


def _homogeneity(h: Homogeneity) -> list[str]:
    if h.status != "ok":
        return [f"- one rate across groups: {h.status}"]
    return [(f"- one rate across groups: Pearson χ² = {h.chi2:.3g} ({h.dof} dof), {format_p(h.p_chi2)}; "
            f"G = {h.g:.3g}, {format_p(h.p_g)}; exact conditional {_p_exact(h)} "
            f"({h.draws} multinomial draws, seed {h.seed}); smallest expected count {h.min_expected:.3g}")]


def _p_exact(h: Homogeneity) -> str:
    """The Monte-Carlo p-value; at its floor 1/(1 + draws) no draw reached the statistic: a bound, not a value."""
    if h.p_exact is not None and h.draws and h.p_exact <= 1 / (1 + h.draws):
        return f"p ≤ {h.p_exact:.2g} (no draw reached the observed statistic)"
    return format_p(h.p_exact)


def _trend(t: PoissonTrend) -> list[str]:
    if not t.status.startswith("ok") and t.status != "exponent-at-search-bound":
        return [f"- Poisson trend in {t.covariate}: {t.status}"]
    lo = "unbounded" if t.factor_low is None else f"{t.factor_low:.3g}"
    hi = "unbounded" if t.factor_high is None else f"{t.factor_high:.3g}"
    return [(f"- Poisson trend rate ∝ {t.covariate}^b: b = {_g(t.exponent)} (CI{t.level * 100:.0f} "
            f"[{_g(t.exponent_low)}, {_g(t.exponent_high)}]), test of b = 0: {format_p(t.p_value)}; "
            f"the rate may change by a factor between {lo} and {hi} from {t.covariate} = {t.x_min:g} to "
            f"{t.x_max:g} and stay compatible with the counts")]


def _rows(r: RowsSweep, source: str | None) -> list[str]:
    out = [f"## Rows sweep: {r.label}", "", (f"Source `{source}`; K = {r.K}, N = {r.N}, at least "
           f"{r.elements_target} elements per M; operands: {r.operands}."), "",
           (f"| M | tiles | blocks | elements | differing | rate (ppm) | exact {r.confidence:.0%} CI (ppm) | "
           "between-block exact p | ≥ 2 ulp | max ulp |"), "|---|---|---|---|---|---|---|---|---|---|"]
    for p in r.points:
        out.append(f"| {p.M} | {p.tiles} | {p.blocks} | {p.elements} | {p.rate.events} | {p.rate.rate * 1e6:.4g} | "
                   f"{p.rate.low * 1e6:.4g}–{p.rate.high * 1e6:.4g} | {_p_exact(p.dispersion).removeprefix('p = ').removeprefix('p ')} | "
                   f"{p.n_ge2ulp} | {_g(p.max_ulp)} |")
    out += [""] + _homogeneity(r.homogeneity) + _trend(r.trend)
    ratio = r.ratio
    if ratio.max_ratio is not None:
        out.append(f"- the largest ratio between two M points' rates compatible with the counts "
                   f"({ratio.level:.0%}, simultaneous over {ratio.pairs} pairs): ×{ratio.max_ratio:.3g} "
                   f"(M = {ratio.pair[0]:g} vs {ratio.pair[1]:g})")
    else:
        out.append(f"- pairwise rate ratio bound: {ratio.status}")
    return out + [""]
