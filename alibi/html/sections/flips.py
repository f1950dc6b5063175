"""The replay section: how often two kernel arms pick different tokens, and how well the margin predicts it.

It reads `flips.json` (`alibi analyze flips`) through `FlipAnalysis.from_json`, so the page sees
exactly what the analysis validated. What the figures can show follows from what the file holds:
flip counts per margin decile, and the calibration bins with their held-out rates. The file keeps
the ROC-AUC, not the per-position margins behind it, so the ROC curve drawn here is the curve of
the margin *binned into its deciles* (at most ten steps, from the decile counts) and the caption
says so; the AUC quoted is the analysis's own, at full resolution.
"""

from __future__ import annotations

from dataclasses import dataclass

from alibi.html import figures
from alibi.html.render import FigureView, RenderedSection, render_fragment
from alibi.html.sections import Section

FLIPS_FILES = ("flips.json",)


@dataclass(frozen=True)
class Statistic:
    """One row of the statistics table: the name, the value as text, and a note (a CI, or why undefined)."""

    name: str
    value: str
    note: str = ""


def _num(x: float | None, digits: int = 4) -> str:
    return "undefined" if x is None else f"{x:.{digits}g}"


def _ci(ci: tuple[float, float] | None) -> str:
    return "" if ci is None else f"CI90 [{ci[0]:.4g}, {ci[1]:.4g}]"


def _why(fa, statistic: str) -> str:
    try:
        s = fa.status(statistic)
    except KeyError:
        return ""
    return "" if s.status == "ok" else f"undefined: {s.reason}"


def statistics(fa) -> list[Statistic]:
    rows = [Statistic("flip rate", f"{fa.flip_rate:.4g}", f"{fa.n_flips} of {fa.n_positions} positions")]
    rows.append(Statistic("ROC-AUC of arm a's margin", _num(fa.roc_auc),
                          _why(fa, "roc_auc") or f"{_ci(fa.roc_auc_ci90)} (prompt-cluster bootstrap, B = "
                          f"{fa.bootstrap}, seed {fa.seed}, {fa.bootstrap_skipped} one-class replicates skipped)"))
    rows.append(Statistic("average precision", _num(fa.average_precision), _why(fa, "average_precision")))
    if fa.lopo_auc is not None:
        lo = fa.lopo_auc
        rows.append(Statistic("leave-one-prompt-out AUC", f"{lo.mean:.4g}",
                              f"min {lo.min:.4g} (prompt {lo.min_prompt}), max {lo.max:.4g} (prompt {lo.max_prompt}); "
                              f"defined for {lo.n_defined} of {lo.n_prompts} prompts"))
    rows.append(Statistic("largest margin at which a flip occurred", _num(fa.max_flip_margin)))
    if fa.logits_identical is not None:
        rows.append(Statistic("logits bitwise identical", f"{fa.logits_identical} of {fa.logits_compared}",
                              "positions whose full logit vectors match in every bit"))
    rows.append(Statistic("held-out Brier score", _num(fa.brier_heldout),
                          _why(fa, "brier_heldout") or _ci(fa.brier_heldout_ci90) or _why(fa, "brier_heldout_ci90")))
    rows.append(Statistic("constant-rate baseline Brier", _num(fa.brier_baseline),
                          "predicting the fit half's flip rate everywhere"))
    rows.append(Statistic("isotonic Brier (sensitivity)", _num(fa.brier_isotonic)))
    if fa.brier_difference_ci90 is not None:
        rows.append(Statistic("Brier difference (held-out − baseline)", "", _ci(fa.brier_difference_ci90)))
    return rows


def _decile_label(d) -> str:
    if d.margin_min is None:
        return f"{d.decile} (empty)"
    return f"{d.decile}: {d.margin_min:.3g}–{d.margin_max:.3g}"


def decile_roc(deciles) -> list[tuple[float, float]] | None:
    """ROC points of the margin binned into deciles (lowest margin = highest risk first), or None when
    the positions hold only flips or only non-flips (no curve is defined)."""
    flips = sum(d.n_flips for d in deciles)
    others = sum(d.n - d.n_flips for d in deciles)
    if flips == 0 or others == 0:
        return None
    points, tp, fp = [(0.0, 0.0)], 0, 0
    for d in sorted(deciles, key=lambda d: d.decile):
        tp += d.n_flips
        fp += d.n - d.n_flips
        points.append((fp / others, tp / flips))
    return points


def _figures(fa) -> list[FigureView]:
    out = []
    bars = [figures.DecileBar(_decile_label(d), d.n, d.n_flips) for d in fa.deciles]
    if bars and any(d.n for d in fa.deciles):
        out.append(FigureView.of(
            "Flip rate per margin decile",
            "Positions split into ten deciles of arm a's margin (top-1 minus top-2 logprob, lowest first); each bar "
            "is the fraction whose top-1 token differs between the arms, labelled flips/positions.",
            figures.decile_chart(bars)))
    else:
        out.append(FigureView.absent("Flip rate per margin decile", "flips.json holds no margin deciles."))
    roc = decile_roc(fa.deciles)
    if roc is None:
        out.append(FigureView.absent("ROC curve", "Every position flipped, or none did: no ROC curve is defined "
                                                  f"({_why(fa, 'roc_auc') or 'one class only'})."))
    else:
        auc = "undefined" if fa.roc_auc is None else f"{fa.roc_auc:.3f}"
        out.append(FigureView.of(
            "ROC curve of the margin, by decile",
            "flips.json keeps the ROC-AUC, not the per-position margins, so this curve is drawn from the decile counts: "
            "each step admits one more decile, lowest margin first (a coarser curve than the analysis ranks). The AUC "
            f"in the legend is the analysis's own, computed on every position ({auc}).",
            figures.roc_chart(roc, f"margin deciles (AUC of the full margin {auc})")))
    bins = [(b.probability, b.flip_rate_evaluation, b.n_evaluation) for b in fa.bins
            if b.flip_rate_evaluation is not None]
    if bins:
        out.append(FigureView.of(
            "Calibration curve",
            f"Margin bins fitted on {fa.calibration_prompts} prompt(s) ({fa.n_calibration} positions): the predicted "
            "flip probability (flips + 1)/(n + 2) of each bin against the flip rate the same bin shows on the "
            f"{fa.evaluation_prompts} held-out prompt(s) ({fa.n_evaluation} positions). On the diagonal, the margin's "
            "flip probabilities transfer to unseen prompts.", figures.calibration_chart(bins)))
    else:
        out.append(FigureView.absent("Calibration curve", "No calibration bin has held-out positions"
                                     + (f" ({_why(fa, 'brier_heldout')})" if _why(fa, "brier_heldout") else "") + "."))
    return out


def render_text(text: str, where: str) -> RenderedSection:
    # deferred: keeps torch out of start-up
    from alibi.tokens.flips import (
        FlipAnalysis,  # its own reader validates the file; imported only when needed
    )

    fa = FlipAnalysis.from_json(text, where)
    a, b = fa.arm_a, fa.arm_b
    title = f"Token flips: {a.kernel or a.path} vs {b.kernel or b.path}"
    body = render_fragment("flips.html.j2", fa=fa, title=title, arms=[("a", a), ("b", b)],
                           statistics=statistics(fa), figures=_figures(fa),
                           undefined=[s for s in fa.statuses if s.status != "ok"])
    return RenderedSection("flips", title, body)


SECTION = Section(key="flips", files=FLIPS_FILES, kinds=("flip-analysis",), render=render_text)

__all__ = ["FLIPS_FILES", "SECTION", "Statistic", "decile_roc", "render_text", "statistics"]
