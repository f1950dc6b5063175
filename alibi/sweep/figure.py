"""Figures of the sweeps (matplotlib, PNG and SVG): fraction differing against K, rate against M.

Depth figure: log–log axes, one colour per sweep (INT8 and FP8 together). Small dots: each
(seed, K) fraction that is not zero. Large markers: the pooled fraction per K (all seeds' differing
elements over all their elements) with its exact 95% interval; where no element differed at a K the
pooled fraction is 0, which a log axis cannot show, so a downward triangle marks the 95% upper bound
instead (said in the legend). Line and band: the selected model's fitted curve and its pointwise
seed-bootstrap band (CI90). Without counts (a bare CSV) the markers are the mean over seeds with the
min–max range, and a K whose mean is 0 is listed in the legend, not drawn.

Rows figure: the per-element rate (ppm) against M on a log M axis, with the exact intervals, and the
homogeneity and trend results in the title. The SVG output is deterministic (fixed hash salt, no
date).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from alibi.sweep.depth_fits import DepthData, DepthFits
from alibi.sweep.rates import binomial_rate
from alibi.sweep.records import RowsSweep

UPPER_BOUND_LEVEL = 0.95


def _figure(width: float, height: float):
    # deferred: keeps matplotlib out of start-up
    import matplotlib

    matplotlib.rcParams["svg.hashsalt"] = "alibi"
    # deferred: keeps matplotlib out of start-up
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _save(fig, stem: Path) -> list[Path]:
    png, svg = stem.with_suffix(".png"), stem.with_suffix(".svg")
    fig.savefig(png, dpi=150)
    fig.savefig(svg, metadata={"Date": None})
    return [png, svg]


def depth_figure(items: list[tuple[DepthFits, DepthData]], stem: Path) -> list[Path]:
    """Fraction differing against K for every analysed sweep on one pair of log–log axes."""
    fig = _figure(7.5, 6.0)
    ax = fig.add_subplot()
    handles: list = []  # (artist, label) in drawing order: the legend groups each sweep's entries
    bound_drawn = False
    floor = _y_floor(items)
    for i, (fits, data) in enumerate(items):
        color = f"C{i % 10}"
        K = np.asarray(data.K, dtype=float)
        f = np.asarray(data.frac, dtype=float)
        pos = f > 0
        dots = ax.scatter(K[pos], f[pos], s=6, color=color, alpha=0.25, linewidths=0)
        handles.append((dots, f"{fits.label}: one seed"))
        xs, ys, lo, hi, bounds, hidden = [], [], [], [], [], []
        for s in fits.per_k:
            if s.pooled is not None:
                if s.pooled.events == 0:
                    bounds.append((s.K, binomial_rate(0, s.pooled.exposure, UPPER_BOUND_LEVEL).high))
                    continue
                xs.append(s.K), ys.append(s.pooled.rate), lo.append(s.pooled.low), hi.append(s.pooled.high)
            elif s.frac_mean > 0:
                xs.append(s.K), ys.append(s.frac_mean), lo.append(max(s.frac_min, s.frac_mean * 1e-3)), hi.append(s.frac_max)
            else:
                hidden.append(s.K)
        if xs:
            y = np.array(ys)
            bars = ax.errorbar(xs, y, yerr=[y - np.array(lo), np.array(hi) - y], fmt="o", color=color, ms=5, capsize=2)
            handles.append((bars, f"{fits.label}: " + ("all seeds pooled, exact 95% CI" if fits.counts
                                                        else "mean over seeds, min–max")))
        if bounds:
            bx, by = zip(*bounds)
            tri = ax.scatter(bx, by, marker="v", s=40, color=color)
            handles.append((tri, f"{fits.label}: no differing element at this K — {UPPER_BOUND_LEVEL:.0%} upper bound"))
            bound_drawn = True
        if hidden:
            (blank,) = ax.plot([], [], " ")
            handles.append((blank, f"{fits.label}: mean 0 at K = {', '.join(map(str, hidden))} (not drawn)"))
        st = fits.stability
        if st is not None and st.band_K:
            m = next(x for x in fits.models if x.model == fits.selected)
            alpha = f", α = {m.params.alpha:.3f}" if m.params and m.params.alpha_free else ""
            (line,) = ax.plot(st.band_K, np.clip(st.band_mid, floor, None), color=color, lw=1.5)
            handles.append((line, f"{fits.label}: compatible with {m.formula}{alpha}"))
            if st.band_low:
                band = ax.fill_between(st.band_K, np.clip(st.band_low, floor, None), np.clip(st.band_high, floor, None),
                                       color=color, alpha=0.18, linewidth=0)
                handles.append((band, f"{fits.label}: seed-bootstrap band (CI{st.level * 100:.0f}, B = {st.bootstrap_b})"))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("reduction depth K")
    ax.set_ylabel("fraction of output elements differing bitwise")
    ax.set_ylim(bottom=floor)
    ax.set_title("Two kernels, same operands: differing outputs against K"
                 + ("\n(▼: upper bound where no element differs; curves and bands below the axis are clipped)"
                    if bound_drawn else ""), fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    if handles:
        artists, labels = zip(*handles)
        fig.legend(artists, labels, loc="outside lower center", fontsize=7, frameon=False)
    return _save(fig, stem)


def _y_floor(items: list[tuple[DepthFits, DepthData]]) -> float:
    """The bottom of the log axis: a decade below the smallest positive fraction, bound or fitted value."""
    values = []
    for fits, data in items:
        values += [v for v in data.frac if v > 0]
        values += [binomial_rate(0, s.pooled.exposure, UPPER_BOUND_LEVEL).high for s in fits.per_k
                   if s.pooled is not None and s.pooled.events == 0]
        if fits.stability is not None:
            values += [v for v in fits.stability.band_mid if v > 0]
    return 0.1 * min(values) if values else 1e-9


def rows_figure(sweep: RowsSweep, stem: Path) -> list[Path]:
    """The per-element rate against M with its exact intervals."""
    fig = _figure(6.5, 4.2)
    ax = fig.add_subplot()
    M = np.array([p.M for p in sweep.points], dtype=float)
    rate = np.array([p.rate.rate for p in sweep.points]) * 1e6
    lo = np.array([p.rate.low for p in sweep.points]) * 1e6
    hi = np.array([p.rate.high for p in sweep.points]) * 1e6
    events = np.array([p.rate.events for p in sweep.points])
    some = events > 0
    ax.errorbar(M[some], rate[some], yerr=[rate[some] - lo[some], hi[some] - rate[some]], fmt="o", capsize=3,
                label=f"rate per M (exact {sweep.confidence:.0%} CI)")
    if (~some).any():
        ax.scatter(M[~some], hi[~some], marker="v", s=40, color="C0",
                   label=f"no differing element: {sweep.confidence:.0%} upper bound")
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("rows per kernel call M")
    ax.set_ylabel("differing elements (ppm)")
    h, t = sweep.homogeneity, sweep.trend
    title = f"{sweep.label}: K={sweep.K}, N={sweep.N}, ≥ {sweep.elements_target:.3g} elements per M"
    if h.status == "ok":
        title += f"\none rate for all M: χ² p = {h.p_chi2:.3g}, exact p = {h.p_exact:.3g}"
    if t.factor_low is not None and t.factor_high is not None:
        title += (f"\nrate change from M={t.x_min:g} to {t.x_max:g} compatible at 90%: "
                  f"×{t.factor_low:.3g} … ×{t.factor_high:.3g}")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, stem)
