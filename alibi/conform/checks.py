"""The conformance checks: the paper's seven (science.md §5) and three that close its blind spot.

Each check is a pure function returning a `Verdict`. `applicable` is separate from `fired`: a
check whose inputs are missing or whose precondition fails is *inapplicable*, and an inapplicable
check is never reported as a pass. Exact checks compare bit patterns; a tolerance check carries
its threshold in the verdict.

Why the extended checks exist: under real scales, checks 1–7 cannot tell a correct kernel from one
that keeps a scale in bf16, rounds twice, swaps the scale order or truncates its final cast —
such faults stay within one ulp and check 5 is inapplicable. Holding each arm to its *declared*
epilogue model bit for bit catches every one of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from alibi.conform.verdict import CHECKS, DEFAULT_ULP_THRESHOLD, EXACT, Verdict, combine, fired, inapplicable, passed
from alibi.exact.emulator import Prediction, int32_wrap
from alibi.exact.numerics import OutputComparison, bitwise_equal_mask, compare_outputs, is_pow2

__all__ = ["CHECKS", "DEFAULT_ULP_THRESHOLD", "EXACT", "Verdict", "combine", "fired", "inapplicable", "passed"]

def _first_mismatch(mask_differs: torch.Tensor) -> list[int] | None:
    idx = mask_differs.nonzero()
    return idx[0].tolist() if idx.numel() else None


# 1 -------------------------------------------------------------------------------------------
def shared_operands(operands_a: dict[str, torch.Tensor | None], operands_b: dict[str, torch.Tensor | None]) -> Verdict:
    """Fires when the two arms did not receive bitwise-identical operands (a harness or quantizer fault).

    Compares every operand tensor (a_q, s_a, w_q, s_w, bias) by bit pattern, as each arm held it
    after its run — so a kernel that writes into its inputs is caught too.
    """
    differing = []
    for key in sorted(set(operands_a) | set(operands_b)):
        a, b = operands_a.get(key), operands_b.get(key)
        if a is None and b is None:
            continue
        if a is not None and b is not None and a.device != b.device:  # arms on different devices
            b = b.to(a.device)
        same = a is not None and b is not None and a.dtype == b.dtype and a.shape == b.shape and bool(
            (a.contiguous().view(torch.uint8) == b.contiguous().view(torch.uint8)).all())
        if not same:
            differing.append(key)
    if differing:
        return fired("shared-operands", f"operands differ between the arms: {', '.join(differing)} "
                      "(look at the harness or quantizer, not the kernel)", evidence={"differing": differing})
    return passed("shared-operands", "both arms received bitwise-identical operands")


# 2, 3 ----------------------------------------------------------------------------------------
def int32_no_overflow(pred: Prediction | None, K: int) -> Verdict:
    """Fires when `product_bound·K ≥ 2³¹`: an int32 accumulator may wrap and the alibi does not apply."""
    if pred is None:
        return inapplicable("int32-no-overflow", "not an int8 tile: no integer accumulator")
    ev = {"K": K, "product_bound": pred.product_bound, "k_limit": pred.k_limit}
    if not pred.int32_safe:
        return fired("int32-no-overflow", f"K={K} exceeds the int32 bound {pred.k_limit} for products up to "
                      f"{pred.product_bound}: accumulation may wrap, the integer alibi does not apply", evidence=ev)
    return passed("int32-no-overflow", f"K={K} ≤ {pred.k_limit}: no int32 accumulator can wrap", evidence=ev)


def lossless_fp32_entry(pred: Prediction | None) -> Verdict:
    """Fires when the exact max|acc| exceeds 2²⁴: some accumulators may round entering fp32."""
    if pred is None:
        return inapplicable("lossless-fp32-entry", "not an int8 tile: no integer accumulator")
    # headroom is infinite for an all-zero accumulator: JSON has no infinity, so it is recorded as None
    ev = {"max_abs_acc": pred.max_abs_acc, "headroom_bits": None if math.isinf(pred.headroom_bits) else pred.headroom_bits}
    if not pred.fp32_lossless:
        return fired("lossless-fp32-entry", f"max|acc| = {pred.max_abs_acc} > 2^24: conversion to fp32 rounds; "
                      "per-value judgement needed", evidence=ev)
    return passed("lossless-fp32-entry", f"max|acc| = {pred.max_abs_acc} ≤ 2^24 "
                   f"({pred.headroom_bits:.2f} bits of headroom)", evidence=ev)


# 4 -------------------------------------------------------------------------------------------
def exact_accumulator(reference: torch.Tensor | None, acc_a: torch.Tensor | None,
                      acc_b: torch.Tensor | None) -> Verdict:
    """Fires when an exposed int32 accumulator differs from the exact reference (as int32) or the other arm."""
    exposed = {arm: acc for arm, acc in (("a", acc_a), ("b", acc_b)) if acc is not None}
    if reference is None:
        return inapplicable("exact-accumulator", "no exact reference (not an int8 tile)")
    if not exposed:
        return inapplicable("exact-accumulator", "neither arm exposes its int32 accumulator")
    expected = int32_wrap(reference)
    bad: dict[str, Any] = {}
    for arm, acc in exposed.items():
        if acc.shape != expected.shape:
            bad[arm] = {"shape": list(acc.shape)}
            continue
        differs = acc.to(torch.int64) != expected.to(torch.int64)
        if bool(differs.any()):
            at = _first_mismatch(differs)
            bad[arm] = {"n_differing": int(differs.sum()), "first": at,
                        "got": int(acc[tuple(at)]), "expected": int(expected[tuple(at)])}
    ev = {"exposed_by": sorted(exposed), **({"mismatches": bad} if bad else {})}
    if bad:
        return fired("exact-accumulator", "int32 accumulator differs from the exact reference in arm(s) "
                      f"{', '.join(sorted(bad))}: an integer-path defect", evidence=ev)
    return passed("exact-accumulator", f"accumulator(s) of arm(s) {', '.join(sorted(exposed))} equal the exact "
                   "reference", evidence=ev)


# 5, 6 ----------------------------------------------------------------------------------------
def _normal_range_mask(reference_fp32: torch.Tensor) -> torch.Tensor:
    """Elements whose fp32 epilogue value is a finite normal number (or exactly zero)."""
    a = reference_fp32.abs()
    return torch.isfinite(reference_fp32) & ((a >= torch.finfo(torch.float32).tiny) | (a == 0))


def pow2_identity(comparison: OutputComparison, s_w: torch.Tensor, int32_safe: bool,
                  reference_fp32: torch.Tensor | None, *, bias: bool = False,
                  bias_modes: tuple[str | None, str | None] = (None, None)) -> Verdict:
    """Fires when, under power-of-two weight scales, the outputs differ in any bit (`comparison`: the arms'
    outputs compared, `compare_outputs`).

    For finite normal results `rnd(x)·2ᵏ = rnd(x·2ᵏ)`, so every scale order gives the same fp32
    and the outputs must be bitwise equal. Elements whose exact epilogue value is subnormal or
    overflows are excluded (commutation fails there), and are counted in the evidence.
    Inapplicable unless every weight scale is a power of two and the accumulator cannot wrap, and —
    with a bias — unless both arms declare the same bias handling: the identity is about scale
    orders; a fused bias and a bias added after the cast round differently whatever the scales,
    and those differences are judged against the declared models (`predicted_differences`).
    """
    if not bool(is_pow2(s_w).all()):
        return inapplicable("pow2-identity", "weight scales are not all powers of two (real-scale regime)")
    if not int32_safe:
        return inapplicable("pow2-identity", "the int32 accumulator may wrap at this K (check 2)")
    if bias and (None in bias_modes or bias_modes[0] != bias_modes[1]):
        why = ("an arm declares no epilogue model, so its bias handling is unknown" if None in bias_modes
               else f"the arms declare different bias handling ({bias_modes[0]} vs {bias_modes[1]}): the identity "
                    "covers scale orders only, so these tiles are judged by predicted-differences")
        return inapplicable("pow2-identity", why, evidence={"reason": "bias-handling", "bias_modes": list(bias_modes)})
    n = comparison.n_elements
    differs = comparison.differs if reference_fp32 is None else comparison.differs & _normal_range_mask(reference_fp32)
    n_excluded = 0 if reference_fp32 is None else int((~_normal_range_mask(reference_fp32)).sum())
    ev = {"n_elements": n, "n_excluded_subnormal_or_overflow": n_excluded, "n_differing": int(differs.sum())}
    if bool(differs.any()):
        ev["first"] = _first_mismatch(differs)
        return fired("pow2-identity", f"{ev['n_differing']} of {n} outputs differ under power-of-two "
                      "scales: an epilogue difference that no scale order explains", evidence=ev)
    return passed("pow2-identity", "outputs bitwise equal under power-of-two scales", evidence=ev)


# Significand bits (with the implicit one) of the output dtypes: an element whose exact value lies
# below 2^-p of the tile's largest exact |value| is "near zero" — its value is of the size of one
# rounding step of the large outputs, so cancellation (a bias against the product) can move it
# across zero and its ulp distance says nothing about the kernel.
SIGNIFICAND_BITS = {"bfloat16": 8, "float16": 11}


@dataclass(frozen=True)
class NearZero:
    """The near-zero split of one unit (see `near_zero`): floor, elements below it, how many of them
    differ, and the ulp / relative statistics over the elements above it."""

    floor: float | None
    n_near_zero: int | None
    n_differing_near_zero: int | None
    max_ulp_above_floor: int | None
    max_rel_diff_above_floor: float | None


def near_zero_mask(exact: torch.Tensor, out_dtype: str) -> tuple[float, torch.Tensor]:
    """The floor (2^-p · the largest finite exact |value|) and the mask of elements below it; an exact
    zero is near zero whatever the floor (its ulp and relative differences mean nothing)."""
    mag = exact.abs()
    finite_mag = mag[torch.isfinite(mag)]
    top = float(finite_mag.max()) if finite_mag.numel() else 0.0
    floor = math.ldexp(top, -SIGNIFICAND_BITS[out_dtype])
    return floor, (mag < floor) | (mag == 0)


def near_zero(out_a: torch.Tensor, out_b: torch.Tensor, comparison: OutputComparison, exact: torch.Tensor | None,
              floor_and_mask: tuple[float, torch.Tensor] | None) -> NearZero:
    """Split the arms' differences at the near-zero floor of the exact values `exact` (fp64 [M,N]);
    `comparison` is the two outputs compared (`compare_outputs`), `floor_and_mask` is
    `near_zero_mask(exact, out_dtype)` (None with no exact values)."""
    if exact is None or floor_and_mask is None or exact.numel() == 0:
        return NearZero(None, None, None, None, None)
    floor, near = floor_and_mask
    differs, d = comparison.differs, comparison.ulp
    above = (d >= 0) & ~near
    ulp = d[above]
    rel = ((out_a.double() - out_b.double()).abs() / exact.abs())[above & differs]
    return NearZero(floor, int(near.sum()), int((near & differs).sum()),
                    int(ulp.max()) if ulp.numel() else None,
                    float(rel.max()) if rel.numel() else (0.0 if bool(above.any()) else None))


def real_scale_tolerance(comparison: OutputComparison, real_regime: bool,
                         threshold: int = DEFAULT_ULP_THRESHOLD, near: torch.Tensor | None = None) -> Verdict:
    """Fires when the max finite ulp distance exceeds `threshold`, or finite/non-finite patterns differ
    (`comparison`: the arms' outputs compared, `compare_outputs`).

    near: elements whose exact value is near zero (`near_zero`); they are not held to the ulp
    threshold — their distances are reported apart — because their ulps measure cancellation, not
    the kernels (the epilogue-model check still holds every one of them to the declared bits).
    """
    if not real_regime:
        return inapplicable("real-scale-tolerance", "applies to the real-scale regime", threshold=threshold)
    d = comparison.ulp
    finite = d >= 0
    judged = finite if near is None else finite & ~near
    nonfinite_mismatch = ~finite & comparison.differs
    max_ulp = int(d[judged].max()) if bool(judged.any()) else None
    ev = {"max_ulp": max_ulp, "n_over_threshold": int((judged & (d > threshold)).sum()),
          "n_nonfinite_mismatch": int(nonfinite_mismatch.sum())}
    if near is not None:
        near_d = d[finite & near]
        ev.update(n_near_zero=int(near.sum()), max_ulp_near_zero=int(near_d.max()) if near_d.numel() else None)
    if not bool(finite.any()) and not bool(nonfinite_mismatch.any()):
        return inapplicable("real-scale-tolerance", "no finite output pair to measure", threshold=threshold,
                             evidence=ev)
    if ev["n_over_threshold"] or ev["n_nonfinite_mismatch"]:
        return fired("real-scale-tolerance", f"max ulp distance {max_ulp} > {threshold} or non-finite outputs "
                      f"differ ({ev['n_nonfinite_mismatch']})", threshold=threshold, evidence=ev)
    if max_ulp is None:  # finite pairs, every one of them near zero
        return passed("real-scale-tolerance", "every finite output is near zero (reported apart)", threshold=threshold,
                      evidence=ev)
    return passed("real-scale-tolerance", f"max ulp distance {max_ulp} ≤ {threshold}"
                  + (" above the near-zero floor" if near is not None else ""), threshold=threshold, evidence=ev)


# 7 -------------------------------------------------------------------------------------------
def token_level_risk(flip_rate: float | None = None, bound: float | None = None, *,
                     evidence: dict[str, Any] | None = None) -> Verdict:
    """Fires when the teacher-forced token flip rate exceeds the workload's bound.

    evidence: where the flip rate came from (the flip analysis file and its digest, counts),
    carried into the verdict so a report names the replay it rests on.
    """
    if flip_rate is None or bound is None:
        return inapplicable("token-level-risk", "needs a teacher-forced replay of a model with both arms "
                             "(conform --replay FLIPS.json); tile conformance has no tokens", threshold=bound)
    ev = {"flip_rate": flip_rate, **(evidence or {})}
    if flip_rate > bound:
        return fired("token-level-risk", f"flip rate {flip_rate:.4g} > bound {bound:.4g}", threshold=bound, evidence=ev)
    return passed("token-level-risk", f"flip rate {flip_rate:.4g} ≤ bound {bound:.4g}", threshold=bound, evidence=ev)


# extended ------------------------------------------------------------------------------------
def epilogue_model(arms: dict[str, tuple[str | None, torch.Tensor, torch.Tensor | None]],
                   names: dict[str, str] | None = None) -> Verdict:
    """Fires when an arm's output differs in any bit from the output of its declared epilogue model.

    `arms` maps an arm label to (declared model name, actual output, model output); an arm without
    a model output (e.g. an fp8 arm that exposes no accumulator) is not judged, and if no arm can
    be judged the check is inapplicable. An arm that declares *no* model makes the check
    inapplicable even when the other arm is judged and holds: the claim "each arm equals its
    declared model" would be false of it, and the strongest check would be silently bypassed
    (`alibi identify` finds which model it follows). A judged arm that deviates still fires.
    names: each arm's kernel name, for the message.
    """
    judged, bad, unjudged, undeclared = {}, {}, [], []
    for arm, (model, out, expected) in arms.items():
        if model is None:
            undeclared.append(arm)
        if model is None or expected is None:
            unjudged.append(arm)
            continue
        comparison = compare_outputs(out, expected)
        differs, d = comparison.differs, comparison.ulp
        judged[arm] = model
        if bool(differs.any()):
            bad[arm] = {"model": model, "n_differing": int(differs.sum()), "first": _first_mismatch(differs),
                        "max_ulp": int(d.max()) if d.numel() else None}
    ev = {"models": judged, "not_judged": unjudged, **({"violations": bad} if bad else {})}
    if undeclared and not bad:
        return inapplicable("epilogue-model", undeclared_model_reason(undeclared, names),
                             evidence={**ev, "reason": "undeclared", "undeclared": undeclared})
    if not judged:
        return inapplicable("epilogue-model", "no arm declares an epilogue model that can be evaluated here",
                             evidence=ev)
    if bad:
        return fired("epilogue-model", "; ".join(f"arm {arm} deviates from its declared {v['model']} on "
                                                  f"{v['n_differing']} elements" for arm, v in bad.items()),
                      evidence=ev)
    return passed("epilogue-model", "each judged arm equals its declared epilogue model bit for bit", evidence=ev)


def undeclared_model_reason(arms: list[str], names: dict[str, str] | None = None) -> str:
    """Why a check that needs every arm's declared epilogue model decided nothing: which arms declare none
    (`names`: each arm's kernel name, to name it too)."""
    which = " and ".join(f"arm {a}" + (f" (`{names[a]}`)" if names and a in names else "") for a in arms)
    return (f"{which} declare{'s' if len(arms) == 1 else ''} no epilogue model: run `alibi identify` to find "
            "which model to declare")


def predicted_differences(observed: torch.Tensor, predicted: torch.Tensor | None, why_not: str = "",
                          cause: str | None = None) -> Verdict:
    """Fires when the elements where the arms differ are not exactly those where their declared models do.

    observed: the [M,N] mask of elements whose bits differ between the arms; predicted: the mask
    where the two declared models applied to the exact accumulator differ (None: inapplicable,
    `why_not` says why). A difference the models do not predict is a finding of its own, and so is
    a predicted difference that did not happen.
    """
    if predicted is None:
        return inapplicable("predicted-differences", why_not)
    unpredicted = observed & ~predicted
    missing = predicted & ~observed
    ev = {"n_predicted": int(predicted.sum()), "n_observed": int(observed.sum()),
          "n_unpredicted": int(unpredicted.sum()), "n_predicted_not_observed": int(missing.sum()), "cause": cause}
    if ev["n_unpredicted"] or ev["n_predicted_not_observed"]:
        ev["first"] = _first_mismatch(unpredicted | missing)
        return fired("predicted-differences", f"{ev['n_unpredicted']} differing elements the declared models do not "
                     f"predict, {ev['n_predicted_not_observed']} predicted differences absent", evidence=ev)
    if not ev["n_predicted"]:
        return passed("predicted-differences", "the declared models agree here, and so do the arms", evidence=ev)
    return passed("predicted-differences", f"the arms differ exactly where their declared models do "
                  f"({ev['n_predicted']} elements; cause: {cause})", evidence=ev)


def m_invariance(full: dict[str, torch.Tensor], subsets: dict[str, list[tuple[list[int], torch.Tensor]]]) -> Verdict:
    """Fires when a row computed inside a smaller M (1, 4, 16 rows, various positions) differs from the same row
    computed inside the full tile. `subsets[arm]` holds (row indices, output rows) pairs."""
    if not any(subsets.values()):
        return inapplicable("m-invariance", "no sub-batches were run")
    bad: dict[str, Any] = {}
    sizes = sorted({len(rows) for runs in subsets.values() for rows, _ in runs})
    for arm, runs in subsets.items():
        for rows, out in runs:
            ref = full[arm][rows]
            differs = ~bitwise_equal_mask(out, ref)
            if bool(differs.any()):
                bad.setdefault(arm, []).append({"M": len(rows), "rows": [rows[0], rows[-1]],
                                                "n_differing": int(differs.sum())})
    ev = {"sub_batch_sizes": sizes, **({"violations": bad} if bad else {})}
    if bad:
        return fired("m-invariance", "row outputs depend on the batch: arm(s) " + ", ".join(sorted(bad)),
                      evidence=ev)
    return passed("m-invariance", f"rows identical at M = {', '.join(map(str, sizes))} and in the full tile",
                   evidence=ev)


def run_to_run(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> Verdict:
    """Fires when an arm run twice on the same operands gives different bits."""
    if not first:
        return inapplicable("run-to-run", "no repeated runs")
    bad = {arm: int((~bitwise_equal_mask(first[arm], second[arm])).sum()) for arm in first}
    bad = {arm: n for arm, n in bad.items() if n}
    if bad:
        return fired("run-to-run", "nondeterministic: " + ", ".join(f"arm {a}: {n} elements" for a, n in bad.items()),
                      evidence={"n_differing": bad})
    return passed("run-to-run", "each arm reproduced its own bits", evidence={"arms": sorted(first)})
