"""Arm A's margin as a predictor of a flip: ROC-AUC, average precision, prompt-cluster bootstrap,
leave-one-prompt-out, margin deciles and held-out calibration.

Inputs are arrays over joined positions: `flip` (bool), `margin` (arm A's top-1 minus top-2 logit,
finite, ≥ 0) and `cluster` (the prompt number 0 … P−1 of each position, see `alibi.tokens.join`).
A low margin means a high risk, so every ranking statistic scores a position by −margin.

Definitions (docs/flips.md states them for users):

- ROC-AUC: `sklearn.metrics.roc_auc_score(flip, −margin)`. Tied scores count one half (the
  trapezoid rule), so a constant margin scores exactly 0.5.
- Average precision: `sklearn.metrics.average_precision_score(flip, −margin)` =
  Σₖ (Rₖ − Rₖ₋₁)·Pₖ over the *distinct* score thresholds: tied scores form one threshold, so the
  order of positions inside a tie cannot change the value.
- Prompt-cluster bootstrap: a replicate draws P prompts with replacement; a position of a prompt
  drawn w times gets `sample_weight` w, which equals putting w copies of that prompt into the
  replicate (tested). A replicate with one class only has no AUC: it is skipped and counted. The
  CI90 is the 5th and 95th percentile (numpy's linear interpolation) of the kept replicates.
- Leave-one-prompt-out AUC: for each prompt in turn, the AUC of all *other* prompts' positions;
  reported as mean, min and max over the prompts for which it is defined, with the prompt
  numbers at which the min and max occur (the most influential prompts).
- Margin deciles: the rank r of each margin among all N (scipy `rankdata`, method `min`: tied
  margins share the smallest rank) gives decile ⌊10·(r−1)/N⌋, 0 = lowest margins. Tied margins
  therefore always share a decile, and a decile may hold more or fewer than N/10 positions, or
  none (its flip rate is then None).
- Calibration: even-numbered prompts fit, odd-numbered prompts evaluate. Cut points are the
  distinct 10 %, 20 %, … 90 % quantiles of the calibration margins (numpy `linear`); bin j holds
  margins m with cut[j−1] < m ≤ cut[j] (first and last bins open-ended). Left to right, adjacent
  bins are merged until each holds ≥ 20 calibration positions; a remainder below 20 at the top
  joins the last bin. Each bin predicts (flips + 1)/(n + 2) (Laplace's rule of succession, never
  0 or 1). Held-out Brier score (`sklearn.metrics.brier_score_loss`) of those predictions on the
  evaluation half, against a constant baseline equal to the calibration half's flip rate; as a
  sensitivity analysis, a decreasing isotonic regression (`sklearn.isotonic.IsotonicRegression`,
  clipped outside the calibration range) fitted on the calibration half, with its held-out
  Brier. The held-out Brier and the baseline-minus-held-out difference get prompt-bootstrap CI90s
  over the evaluation prompts, the calibration model held fixed.

A statistic that cannot be computed (one class, one prompt, too few calibration positions)
returns None and a `Status` with the reason: nothing here returns NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

MIN_BIN = 20
QUANTILE_BINS = 10
CI_PERCENTILES = (5.0, 95.0)


class Computed(StrEnum):
    """Whether a statistic could be computed."""

    OK = "ok"
    UNDEFINED = "undefined"


@dataclass(frozen=True)
class Status:
    """Whether one statistic could be computed: status `ok` or `undefined`, and why not."""

    statistic: str
    status: Computed
    reason: str = ""


@dataclass(frozen=True)
class BootstrapCI:
    """A bootstrap interval: ci90 (None when undefined), replicates kept and skipped, and why undefined."""

    ci90: tuple[float, float] | None
    n_kept: int
    n_skipped: int
    reason: str = ""


@dataclass(frozen=True)
class LeaveOnePromptOut:
    """AUCs with each prompt held out in turn (module docstring); min_prompt/max_prompt are prompt numbers."""

    n_prompts: int
    n_defined: int
    mean: float
    min: float
    max: float
    min_prompt: int
    max_prompt: int


@dataclass(frozen=True)
class MarginDecile:
    """One decile of arm A's margin (0 = lowest): positions, flips, flip rate and the margin range in it."""

    decile: int
    n: int
    n_flips: int
    flip_rate: float | None
    margin_min: float | None
    margin_max: float | None


@dataclass(frozen=True)
class CalibrationBin:
    """One merged calibration bin: margins in (margin_low, margin_high] (None = unbounded).

    n_calibration, flips_calibration: the fit half's counts; probability: (flips + 1)/(n + 2);
    n_evaluation, flips_evaluation, flip_rate_evaluation: the held-out half (rate None when
    no held-out position falls in the bin, with status saying so).
    """

    index: int
    margin_low: float | None
    margin_high: float | None
    n_calibration: int
    flips_calibration: int
    probability: float
    n_evaluation: int
    flips_evaluation: int
    flip_rate_evaluation: float | None
    status: str = Computed.OK


@dataclass(frozen=True)
class Calibration:
    """The held-out calibration analysis (module docstring); `reason` is set and the numbers None when undefined."""

    calibration_prompts: int
    evaluation_prompts: int
    n_calibration: int
    n_evaluation: int
    calibration_flip_rate: float | None
    bins: tuple[CalibrationBin, ...]
    brier_heldout: float | None
    brier_baseline: float | None
    brier_isotonic: float | None
    brier_heldout_ci: BootstrapCI | None
    brier_difference_ci: BootstrapCI | None
    reason: str = ""


def one_class_reason(flip: np.ndarray) -> str | None:
    """Why no ranking statistic exists for these labels (None when both classes occur)."""
    n, k = int(flip.size), int(flip.sum())
    if n == 0:
        return "no position"
    if k == 0:
        return f"no flip among {n} positions: a predictor of flips needs at least one flip and one non-flip"
    if k == n:
        return f"every one of {n} positions flipped: a predictor of flips needs at least one non-flip"
    return None


def roc_auc(flip: np.ndarray, margin: np.ndarray, weight: np.ndarray | None = None) -> float | None:
    """ROC-AUC of −margin as a score for `flip` (None with one class)."""
    # deferred: keeps sklearn out of start-up
    from sklearn.metrics import roc_auc_score

    if weight is not None:
        keep = weight > 0
        flip, margin, weight = flip[keep], margin[keep], weight[keep]
    if one_class_reason(flip) is not None:
        return None
    return float(roc_auc_score(flip, -margin, sample_weight=weight))


def average_precision(flip: np.ndarray, margin: np.ndarray) -> float | None:
    """Average precision of −margin for `flip`, tied scores grouped into one threshold (None with one class)."""
    # deferred: keeps sklearn out of start-up
    from sklearn.metrics import average_precision_score

    if one_class_reason(flip) is not None:
        return None
    return float(average_precision_score(flip, -margin))


def _interval(values: list[float]) -> tuple[float, float]:
    lo, hi = np.percentile(np.asarray(values, dtype=np.float64), CI_PERCENTILES)
    return (float(lo), float(hi))


def _draw(rng: np.random.Generator, prompts: np.ndarray, n_clusters: int) -> np.ndarray:
    """Multiplicity of each prompt number in one resample of `prompts` with replacement."""
    drawn = prompts[rng.integers(0, prompts.size, prompts.size)]
    return np.bincount(drawn, minlength=n_clusters)


def bootstrap_auc(flip: np.ndarray, margin: np.ndarray, cluster: np.ndarray, n_prompts: int, replicates: int,
                  rng: np.random.Generator, progress: Callable[[int, int], None] | None = None) -> BootstrapCI:
    """Prompt-cluster bootstrap CI90 of the ROC-AUC (module docstring)."""
    reason = one_class_reason(flip)
    if reason is not None:
        return BootstrapCI(None, 0, 0, reason)
    if n_prompts < 2:
        return BootstrapCI(None, 0, 0, "one prompt: a prompt-cluster bootstrap would redraw the same prompt "
                                       "every time, so it measures no prompt-to-prompt variation")
    prompts = np.arange(n_prompts)
    values: list[float] = []
    skipped = 0
    for b in range(replicates):
        value = roc_auc(flip, margin, _draw(rng, prompts, n_prompts)[cluster].astype(np.float64))
        if value is None:
            skipped += 1
        else:
            values.append(value)
        if progress is not None and (b + 1) % 1000 == 0:
            progress(b + 1, replicates)
    if not values:
        return BootstrapCI(None, 0, skipped, f"all {skipped} replicates held one class only")
    return BootstrapCI(_interval(values), len(values), skipped)


def leave_one_prompt_out(flip: np.ndarray, margin: np.ndarray, cluster: np.ndarray,
                         n_prompts: int) -> tuple[LeaveOnePromptOut | None, str]:
    """AUC with each prompt held out in turn (module docstring); (None, reason) when none is defined."""
    if n_prompts < 2:
        return None, "one prompt: holding it out leaves no position"
    aucs = {p: roc_auc(flip[cluster != p], margin[cluster != p]) for p in range(n_prompts)}
    defined = {p: v for p, v in aucs.items() if v is not None}
    if not defined:
        return None, one_class_reason(flip) or "every held-out set holds one class only"
    lo = min(defined, key=lambda p: (defined[p], p))
    hi = max(defined, key=lambda p: (defined[p], -p))
    return LeaveOnePromptOut(n_prompts=n_prompts, n_defined=len(defined),
                             mean=float(np.mean(list(defined.values()))), min=defined[lo], max=defined[hi],
                             min_prompt=lo, max_prompt=hi), ""


def margin_deciles(flip: np.ndarray, margin: np.ndarray) -> tuple[MarginDecile, ...]:
    """Flip rate per decile of the margin, tied margins sharing a decile (module docstring)."""
    # deferred: keeps scipy out of start-up
    from scipy.stats import rankdata

    n = margin.size
    rank = rankdata(margin, method="min").astype(np.int64)
    decile = (10 * (rank - 1)) // n
    out = []
    for d in range(10):
        inside = decile == d
        k, m = int(inside.sum()), int(flip[inside].sum())
        out.append(MarginDecile(decile=d, n=k, n_flips=m, flip_rate=m / k if k else None,
                                margin_min=float(margin[inside].min()) if k else None,
                                margin_max=float(margin[inside].max()) if k else None))
    return tuple(out)


def quantile_cuts(margin: np.ndarray, n_bins: int = QUANTILE_BINS) -> np.ndarray:
    """The distinct interior quantiles 1/n … (n−1)/n of `margin` (numpy `linear`), ascending."""
    return np.unique(np.quantile(margin, np.arange(1, n_bins) / n_bins))


def bin_of(cuts: np.ndarray, margin: np.ndarray) -> np.ndarray:
    """Bin index j of each margin: cuts[j−1] < m ≤ cuts[j], open-ended at both ends."""
    return np.searchsorted(cuts, margin, side="left")


def merge_cuts(cuts: np.ndarray, counts: np.ndarray, min_count: int = MIN_BIN) -> np.ndarray:
    """The cut points left after merging adjacent bins left to right until each holds ≥ `min_count`.

    `counts[j]` is the calibration count of bin j (len(cuts) + 1 bins). A remainder below
    `min_count` at the top joins the last closed bin. Requires sum(counts) ≥ min_count.
    """
    groups: list[list[int]] = []
    current: list[int] = []
    held = 0
    for j, c in enumerate(counts):
        current.append(j)
        held += int(c)
        if held >= min_count:
            groups.append(current)
            current, held = [], 0
    if current:
        groups[-1] += current
    return np.array([cuts[g[-1]] for g in groups[:-1]], dtype=np.float64)


def _brier(flip: np.ndarray, prob: np.ndarray, weight: np.ndarray | None = None) -> float:
    # deferred: keeps sklearn out of start-up
    from sklearn.metrics import brier_score_loss

    return float(brier_score_loss(flip.astype(np.int64), prob, sample_weight=weight))


def calibrate(flip: np.ndarray, margin: np.ndarray, cluster: np.ndarray, n_prompts: int, replicates: int,
              rng: np.random.Generator, min_count: int = MIN_BIN) -> Calibration:
    """Fit on even-numbered prompts, evaluate on odd-numbered ones (module docstring)."""
    # deferred: keeps sklearn out of start-up
    from sklearn.isotonic import IsotonicRegression

    fit, held = cluster % 2 == 0, cluster % 2 == 1
    n_fit_prompts, n_held_prompts = (n_prompts + 1) // 2, n_prompts // 2
    n_fit, n_held = int(fit.sum()), int(held.sum())

    def undefined(reason: str) -> Calibration:
        rate = float(flip[fit].mean()) if n_fit else None
        return Calibration(n_fit_prompts, n_held_prompts, n_fit, n_held, rate, (), None, None, None, None, None,
                           reason)

    if n_held_prompts == 0:
        return undefined("one prompt: no odd-numbered prompt to evaluate the calibration on")
    if n_fit < min_count:
        return undefined(f"the calibration half holds {n_fit} positions, fewer than the {min_count} one bin needs")
    m_fit, y_fit, m_held, y_held = margin[fit], flip[fit], margin[held], flip[held]
    raw = quantile_cuts(m_fit)
    cuts = merge_cuts(raw, np.bincount(bin_of(raw, m_fit), minlength=raw.size + 1), min_count)
    b_fit, b_held = bin_of(cuts, m_fit), bin_of(cuts, m_held)
    n_bins = cuts.size + 1
    n_cal = np.bincount(b_fit, minlength=n_bins)
    k_cal = np.bincount(b_fit, weights=y_fit, minlength=n_bins).astype(np.int64)
    n_ev = np.bincount(b_held, minlength=n_bins)
    k_ev = np.bincount(b_held, weights=y_held, minlength=n_bins).astype(np.int64)
    prob = (k_cal + 1) / (n_cal + 2)
    bins = tuple(CalibrationBin(
        index=j, margin_low=float(cuts[j - 1]) if j > 0 else None,
        margin_high=float(cuts[j]) if j < cuts.size else None,
        n_calibration=int(n_cal[j]), flips_calibration=int(k_cal[j]), probability=float(prob[j]),
        n_evaluation=int(n_ev[j]), flips_evaluation=int(k_ev[j]),
        flip_rate_evaluation=float(k_ev[j] / n_ev[j]) if n_ev[j] else None,
        status=Computed.OK if n_ev[j] else "no held-out position falls in this bin") for j in range(n_bins))
    rate = float(y_fit.mean())
    p_held, p_const = prob[b_held], np.full(n_held, rate)
    iso = IsotonicRegression(increasing=False, out_of_bounds="clip", y_min=0.0, y_max=1.0).fit(m_fit, y_fit.astype(np.float64))
    brier, baseline = _brier(y_held, p_held), _brier(y_held, p_const)

    held_prompts = np.unique(cluster[held])
    heldout_ci = difference_ci = None
    if held_prompts.size < 2:
        why = "one evaluation prompt: a prompt bootstrap would redraw it every time"
        heldout_ci = difference_ci = BootstrapCI(None, 0, 0, why)
    else:
        briers, differences = [], []
        for _ in range(replicates):
            w = _draw(rng, held_prompts, n_prompts)[cluster[held]].astype(np.float64)
            value = _brier(y_held, p_held, w)
            briers.append(value)
            differences.append(_brier(y_held, p_const, w) - value)
        heldout_ci = BootstrapCI(_interval(briers), replicates, 0)
        difference_ci = BootstrapCI(_interval(differences), replicates, 0)
    return Calibration(n_fit_prompts, n_held_prompts, n_fit, n_held, rate, bins, brier, baseline,
                       _brier(y_held, iso.predict(m_held)), heldout_ci, difference_ci)


__all__ = ["CI_PERCENTILES", "MIN_BIN", "QUANTILE_BINS", "BootstrapCI", "Calibration", "CalibrationBin", "Computed",
           "LeaveOnePromptOut", "MarginDecile", "Status", "average_precision", "bin_of", "bootstrap_auc",
           "calibrate", "leave_one_prompt_out", "margin_deciles", "merge_cuts", "one_class_reason",
           "quantile_cuts", "roc_auc"]
