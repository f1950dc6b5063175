"""Figures for the HTML reports: matplotlib (Agg, no pyplot) to PNG bytes.

Each function takes plain numbers (the section modules extract them from typed results) and
returns a `Chart`: the PNG, its pixel size, and the alt text. A figure is drawn on a private
`matplotlib.figure.Figure`, never through pyplot, so rendering touches no global figure state and
needs no display. Untrusted strings (tile names) only ever become tick labels: mathtext is off
(`text.parse_math`), so a `$` in a name is drawn, not parsed, and control characters are replaced
before they reach matplotlib. PNGs carry no software stamp, so the bytes depend only on the data
and the matplotlib version.
"""

from __future__ import annotations

import io
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

WIDTH_IN = 10.0
MIN_WIDTH_IN = 5.5
# Category axes (ulp bins) keep room for at least this many bars, so one bin is not drawn a page wide.
MIN_SLOTS = 6
TITLE_PAD = 18  # points between an axes and its title: one legend row fits there
DPI = 100
# At most this many tile names on an x axis; with more tiles every k-th is labelled.
MAX_TICK_LABELS = 42
TICK_LABEL_CHARS = 34
REGIME_COLOURS = {"real": "#1f77b4", "pow2": "#ff7f0e"}
NEAR_ZERO_COLOUR = "#9467bd"
FIRED_COLOUR = "#d62728"
MIN_COLOUR = "#0b3d66"
_RC = {"text.parse_math": False, "font.size": 9, "axes.titlesize": 10, "axes.spines.top": False,
       "axes.spines.right": False}


@dataclass(frozen=True)
class Chart:
    """A rendered figure: PNG bytes, size in pixels, and a text alternative for the `alt` attribute."""

    png: bytes = field(repr=False)
    width: int
    height: int
    alt: str


def tick_label(name: str) -> str:
    """A tile name fit for a tick label: one line, printable, at most `TICK_LABEL_CHARS` (the end kept)."""
    clean = re.sub(r"[\x00-\x1f\x7f]+", "⏎", name)
    return clean if len(clean) <= TICK_LABEL_CHARS else "…" + clean[-(TICK_LABEL_CHARS - 1):]


def common_prefix(names: Sequence[str]) -> str:
    """The longest prefix shared by every name that ends at a `.` (`model.layers.`), or ''."""
    if len(names) < 2:
        return ""
    shared = os.path.commonprefix(list(names))
    cut = shared.rfind(".") + 1
    return shared[:cut] if all(len(n) > cut for n in names) else ""


def _figure(height_in: float, ncols: int = 1, *, bottom_in: float = 0.55, top_in: float = 0.35,
            width_in: float = WIDTH_IN):
    """A figure with fixed margins in inches (a layout engine costs more than the drawing at hundreds of bars)."""
    # deferred: keeps matplotlib out of start-up
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in + bottom_in + top_in), dpi=DPI)
    total = height_in + bottom_in + top_in
    fig.subplots_adjust(left=0.85 / width_in, right=1 - 0.1 / width_in, bottom=bottom_in / total,
                        top=1 - top_in / total, wspace=0.22)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def _tile_figure(names: Sequence[str], height_in: float):
    """A figure for one value per tile, with room below for the rotated tile names; returns (fig, ax, labels, xlabel)."""
    prefix = common_prefix(names)
    n = len(names)
    step = max(1, math.ceil(n / MAX_TICK_LABELS))
    ticks = list(range(0, n, step))
    labels = [tick_label(names[i][len(prefix):]) for i in ticks]
    # Rotated 7-point labels: about 0.6 of the font size per character, plus the axis label below them.
    bottom = 0.5 + max((len(lab) for lab in labels), default=0) * 7 * 0.6 / 72
    # A few tiles get a narrower figure, so that a bar stays a bar and not a wall.
    width = min(WIDTH_IN, max(MIN_WIDTH_IN, 3.0 + 0.12 * n))
    fig, (ax,) = _figure(height_in, bottom_in=bottom, top_in=0.6, width_in=width)
    ax.set_xticks(ticks, labels, rotation=90, fontsize=7)
    ax.set_xlim(-0.7, n - 0.3)
    xlabel = "tile, in report order" + (f" (every {step}th named)" if step > 1 else "")
    if prefix:
        xlabel += f"; names without the common prefix {tick_label(prefix)}"
    ax.set_xlabel(xlabel)
    return fig, ax


def _bars(ax, xs: Sequence[float], heights: Sequence[float], width: float, colours: Sequence[str] | str,
          label: str | None = None) -> None:
    """Bars as one PolyCollection: hundreds of Rectangle patches draw several times slower."""
    # deferred: keeps matplotlib out of start-up
    from matplotlib.collections import PolyCollection

    half = width / 2
    verts = [[(x - half, 0.0), (x - half, h), (x + half, h), (x + half, 0.0)] for x, h in zip(xs, heights)]
    ax.add_collection(PolyCollection(verts, facecolors=colours, edgecolors="none", label=label))


def _plain_counts(axis) -> None:
    """Tick labels as plain counts (1, 10, 100, 1,000): with mathtext off, the log formatters' `$10^{2}$` would
    be drawn literally."""
    # deferred: keeps matplotlib out of start-up
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 1 or v == 0 else f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda _v, _pos: ""))


def _legend_under_title(ax, ncols: int, handles: list | None = None) -> None:
    """The legend in the band between the axes and their title (a narrow figure has no room beside the title);
    the figure is widened when the legend would reach past its right edge (`_fit_legend`)."""
    extra = {} if handles is None else {"handles": handles}
    legend = ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), fontsize=8, frameon=False, ncols=ncols,
                       borderaxespad=0.1, handlelength=1.2, **extra)
    _fit_legend(ax.figure, legend)


LEGEND_MARGIN_IN = 0.1  # between a legend's right end and the figure's edge


def _fit_legend(fig, legend) -> None:
    """Widen `fig` (its margins kept in inches) so that `legend`, anchored to the axes' left edge, ends inside it:
    a figure sized for a few tiles is narrower than the legend of two regimes, which was cut at the edge."""
    # deferred: keeps matplotlib out of start-up
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not hasattr(fig.canvas, "get_renderer"):
        FigureCanvasAgg(fig)
    right_px = legend.get_window_extent(fig.canvas.get_renderer()).x1
    width = fig.get_figwidth()
    over_in = right_px / fig.dpi + LEGEND_MARGIN_IN - width
    if over_in <= 0:
        return
    left_in, right_in = fig.subplotpars.left * width, (1 - fig.subplotpars.right) * width
    new_width = width + over_in
    fig.set_figwidth(new_width)
    fig.subplots_adjust(left=left_in / new_width, right=1 - right_in / new_width)


def _swatch(colour: str, label: str):
    # deferred: keeps matplotlib out of start-up
    from matplotlib.patches import Patch

    return Patch(facecolor=colour, label=label)


def _plain_log(axis, integers: bool = False) -> None:
    """Log-axis tick labels as plain numbers (4096, 0.001): the default ones are mathtext, drawn literally here."""
    # deferred: keeps matplotlib out of start-up
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}" if integers else f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _png(fig, alt: str) -> Chart:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    w, h = fig.canvas.get_width_height()
    return Chart(buf.getvalue(), int(w), int(h), alt)


def headroom_chart(names: Sequence[str], headroom_bits: Sequence[float | None]) -> Chart:
    """Bits of headroom below 2²⁴ per tile, `log2(2²⁴ / max|acc|)`; below zero the fp32 entry may round.

    headroom_bits[i] is None when tile i's accumulators are all zero (infinite headroom): drawn as
    a marker at the top of the axis.
    """
    # deferred: keeps matplotlib out of start-up
    import matplotlib

    with matplotlib.rc_context(_RC):
        fig, ax = _tile_figure(names, 2.4)
        finite = [h for h in headroom_bits if h is not None]
        top = max([*finite, 1.0]) * 1.18
        heights = [0.0 if h is None else h for h in headroom_bits]
        colours = [FIRED_COLOUR if h is not None and h < 0 else REGIME_COLOURS["real"] for h in headroom_bits]
        lowest = None
        if finite:
            lowest = list(headroom_bits).index(min(finite))
            colours[lowest] = MIN_COLOUR if headroom_bits[lowest] >= 0 else FIRED_COLOUR
        _bars(ax, range(len(names)), heights, 0.8, colours)
        handles = []
        if lowest is not None:
            handles.append(_swatch(colours[lowest], f"smallest: {headroom_bits[lowest]:.2f} bits "
                                                    f"({tick_label(names[lowest])})"))
        inf = [i for i, h in enumerate(headroom_bits) if h is None]
        if inf:
            handles.append(ax.scatter(inf, [top * 0.96] * len(inf), marker="v", color="#555555", s=14,
                                      label="all accumulators 0 (infinite headroom)"))
        if any(h < 0 for h in finite):
            handles.append(ax.axhline(0.0, color=FIRED_COLOUR, linewidth=1.0, label="2²⁴ (below: fp32 entry may round)"))
        _legend_under_title(ax, ncols=3, handles=handles)
        bottom = min([*finite, 0.0])
        ax.set_ylim(bottom * 1.15 - (0.5 if bottom < 0 else 0), top)
        ax.set_ylabel("bits below 2²⁴")
        ax.set_title("Headroom of the exact accumulator below 2²⁴, per tile", loc="left", pad=TITLE_PAD)
        alt = (f"Bar chart of headroom bits for {len(names)} tiles; minimum {min(finite):.2f} bits" if finite
               else f"No finite headroom among {len(names)} tiles")
        return _png(fig, alt)


def differing_chart(names: Sequence[str], differing: Mapping[str, Sequence[int | None]]) -> Chart:
    """Differing output elements per tile, one bar series per scale regime (symlog: 0 stays visible).

    differing[regime][i] is None when tile i was not run under that regime.
    """
    # deferred: keeps matplotlib out of start-up
    import matplotlib

    with matplotlib.rc_context(_RC):
        fig, ax = _tile_figure(names, 2.4)
        regimes = list(differing)
        width = 0.8 / max(1, len(regimes))
        peak = 0
        for k, regime in enumerate(regimes):
            counts = [0 if c is None else c for c in differing[regime]]
            peak = max([peak, *counts])
            offset = (k - (len(regimes) - 1) / 2) * width
            total = sum(counts)
            tiles = sum(1 for c in counts if c)
            _bars(ax, [i + offset for i in range(len(names))], counts, width, REGIME_COLOURS.get(regime, "#7f7f7f"),
                  label=f"{regime} scales: {total:,} elements in {tiles} tile(s)")
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_ylim(0, max(2.0, peak * 1.8))
        _plain_counts(ax.yaxis)
        ax.set_ylabel("differing elements")
        ax.set_title("Differing output elements, per tile", loc="left", pad=TITLE_PAD)
        _legend_under_title(ax, ncols=len(regimes))
        alt = "; ".join(f"{r}: {sum(c or 0 for c in differing[r]):,} differing elements" for r in regimes)
        return _png(fig, f"Bar chart of differing elements per tile ({alt})")


def ulp_bins(distances: Mapping[int, int]) -> list[tuple[str, int, int]]:
    """(label, low, high) bins covering `distances`: 0, 1, 2, 3 alone (from the smallest present), then powers of
    two (4–7, 8–15, …) up to the largest."""
    if not distances:
        return []
    top = max(distances)
    bins = [(str(d), d, d) for d in range(min(min(distances), 3), min(top, 3) + 1)]
    low = 4
    while low <= top:
        bins.append((f"{low}–{2 * low - 1}", low, 2 * low - 1))
        low *= 2
    return bins


def _binned(counts: Mapping[int, int], bins: Sequence[tuple[str, int, int]]) -> list[int]:
    return [sum(n for d, n in counts.items() if lo <= d <= hi) for _, lo, hi in bins]


@dataclass(frozen=True)
class UlpCounts:
    """One regime's differing elements by ulp distance.

    away: distance → elements whose two values are nonzero and of one sign; near_zero: distance →
    elements where a value is zero or the two signs differ (their ordered-integer distance counts
    the steps through zero, so it measures the cancellation, not the kernels); nonfinite: elements
    where a value is inf or NaN (no distance).
    """

    regime: str
    away: Mapping[int, int]
    near_zero: Mapping[int, int]
    nonfinite: int = 0

    @property
    def total(self) -> int:
        return sum(self.away.values()) + sum(self.near_zero.values()) + self.nonfinite


def ulp_histogram_chart(counts: Sequence[UlpCounts]) -> Chart:
    """Differing elements by ulp distance, one panel per regime, near-zero elements as their own bars."""
    # deferred: keeps matplotlib out of start-up
    import matplotlib

    with matplotlib.rc_context(_RC):
        fig, axes = _figure(2.4, ncols=max(1, len(counts)), bottom_in=0.5, top_in=0.55)
        for ax, c in zip(axes, counts):
            merged = {d: c.away.get(d, 0) + c.near_zero.get(d, 0) for d in set(c.away) | set(c.near_zero)}
            bins = ulp_bins(merged)
            if not bins and not c.nonfinite:
                ax.text(0.5, 0.5, "no differing elements", ha="center", va="center", transform=ax.transAxes)
                ax.set_xticks([])
                ax.set_yticks([])
            else:
                labels = [b[0] for b in bins] + (["non-finite"] if c.nonfinite else [])
                away = _binned(c.away, bins) + ([c.nonfinite] if c.nonfinite else [])
                near = _binned(c.near_zero, bins) + ([0] if c.nonfinite else [])
                xs = range(len(labels))
                for series, offset, colour, name in ((away, -0.2, REGIME_COLOURS.get(c.regime, "#7f7f7f"),
                                                      "same sign, nonzero"),
                                                     (near, 0.2, NEAR_ZERO_COLOUR, "near zero: a zero or a sign change")):
                    ax.bar([x + offset for x in xs], series, width=0.4, color=colour, label=name)
                    for x, n in zip(xs, series):
                        if n:
                            ax.annotate(f"{n:,}", (x + offset, n), xytext=(0, 2), textcoords="offset points",
                                        ha="center", fontsize=7)
                ax.set_yscale("log", nonpositive="clip")  # bars start at 0: clip them to the axis, do not drop them
                ax.set_ylim(0.7, max([*away, *near, 1]) * 4)
                _plain_counts(ax.yaxis)
                ax.set_xticks(list(xs), labels, fontsize=8)
                ax.set_xlim(-0.75, max(len(labels), MIN_SLOTS) - 0.25)
                ax.set_xlabel("ulp distance")
            ax.set_ylabel("elements")
            ax.set_title(f"{c.regime} scales: {c.total:,} elements", loc="left")
        if any(ax.containers for ax in axes):  # one legend for all panels; the regime colours are in the titles' bars
            fig.legend(handles=[_swatch(NEAR_ZERO_COLOUR if i else "#555555", label)
                                for i, label in enumerate(("same sign, nonzero (regime colour)",
                                                           "near zero: a zero or a sign change"))],
                       loc="upper right", fontsize=8, frameon=False, ncols=2)
        alt = "; ".join(f"{c.regime}: {sum(c.away.values()):,} same-sign, {sum(c.near_zero.values()):,} near zero, "
                        f"{c.nonfinite:,} non-finite" for c in counts)
        return _png(fig, f"Histogram of ulp distances of differing elements ({alt})")


def max_ulp_chart(units_by_max_ulp: Mapping[str, Mapping[int, int]]) -> Chart:
    """Units that differ, by their largest ulp distance, one panel per regime (when no per-element data exists)."""
    # deferred: keeps matplotlib out of start-up
    import matplotlib

    with matplotlib.rc_context(_RC):
        fig, axes = _figure(2.2, ncols=max(1, len(units_by_max_ulp)), bottom_in=0.5)
        for ax, (regime, hist) in zip(axes, units_by_max_ulp.items()):
            bins = ulp_bins(hist)
            if not bins:
                ax.text(0.5, 0.5, "no differing units", ha="center", va="center", transform=ax.transAxes)
                ax.set_xticks([])
                ax.set_yticks([])
            else:
                values = _binned(hist, bins)
                ax.bar(range(len(bins)), values, width=0.6, color=REGIME_COLOURS.get(regime, "#7f7f7f"))
                for x, n in enumerate(values):
                    if n:
                        ax.annotate(f"{n:,}", (x, n), xytext=(0, 2), textcoords="offset points", ha="center",
                                    fontsize=7)
                ax.set_xticks(range(len(bins)), [b[0] for b in bins], fontsize=8)
                ax.set_xlim(-0.75, max(len(bins), MIN_SLOTS) - 0.25)
                ax.set_xlabel("largest ulp distance in the unit")
                ax.set_ylim(0, max(values) * 1.2)
            ax.set_ylabel("units")
            ax.set_title(f"{regime} scales: {sum(hist.values()):,} differing units")
        return _png(fig, "Bar chart of differing units by their largest ulp distance")


# --- replay: flips against the margin ------------------------------------------------------------

@dataclass(frozen=True)
class DecileBar:
    """One margin decile: its label (the margin range), positions and flips in it."""

    label: str
    n: int
    flips: int


def decile_chart(deciles: Sequence[DecileBar]) -> Chart:
    """Flip rate per decile of arm A's margin (lowest margin first), each bar annotated flips/positions."""
    # deferred: keeps matplotlib out of start-up
    import matplotlib

    with matplotlib.rc_context(_RC):
        fig, (ax,) = _figure(2.6, bottom_in=1.0, width_in=7.0)
        rates = [d.flips / d.n if d.n else 0.0 for d in deciles]
        _bars(ax, range(len(deciles)), rates, 0.7, REGIME_COLOURS["real"])
        for x, d in enumerate(deciles):
            ax.annotate(f"{d.flips}/{d.n}", (x, rates[x]), xytext=(0, 2), textcoords="offset points", ha="center",
                        fontsize=7)
        ax.set_xticks(range(len(deciles)), [d.label for d in deciles], rotation=30, ha="right", fontsize=7)
        ax.set_xlim(-0.6, len(deciles) - 0.4)
        ax.set_ylim(0, max([*rates, 0.01]) * 1.25)
        ax.set_xlabel("decile of arm a's margin (top-1 − top-2 logprob), lowest first")
        ax.set_ylabel("flip rate")
        ax.set_title("Token flips per margin decile", loc="left")
        return _png(fig, "Bar chart of the flip rate per margin decile: " +
                    ", ".join(f"{d.flips}/{d.n}" for d in deciles))


def roc_chart(points: Sequence[tuple[float, float]], label: str) -> Chart:
    """An ROC curve (false-positive rate, true-positive rate) with the chance diagonal."""
    # deferred: keeps matplotlib out of start-up
    import matplotlib

    with matplotlib.rc_context(_RC):
        fig, (ax,) = _figure(3.4, bottom_in=0.5, width_in=4.6)
        ax.plot([0, 1], [0, 1], color="#999999", linewidth=0.8, linestyle="--", label="chance")
        xs, ys = zip(*points)
        ax.plot(xs, ys, color=REGIME_COLOURS["real"], marker="o", markersize=3, linewidth=1.4, label=label)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.set_aspect("equal")
        ax.set_xlabel("false-positive rate")
        ax.set_ylabel("true-positive rate")
        ax.legend(loc="lower right", fontsize=7, frameon=False)
        ax.set_title("ROC: low margin as a predictor of a flip", loc="left", fontsize=9)
        return _png(fig, f"ROC curve, {label}")


def calibration_chart(bins: Sequence[tuple[float, float, int]]) -> Chart:
    """Held-out flip rate against the predicted flip probability, one marker per bin (area ∝ positions)."""
    # deferred: keeps matplotlib out of start-up
    import matplotlib

    with matplotlib.rc_context(_RC):
        fig, (ax,) = _figure(3.4, bottom_in=0.5, width_in=4.6)
        top = max([*(max(p, r) for p, r, _ in bins), 0.05]) * 1.1
        ax.plot([0, top], [0, top], color="#999999", linewidth=0.8, linestyle="--", label="perfect calibration")
        biggest = max([n for _, _, n in bins] or [1])
        ax.scatter([p for p, _, _ in bins], [r for _, r, _ in bins], s=[12 + 120 * n / biggest for _, _, n in bins],
                   color=REGIME_COLOURS["real"], alpha=0.8, label="bins (area ∝ held-out positions)")
        ax.plot([p for p, _, _ in bins], [r for _, r, _ in bins], color=REGIME_COLOURS["real"], linewidth=0.8)
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.set_aspect("equal")
        ax.set_xlabel("predicted flip probability (fit half)")
        ax.set_ylabel("flip rate (held-out half)")
        ax.legend(loc="lower right", fontsize=7, frameon=False)
        ax.set_title("Calibration on held-out prompts", loc="left", fontsize=9)
        return _png(fig, "Calibration chart: " + ", ".join(f"{p:.3f}→{r:.3f} (n={n})" for p, r, n in bins))


# --- sweeps: divergence against K and M ------------------------------------------------------------

@dataclass(frozen=True)
class DepthSeries:
    """One depth sweep for the log–log chart.

    points: (K, fraction, low, high) where some element differed; bounds: (K, upper bound) where none did;
    curve: (K, fitted fraction) of the selected model, band: (K, low, high) its bootstrap band (may be empty).
    """

    label: str
    points: Sequence[tuple[float, float, float, float]]
    bounds: Sequence[tuple[float, float]]
    curve: Sequence[tuple[float, float]]
    band: Sequence[tuple[float, float, float]]
    curve_label: str


def depth_chart(series: Sequence[DepthSeries]) -> Chart:
    """Fraction of differing outputs against K on log–log axes, with each sweep's fitted curve and band."""
    # deferred: keeps matplotlib out of start-up
    import matplotlib

    with matplotlib.rc_context(_RC):
        entries = sum(bool(s.points) + bool(s.bounds) + bool(s.curve) for s in series)
        fig, (ax,) = _figure(3.8, bottom_in=0.5, top_in=0.2 + 0.16 * entries, width_in=8.0)
        positive = [y for s in series for _, y, _, _ in s.points] + [y for s in series for _, y in s.bounds] + \
                   [y for s in series for _, y in s.curve if y > 0]
        floor = 0.1 * min(positive) if positive else 1e-9
        handles = []
        for i, s in enumerate(series):
            colour = f"C{i % 10}"
            if s.points:
                K, y, lo, hi = (list(v) for v in zip(*s.points))
                handles.append(ax.errorbar(K, y, yerr=[[a - b for a, b in zip(y, lo)], [b - a for a, b in zip(y, hi)]],
                                           fmt="o", color=colour, ms=4, capsize=2, label=f"{s.label}: measured"))
            if s.bounds:
                bx, by = zip(*s.bounds)
                handles.append(ax.scatter(bx, by, marker="v", s=30, color=colour,
                                          label=f"{s.label}: none differed (upper bound)"))
            if s.curve:
                cx, cy = zip(*s.curve)
                (line,) = ax.plot(cx, [max(v, floor) for v in cy], color=colour, linewidth=1.4,
                                  label=f"{s.label}: {s.curve_label}")
                handles.append(line)
            if s.band:
                bk, blo, bhi = zip(*s.band)
                ax.fill_between(bk, [max(v, floor) for v in blo], [max(v, floor) for v in bhi], color=colour,
                                alpha=0.18, linewidth=0)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        _plain_log(ax.xaxis, integers=True)
        _plain_log(ax.yaxis)
        ax.set_ylim(bottom=floor)
        ax.set_xlabel("reduction depth K")
        ax.set_ylabel("fraction differing bitwise")
        ax.grid(True, which="major", alpha=0.3)
        if handles:
            ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), fontsize=7, frameon=False,
                      ncols=1, borderaxespad=0.1)
        return _png(fig, "Log–log chart of the fraction of differing outputs against K: " +
                    "; ".join(s.label for s in series))


def rows_chart(points: Sequence[tuple[int, float, float, float]], label: str) -> Chart:
    """Per-element rate (ppm) against M with its exact interval: (M, rate, low, high), rates as fractions."""
    # deferred: keeps matplotlib out of start-up
    import matplotlib

    with matplotlib.rc_context(_RC):
        fig, (ax,) = _figure(3.0, bottom_in=0.5, width_in=7.0)
        M = [p[0] for p in points]
        r, lo, hi = ([1e6 * p[i] for p in points] for i in (1, 2, 3))
        ax.errorbar(M, r, yerr=[[a - b for a, b in zip(r, lo)], [b - a for a, b in zip(r, hi)]], fmt="o",
                    color=REGIME_COLOURS["real"], capsize=3)
        ax.set_xscale("log", base=2)
        _plain_log(ax.xaxis, integers=True)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("rows per call M")
        ax.set_ylabel("differing elements (ppm)")
        ax.set_title(label, loc="left", fontsize=9)
        return _png(fig, f"Rate of differing elements against M ({label})")


__all__ = ["Chart", "DecileBar", "DepthSeries", "UlpCounts", "calibration_chart", "decile_chart", "depth_chart",
           "differing_chart", "headroom_chart", "max_ulp_chart", "roc_chart", "rows_chart", "tick_label", "ulp_bins",
           "ulp_histogram_chart"]
