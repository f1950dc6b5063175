"""The sweeps section: divergence against the reduction depth K with the model fits, and against M.

It reads `fits.json` (`alibi analyze depth`) through `DepthAnalysis.from_json`. The depth chart is
drawn from what the file holds per K — the pooled fraction over all seeds with its exact interval
(or, without counts, the mean over seeds with its min–max range), an upper bound where no element
differed — and from the selected model's curve and seed-bootstrap band; the individual seeds'
fractions are in the sweep's own folder, not in `fits.json`, so they are not drawn.
"""

from __future__ import annotations

from dataclasses import dataclass

from alibi.html import figures
from alibi.html.render import FigureView, RenderedSection, render_fragment
from alibi.html.sections import Section

FITS_FILES = ("fits.json",)


def _g(x: float | None, digits: int = 4) -> str:
    return "" if x is None else f"{x:.{digits}g}"


@dataclass(frozen=True)
class ModelRow:
    model: str
    formula: str
    status: str
    c: str
    alpha: str
    rmse: str
    loso: str
    loko: str
    rank: str
    selected: bool
    within_one_se: bool | None


def model_rows(fits) -> list[ModelRow]:
    rows = []
    for m in fits.models:
        p = m.params
        rows.append(ModelRow(m.model, m.formula, m.status, _g(p.c) if p else "",
                             "" if p is None or p.alpha is None else (f"{p.alpha:.4g}" + ("" if p.alpha_free else
                                                                                        " (fixed)")),
                             _g(m.rmse), _g(m.loso.rmse) if m.loso else "", _g(m.loko.rmse) if m.loko else "",
                             "" if m.rank is None else str(m.rank), m.model == fits.selected, m.within_one_se))
    return rows


def depth_series(fits) -> figures.DepthSeries:
    points, bounds = [], []
    for s in fits.per_k:
        if s.pooled is not None:
            if s.pooled.events == 0:
                bounds.append((float(s.K), s.pooled.high))
            else:
                points.append((float(s.K), s.pooled.rate, s.pooled.low, s.pooled.high))
        elif s.frac_mean > 0:
            points.append((float(s.K), s.frac_mean, s.frac_min, s.frac_max))
    st = fits.stability
    curve = list(zip(st.band_K, st.band_mid)) if st is not None and st.band_K else []
    band = list(zip(st.band_K, st.band_low, st.band_high)) if st is not None and st.band_low else []
    chosen = next((m for m in fits.models if m.model == fits.selected), None)
    label = "fit: none"
    if chosen is not None:
        alpha = f", α = {chosen.params.alpha:.3f}" if chosen.params and chosen.params.alpha_free else ""
        label = f"compatible with {chosen.formula}{alpha}" + (" (band: seed bootstrap)" if band else "")
    return figures.DepthSeries(fits.label, points, bounds, curve, band, label)


def _figures(analysis) -> list[FigureView]:
    out = []
    fitted = [f for f in analysis.analyses if f.per_k]
    if fitted:
        pooled = any(s.pooled is not None for f in fitted for s in f.per_k)
        out.append(FigureView.of(
            "Fraction differing against K",
            ("Per K, " + ("the pooled fraction over all seeds (differing elements over all elements) with its exact "
                          "95% interval, and a downward triangle at the 95% upper bound where no element differed"
                          if pooled else "the mean fraction over seeds with its min–max range") +
             "; the line is the selected model (held-out error, one-standard-error rule) and the shaded band its "
             "pointwise seed-bootstrap interval. Log–log axes. The single seeds' fractions are in each sweep's own "
             "folder, not in fits.json."),
            figures.depth_chart([depth_series(f) for f in fitted])))
    rows = analysis.rows
    if rows is not None and rows.points:
        pts = [(p.M, p.rate.rate, p.rate.low, p.rate.high) for p in rows.points]
        out.append(FigureView.of(
            "Rate of differing elements against M",
            f"{rows.label}, K = {rows.K}, N = {rows.N}: differing elements per million at each number of rows per call, "
            f"with exact {rows.confidence:.0%} intervals.",
            figures.rows_chart(pts, rows.label)))
    return out


def render_text(text: str, where: str) -> RenderedSection:
    # deferred: keeps torch out of start-up
    from alibi.sweep.analysis import (
        DepthAnalysis,  # its own reader validates the file; imported only when needed
    )

    analysis = DepthAnalysis.from_json(text, where)
    labels = [f.label for f in analysis.analyses]
    title = "Depth sweeps: " + ("; ".join(labels) if labels else "no sweep")
    body = render_fragment("depth.html.j2", analysis=analysis, title=title, figures=_figures(analysis),
                           model_rows=model_rows, g=_g)
    return RenderedSection("depth", title, body)


SECTION = Section(key="depth", files=FITS_FILES, kinds=("depth-fits",), render=render_text)

__all__ = ["FITS_FILES", "SECTION", "ModelRow", "depth_series", "model_rows", "render_text"]
