"""The margin statistics on constructed data whose answers are known by hand."""

from __future__ import annotations

import numpy as np
import pytest

from alibi.tokens import margin as ms

# Tolerance for values sklearn reaches through a handful of fp64 sums and products (trapezoids,
# precision × recall steps, squared errors): a few roundings of ≤ 2⁻⁵³ each, far below 1e-12.
FP64_SUMS = 1e-12


def arrays(flip, margin, cluster=None):
    flip = np.asarray(flip, dtype=bool)
    margin = np.asarray(margin, dtype=np.float64)
    cluster = np.zeros(flip.size, dtype=np.int64) if cluster is None else np.asarray(cluster, dtype=np.int64)
    return flip, margin, cluster


def test_a_margin_that_puts_every_flip_below_every_non_flip_has_auc_one():
    flip, margin, _ = arrays([1, 1, 0, 0, 0], [0.1, 0.2, 1.0, 2.0, 3.0])
    assert ms.roc_auc(flip, margin) == 1.0


def test_a_constant_margin_is_a_useless_predictor_with_auc_one_half():
    flip, margin, _ = arrays([1, 0, 0, 1, 0], [2.5] * 5)
    assert ms.roc_auc(flip, margin) == 0.5


def test_a_margin_that_puts_every_flip_above_every_non_flip_has_auc_zero():
    flip, margin, _ = arrays([1, 1, 0, 0], [5.0, 6.0, 0.1, 0.2])
    assert ms.roc_auc(flip, margin) == 0.0


def test_a_tied_flip_and_non_flip_count_one_half_in_the_auc():
    # flips at margins 1.0 and 0.5, non-flips at 1.0 and 2.0: pairs 1.0/1.0 tie (½), the other three
    # are ranked correctly (low margin = risk): AUC = 3.5 / 4.
    flip, margin, _ = arrays([1, 0, 1, 0], [1.0, 1.0, 0.5, 2.0])
    assert ms.roc_auc(flip, margin) == 0.875


def test_average_precision_treats_tied_margins_as_one_threshold():
    # margins 1 | 2 2 2 | 3 with flips 0 | 1 1 0 | 1. Grouped thresholds: margin ≤ 1 (P 0, R 0),
    # ≤ 2 (TP 2, FP 2: P 1/2, R 2/3), ≤ 3 (TP 3, FP 2: P 3/5, R 1): AP = 2/3·1/2 + 1/3·3/5 = 8/15.
    # Breaking the tie one way or the other would give 53/90 or 43/90 instead.
    flip, margin, _ = arrays([0, 1, 1, 0, 1], [1.0, 2.0, 2.0, 2.0, 3.0])
    assert ms.average_precision(flip, margin) == pytest.approx(8 / 15, rel=FP64_SUMS)
    for order in ([1, 2, 3, 0, 4], [3, 2, 1, 0, 4]):  # the positions inside the tie permuted
        assert ms.average_precision(flip[order], margin[order]) == pytest.approx(8 / 15, rel=FP64_SUMS)


def test_without_a_flip_the_ranking_statistics_are_none_with_a_reason():
    flip, margin, cluster = arrays([0, 0, 0, 0], [0.1, 0.2, 0.3, 0.4], [0, 0, 1, 1])
    assert ms.roc_auc(flip, margin) is None and ms.average_precision(flip, margin) is None
    assert "no flip among 4 positions" in ms.one_class_reason(flip)
    ci = ms.bootstrap_auc(flip, margin, cluster, 2, 100, np.random.default_rng(0))
    assert ci.ci90 is None and "no flip" in ci.reason
    lopo, why = ms.leave_one_prompt_out(flip, margin, cluster, 2)
    assert lopo is None and "no flip" in why


def test_when_every_position_flips_the_ranking_statistics_are_none_with_a_reason():
    flip, margin, _ = arrays([1, 1, 1], [0.1, 0.2, 0.3])
    assert ms.roc_auc(flip, margin) is None and ms.average_precision(flip, margin) is None
    assert "every one of 3 positions flipped" in ms.one_class_reason(flip)


def test_a_prompt_drawn_w_times_weighs_like_w_copies_of_that_prompt():
    rng = np.random.default_rng(3)
    margin = rng.exponential(2.0, 60).round(1)  # rounded: ties across prompts too
    flip = rng.random(60) < np.exp(-margin)
    cluster = np.repeat(np.arange(6), 10)
    counts = np.array([2, 0, 1, 3, 0, 1])
    copies = np.concatenate([np.flatnonzero(cluster == p) for p in range(6) for _ in range(counts[p])])
    weighted = ms.roc_auc(flip, margin, counts[cluster].astype(np.float64))
    assert weighted is not None
    assert weighted == ms.roc_auc(flip[copies], margin[copies])


def _synthetic(prompts: int, per_prompt: int, seed: int):
    rng = np.random.default_rng(seed)
    margin = rng.exponential(3.0, (prompts, per_prompt)) * rng.uniform(0.5, 1.5, (prompts, 1))
    flip = rng.random((prompts, per_prompt)) < 0.4 * np.exp(-margin)
    cluster = np.repeat(np.arange(prompts), per_prompt)
    return flip.ravel(), margin.ravel(), cluster


def test_the_auc_bootstrap_is_reproducible_for_a_seed_and_moves_with_it():
    flip, margin, cluster = _synthetic(12, 40, seed=1)
    first = ms.bootstrap_auc(flip, margin, cluster, 12, 300, np.random.default_rng(7))
    again = ms.bootstrap_auc(flip, margin, cluster, 12, 300, np.random.default_rng(7))
    other = ms.bootstrap_auc(flip, margin, cluster, 12, 300, np.random.default_rng(8))
    assert first == again
    assert first.ci90 != other.ci90


def test_the_auc_bootstrap_ci90_holds_the_point_estimate_on_a_large_synthetic_set():
    flip, margin, cluster = _synthetic(64, 256, seed=2)
    auc = ms.roc_auc(flip, margin)
    ci = ms.bootstrap_auc(flip, margin, cluster, 64, 400, np.random.default_rng(0))
    assert ci.n_kept + ci.n_skipped == 400 and ci.n_skipped == 0
    lo, hi = ci.ci90
    assert lo < auc < hi and hi - lo < 0.1


def test_replicates_with_one_class_are_skipped_and_counted():
    # Only prompt 0 holds flips: every replicate that does not draw it has no flip and no AUC.
    flip, margin, cluster = arrays([1, 0, 0, 0, 0, 0], [0.1, 3.0, 1.0, 2.0, 1.5, 2.5], [0, 0, 1, 1, 2, 2])
    ci = ms.bootstrap_auc(flip, margin, cluster, 3, 500, np.random.default_rng(0))
    assert ci.n_kept + ci.n_skipped == 500
    assert 0 < ci.n_skipped < 500  # P(prompt 0 absent) = (2/3)³ ≈ 0.30
    assert ci.ci90 is not None


def test_a_single_prompt_has_no_cluster_bootstrap_and_no_leave_one_out():
    flip, margin, cluster = arrays([1, 0, 0], [0.1, 2.0, 3.0])
    ci = ms.bootstrap_auc(flip, margin, cluster, 1, 100, np.random.default_rng(0))
    assert ci.ci90 is None and ci.reason.startswith("one prompt")
    lopo, why = ms.leave_one_prompt_out(flip, margin, cluster, 1)
    assert lopo is None and why.startswith("one prompt")


def test_leave_one_prompt_out_reports_the_aucs_without_each_prompt():
    # Prompts 0 and 1 rank their flip below their non-flip; prompt 2 inverts it. Without prompt 0:
    # flips {0.2, 5.0} vs non-flips {2.0, 0.05} → 1 of 4 pairs right; without prompt 1 likewise;
    # without prompt 2: flips {0.1, 0.2} vs {1.0, 2.0} → 4 of 4.
    flip, margin, cluster = arrays([1, 0, 1, 0, 1, 0], [0.1, 1.0, 0.2, 2.0, 5.0, 0.05], [0, 0, 1, 1, 2, 2])
    lopo, why = ms.leave_one_prompt_out(flip, margin, cluster, 3)
    assert why == ""
    assert (lopo.min, lopo.min_prompt, lopo.max, lopo.max_prompt) == (0.25, 0, 1.0, 2)
    assert lopo.mean == 0.5 and lopo.n_defined == 3


def test_tied_margins_share_a_decile_so_a_decile_may_be_empty():
    # 20 margins, five of them tied at 0: ranks 1,1,1,1,1,6,…,20 → deciles ⌊(r−1)/2⌋: the zeros fill
    # decile 0, nothing has rank 3 or 4, so decile 1 is empty and rank 6 alone is decile 2.
    margin = np.array([0.0] * 5 + list(range(1, 16)), dtype=np.float64)
    flip = np.array([1, 1, 0, 0, 0] + [0] * 15, dtype=bool)
    deciles = ms.margin_deciles(flip, margin)
    assert [d.n for d in deciles] == [5, 0, 1, 2, 2, 2, 2, 2, 2, 2]
    assert (deciles[0].n_flips, deciles[0].flip_rate, deciles[0].margin_max) == (2, 0.4, 0.0)
    assert deciles[1].flip_rate is None and deciles[1].margin_min is None
    assert sum(d.n for d in deciles) == 20


def test_adjacent_bins_merge_left_to_right_until_each_holds_twenty():
    cuts = np.arange(9, dtype=np.float64)
    kept = ms.merge_cuts(cuts, np.array([5, 5, 5, 5, 30, 2, 2, 2, 2, 2]))
    # bins 0–3 close at 20, bin 4 alone holds 30, bins 5–9 hold 10 < 20 and join bin 4's group
    assert kept.tolist() == [3.0]
    assert ms.merge_cuts(cuts, np.array([20] * 10)).tolist() == cuts.tolist()


def _two_prompt_calibration():
    # Prompt 0 (calibration): margins 0…99, flips below 10. Prompt 1 (held out): 0.5…99.5, flips below 10.
    fit_margin = np.arange(100, dtype=np.float64)
    held_margin = fit_margin + 0.5
    margin = np.concatenate([fit_margin, held_margin])
    flip = margin < 10
    cluster = np.repeat([0, 1], 100)
    return flip, margin, cluster


def test_calibration_bins_hold_twenty_and_predict_flips_plus_one_over_n_plus_two():
    flip, margin, cluster = _two_prompt_calibration()
    cal = ms.calibrate(flip, margin, cluster, 2, 50, np.random.default_rng(0))
    assert cal.reason == ""
    # ten quantile bins of 10 merge into five of 20; the first holds the ten flips
    assert [b.n_calibration for b in cal.bins] == [20] * 5
    assert [b.flips_calibration for b in cal.bins] == [10, 0, 0, 0, 0]
    assert [b.probability for b in cal.bins] == [11 / 22, 1 / 22, 1 / 22, 1 / 22, 1 / 22]
    # cuts at the 20 %, 40 %, 60 %, 80 % quantiles 19.8, 39.6, 59.4, 79.2: held-out margins x.5 fall
    # 20 | 20 | 40.5…58.5 = 19 | 59.5…78.5 = 20 | 79.5…99.5 = 21
    assert [b.n_evaluation for b in cal.bins] == [20, 20, 19, 20, 21]
    assert [b.flips_evaluation for b in cal.bins] == [10, 0, 0, 0, 0]
    assert (cal.bins[0].margin_low, cal.bins[-1].margin_high) == (None, None)


def test_the_held_out_brier_score_and_its_baseline_match_a_hand_computation():
    flip, margin, cluster = _two_prompt_calibration()
    cal = ms.calibrate(flip, margin, cluster, 2, 50, np.random.default_rng(0))
    # held out: 20 positions in bin 0 (10 flips, p = 1/2) contribute 20·¼; 80 others (no flip, p = 1/22)
    assert cal.brier_heldout == pytest.approx((20 * 0.25 + 80 / 22**2) / 100, rel=FP64_SUMS)
    # baseline: the calibration half's flip rate 0.1 for every held-out position: 10·0.81 + 90·0.01
    assert cal.calibration_flip_rate == 0.1
    assert cal.brier_baseline == pytest.approx(0.09, rel=FP64_SUMS)
    # the decreasing isotonic fit is the step 1 (m ≤ 9) → 0 (m ≥ 10); only m = 9.5 falls between: ½
    assert cal.brier_isotonic == pytest.approx(0.25 / 100, rel=FP64_SUMS)
    # one held-out prompt: its bootstrap would redraw it every time
    assert cal.brier_heldout_ci.ci90 is None and "one evaluation prompt" in cal.brier_heldout_ci.reason


def test_the_brier_bootstrap_is_reproducible_and_brackets_the_held_out_score():
    flip, margin, cluster = _synthetic(40, 100, seed=4)
    first = ms.calibrate(flip, margin, cluster, 40, 400, np.random.default_rng(5))
    again = ms.calibrate(flip, margin, cluster, 40, 400, np.random.default_rng(5))
    assert first == again
    lo, hi = first.brier_heldout_ci.ci90
    assert lo < first.brier_heldout < hi
    assert all(b.n_calibration >= ms.MIN_BIN for b in first.bins)
    assert sum(b.n_calibration for b in first.bins) == first.n_calibration == 20 * 100
    assert first.brier_difference_ci.ci90 is not None


def test_the_isotonic_fit_is_decreasing_in_the_margin():
    from sklearn.isotonic import IsotonicRegression

    flip, margin, cluster = _synthetic(20, 100, seed=6)
    iso = IsotonicRegression(increasing=False, out_of_bounds="clip").fit(margin[cluster % 2 == 0],
                                                                        flip[cluster % 2 == 0].astype(float))
    grid = np.linspace(0, margin.max(), 200)
    assert (np.diff(iso.predict(grid)) <= 0).all()


def test_calibration_with_one_prompt_or_too_few_positions_is_undefined_not_nan():
    flip, margin, cluster = arrays([1, 0] * 30, np.linspace(0, 5, 60))
    one = ms.calibrate(flip, margin, cluster, 1, 10, np.random.default_rng(0))
    assert one.reason.startswith("one prompt") and one.brier_heldout is None and one.bins == ()
    flip, margin, cluster = arrays([1, 0] * 15, np.linspace(0, 5, 30), [0] * 15 + [1] * 15)
    few = ms.calibrate(flip, margin, cluster, 2, 10, np.random.default_rng(0))
    assert "holds 15 positions, fewer than the 20" in few.reason and few.brier_baseline is None


def test_a_calibration_without_any_flip_still_scores_against_the_baseline():
    flip, margin, cluster = _synthetic(10, 50, seed=0)
    flip[:] = False
    cal = ms.calibrate(flip, margin, cluster, 10, 20, np.random.default_rng(0))
    assert cal.reason == "" and cal.calibration_flip_rate == 0.0 and cal.brier_baseline == 0.0
    assert all(b.probability == 1 / (b.n_calibration + 2) for b in cal.bins)
    assert cal.brier_heldout > 0
