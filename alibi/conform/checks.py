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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from alibi.conform.verdict import CHECKS, DEFAULT_ULP_THRESHOLD, EXACT, Verdict, combine, fired, inapplicable, passed
from alibi.exact.emulator import Prediction, int32_wrap
from alibi.exact.numerics import OutputComparison, bitwise_differ_mask, ulp_distance

__all__ = ["CHECKS", "DEFAULT_ULP_THRESHOLD", "EXACT", "Verdict", "combine", "fired", "inapplicable", "passed"]

# --- measuring ---------------------------------------------------------------------------------
# Every check is split in two: a measurement over tensors, and a verdict over the numbers it gave. A
# measurement takes a batch, tensors [B, ...] holding one unit per leading index (the conformance pipeline
# judges every unit of one shape at once, `alibi.conform.judge`), and returns per-unit values still on the
# device; `numbers` brings all of a batch's values to the host in one transfer. The checks that other callers
# apply to a single unit (the matrix's self-checks, `alibi identify`, tests) keep a function named after the
# check that takes one unit's tensors and runs the same two halves on a batch of one.

@dataclass(frozen=True)
class Counted:
    """The True elements of each unit of a [B, ...] mask, counted when the batch's numbers are brought over
    (`numbers`: the masks of one shape in one reduction, not one each)."""

    mask: torch.Tensor


def count(mask: torch.Tensor) -> Counted:
    """[B] int64 in `numbers`: the True elements of each unit of a [B, ...] mask."""
    return Counted(mask)


def _counts(counted: dict[str, Counted]) -> dict[str, torch.Tensor]:
    """Each mask's per-unit counts ([B] int64), the masks of one device and shape stacked and summed at once (a mask
    counted under several names, once)."""
    groups: dict[tuple, dict[int, torch.Tensor]] = {}
    for c in counted.values():
        groups.setdefault((c.mask.device, tuple(c.mask.shape)), {})[id(c.mask)] = c.mask
    sums: dict[int, torch.Tensor] = {}
    for (_, shape), masks in groups.items():
        stacked = torch.stack(list(masks.values())).reshape(len(masks), shape[0], -1).sum(-1)
        sums.update(zip(masks, stacked, strict=True))
    return {name: sums[id(c.mask)] for name, c in counted.items()}


def largest(values: torch.Tensor, where: torch.Tensor | None = None) -> torch.Tensor:
    """[B]: each unit's largest value (among `where`), -1 where it has none (every value measured is ≥ 0 or -1)."""
    if where is not None:
        values = torch.where(where, values, torch.full((), -1, dtype=values.dtype, device=values.device))
    return values.reshape(values.shape[0], -1).amax(1)


def anywhere(mask: torch.Tensor) -> torch.Tensor:
    """[B] bool: each unit of a [B, ...] mask has a True element."""
    return mask.reshape(mask.shape[0], -1).any(1)


@dataclass(frozen=True)
class Gathered:
    """A batch's measured values in one float64 tensor on the device (`flat`, `gathered`), with what the host needs
    to read it back (`spread`): each value's name and number of elements, in the order of `flat`, and the names in
    the order they were measured in (`names`); `flat` may go on past the values (`gathered`'s `tail`)."""

    flat: torch.Tensor
    order: tuple[tuple[str, int], ...]
    names: tuple[str, ...]


def gathered(measured: dict[str, torch.Tensor | Counted], tail: torch.Tensor | None = None) -> Gathered:
    """A batch's measured values ([B] tensors, one value per unit, or masks `Counted`) in one float64 tensor on the
    device of the first (float64 holds every count, ulp distance, |accumulator| and exact value measured here
    exactly), followed by `tail` (float64, flat) where given: the values are gathered by device and dtype, so a
    batch costs a few concatenations and casts, not one per value. Device work only: the host waits for nothing (a
    CUDA graph can hold it)."""
    counts = _counts({name: v for name, v in measured.items() if isinstance(v, Counted)})
    measured = {name: counts.get(name, v) for name, v in measured.items()}
    groups: dict[tuple, list[str]] = {}
    for name, values in measured.items():
        groups.setdefault((values.device, values.dtype), []).append(name)
    device = measured[next(iter(measured))].device
    flat = torch.cat([torch.cat([measured[n] for n in group]).to(device, torch.float64)
                      for group in groups.values()] + ([] if tail is None else [tail]))
    return Gathered(flat, tuple((name, measured[name].numel()) for group in groups.values() for name in group),
                    tuple(measured))


def spread(values: list[float], gathered: Gathered, on: dict[str, list[int]] | None = None
           ) -> list[dict[str, float]]:
    """`gathered`'s values brought to the host (`values`, its `flat` in order), per unit: name → float, in the order
    the values were measured in.

    on: for a value measured on some of the units only, their indices (its tensor holds one value per such unit,
    in that order); the other units' dicts do not have it."""
    on = on or {}
    found: dict[str, list[float]] = {}
    start = 0
    for name, n in gathered.order:
        found[name], start = values[start:start + n], start + n
    B = max(len(found[name]) for name in gathered.names if name not in on)
    units: list[dict[str, float]] = [{} for _ in range(B)]
    for name in gathered.names:
        for i, x in zip(on.get(name, range(B)), found[name], strict=True):
            units[i][name] = x
    return units


def numbers(measured: dict[str, torch.Tensor | Counted], on: dict[str, list[int]] | None = None
            ) -> list[dict[str, float]]:
    """A batch's measured values on the host in one transfer (`gathered`, then `spread`): per unit, name → float,
    in the order of `measured`."""
    if not measured:
        return []
    g = gathered(measured)
    return spread(g.flat.cpu().tolist(), g, on)


def optional_int(x: float) -> int | None:
    """A measured maximum as an int, None where the unit had no value to take it over (-1)."""
    return None if x < 0 else int(x)


def first_mismatch(mask: torch.Tensor) -> list[int] | None:
    """The row-major first True position of one unit's mask, None when there is none."""
    idx = mask.nonzero()
    return idx[0].tolist() if idx.numel() else None


def _one(x: torch.Tensor | None) -> torch.Tensor | None:
    return None if x is None else x.unsqueeze(0)


# 1 -------------------------------------------------------------------------------------------
def operands_differ(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | bool:
    """Per unit, whether two batches of one operand ([B, ...]) hold different bytes; True (for every unit) when
    only one arm has the operand or their dtypes or shapes differ."""
    if a is None or b is None or a.dtype != b.dtype or a.shape != b.shape:
        return True
    if a.device != b.device:  # arms on different devices
        b = b.to(a.device)
    return ~(a.contiguous().view(torch.uint8) == b.contiguous().view(torch.uint8)).reshape(a.shape[0], -1).all(1)


def shared_operands_verdict(differing: list[str]) -> Verdict:
    if differing:
        return fired("shared-operands", f"operands differ between the arms: {', '.join(differing)} "
                      "(look at the harness or quantizer, not the kernel)", evidence={"differing": differing})
    return passed("shared-operands", "both arms received bitwise-identical operands")


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
        differs = operands_differ(_one(a), _one(b))
        if differs is True or bool(differs[0]):
            differing.append(key)
    return shared_operands_verdict(differing)


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
def accumulator_mismatch(acc: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """[B, M, N] mask: where exposed int32 accumulators differ from the wrapped exact ones (`int32_wrap`)."""
    if acc.dtype == expected.dtype:
        return acc != expected
    return acc.to(torch.int64) != expected.to(torch.int64)


def accumulator_violation(acc: torch.Tensor, expected: torch.Tensor, mismatch: torch.Tensor, n: int) -> dict[str, Any]:
    """One unit's evidence of an accumulator that differs in `n` elements: the first, with both values."""
    at = first_mismatch(mismatch)
    return {"n_differing": n, "first": at, "got": int(acc[tuple(at)]), "expected": int(expected[tuple(at)])}


def exact_accumulator_verdict(exposed: list[str], bad: dict[str, Any]) -> Verdict:
    """Check 4 from what an int8 unit's arms exposed (`exposed`, sorted) and the violations found (`bad`)."""
    if not exposed:
        return inapplicable("exact-accumulator", "neither arm exposes its int32 accumulator")
    ev = {"exposed_by": exposed, **({"mismatches": bad} if bad else {})}
    if bad:
        return fired("exact-accumulator", "int32 accumulator differs from the exact reference in arm(s) "
                      f"{', '.join(sorted(bad))}: an integer-path defect", evidence=ev)
    return passed("exact-accumulator", f"accumulator(s) of arm(s) {', '.join(exposed)} equal the exact "
                   "reference", evidence=ev)


def exact_accumulator(reference: torch.Tensor | None, acc_a: torch.Tensor | None,
                      acc_b: torch.Tensor | None) -> Verdict:
    """Fires when an exposed int32 accumulator differs from the exact reference (as int32) or the other arm."""
    exposed = {arm: acc for arm, acc in (("a", acc_a), ("b", acc_b)) if acc is not None}
    if reference is None:
        return inapplicable("exact-accumulator", "no exact reference (not an int8 tile)")
    expected = int32_wrap(reference)
    bad: dict[str, Any] = {}
    for arm, acc in exposed.items():
        if acc.shape != expected.shape:
            bad[arm] = {"shape": list(acc.shape)}
            continue
        mismatch = accumulator_mismatch(acc, expected)
        n = int(mismatch.sum())
        if n:
            bad[arm] = accumulator_violation(acc, expected, mismatch, n)
    return exact_accumulator_verdict(sorted(exposed), bad)


# 5, 6 ----------------------------------------------------------------------------------------
def _normal_range_mask(reference_fp32: torch.Tensor) -> torch.Tensor:
    """Elements whose fp32 epilogue value is a finite normal number (or exactly zero)."""
    a = reference_fp32.abs()
    return torch.isfinite(reference_fp32) & ((a >= torch.finfo(torch.float32).tiny) | (a == 0))


def pow2_identity_measure(differs: torch.Tensor, reference_fp32: torch.Tensor
                          ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Per unit of a batch whose weight scales are all powers of two: how many outputs differ where the fp32
    reference (`apply_epilogue` under a_then_w, no bias) is a finite normal number or zero, and how many elements
    it excludes; and the mask of the judged differences (for the first one)."""
    normal = _normal_range_mask(reference_fp32)
    judged = differs & normal
    return {"n_excluded": count(~normal), "n_differing": count(judged)}, judged


def pow2_identity_verdict(all_pow2: bool, int32_safe: bool, n: int, n_excluded: int, n_differing: int,
                          first: Callable[[], list[int] | None], *, bias: bool = False,
                          bias_modes: tuple[str | None, str | None] = (None, None)) -> Verdict:
    """Fires when, under power-of-two weight scales, the outputs differ in any bit (the numbers of
    `pow2_identity_measure`; `first` gives the first judged difference).

    For finite normal results `rnd(x)·2ᵏ = rnd(x·2ᵏ)`, so every scale order gives the same fp32
    and the outputs must be bitwise equal. Elements whose exact epilogue value is subnormal or
    overflows are excluded (commutation fails there), and are counted in the evidence.
    Inapplicable unless every weight scale is a power of two and the accumulator cannot wrap, and —
    with a bias — unless both arms declare the same bias handling: the identity is about scale
    orders; a fused bias and a bias added after the cast round differently whatever the scales,
    and those differences are judged against the declared models (check predicted-differences).
    """
    if not all_pow2:
        return inapplicable("pow2-identity", "weight scales are not all powers of two (real-scale regime)")
    if not int32_safe:
        return inapplicable("pow2-identity", "the int32 accumulator may wrap at this K (check 2)")
    if bias and (None in bias_modes or bias_modes[0] != bias_modes[1]):
        why = ("an arm declares no epilogue model, so its bias handling is unknown" if None in bias_modes
               else f"the arms declare different bias handling ({bias_modes[0]} vs {bias_modes[1]}): the identity "
                    "covers scale orders only, so these tiles are judged by predicted-differences")
        return inapplicable("pow2-identity", why, evidence={"reason": "bias-handling", "bias_modes": list(bias_modes)})
    ev = {"n_elements": n, "n_excluded_subnormal_or_overflow": n_excluded, "n_differing": n_differing}
    if n_differing:
        ev["first"] = first()
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
    """The near-zero split of one unit (`near_zero_measure`): floor, elements below it, how many of them
    differ, and the ulp / relative statistics over the elements above it."""

    floor: float | None
    n_near_zero: int | None
    n_differing_near_zero: int | None
    max_ulp_above_floor: int | None
    max_rel_diff_above_floor: float | None


NO_NEAR_ZERO = NearZero(None, None, None, None, None)


def near_zero_mask(exact: torch.Tensor, out_dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per unit of a batch of exact values `exact` [B, M, N]: the largest finite |value| ([B], 0 where there is
    none), and the mask of the elements below the floor 2^-p · that value; an exact zero is near zero whatever
    the floor (its ulp and relative differences mean nothing). The floor of a unit is `math.ldexp(top, -p)`,
    equal to the product taken here (a power-of-two scaling of a normal fp64 value)."""
    mag = exact.abs()
    top = largest(torch.where(torch.isfinite(mag), mag, torch.zeros((), dtype=mag.dtype, device=mag.device)))
    floor = top * 2.0 ** -SIGNIFICAND_BITS[out_dtype]
    return top, (mag < floor.reshape(-1, *([1] * (mag.dim() - 1)))) | (mag == 0)


def near_zero_measure(differs: torch.Tensor, ulp: torch.Tensor, top: torch.Tensor, near: torch.Tensor
                      ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Per unit of a batch: the near-zero split's counts and the ulp maximum above the floor (`near_zero_mask` gave
    `top` and `near`); and the mask of the elements above it (finite pairs), whose differing ones the relative
    maximum is taken over (`max_relative_difference`, `max_rel_above_floor`)."""
    above = (ulp >= 0) & ~near
    return {"top": top, "n_near_zero": count(near), "n_differing_near_zero": count(near & differs),
            "max_ulp_above_floor": largest(ulp, above), "any_above": anywhere(above)}, above


def max_relative_difference(out_a: torch.Tensor, out_b: torch.Tensor, exact: torch.Tensor, where: torch.Tensor
                            ) -> torch.Tensor:
    """[B] float64: each unit's largest |a − b| / |exact| over the elements of `where` (the differing elements
    above the near-zero floor, where |exact| > 0), -inf where it has none. Every element's quotient is taken and
    those outside `where` are set aside, so the device finds the maximum without the host waiting for it."""
    B = out_a.shape[0]
    rel = (out_a.double() - out_b.double()).abs() / exact.abs()
    return torch.where(where, rel, -math.inf).reshape(B, -1).amax(1)


def near_zero_result(m: dict[str, float], out_dtype: str) -> NearZero:
    rel = m["max_rel_above_floor"]
    return NearZero(math.ldexp(m["top"], -SIGNIFICAND_BITS[out_dtype]), int(m["n_near_zero"]),
                    int(m["n_differing_near_zero"]), optional_int(m["max_ulp_above_floor"]),
                    rel if rel != -math.inf else (0.0 if m["any_above"] else None))


def real_scale_tolerance_measure(ulp: torch.Tensor, differs: torch.Tensor, threshold: int,
                                 near: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Per unit of a batch: the largest finite ulp distance held to the threshold (off the near-zero elements when
    `near` is given), how many exceed it, the non-finite mismatches, whether any pair is finite, and the near-zero
    count and maximum."""
    finite = ulp >= 0
    judged = finite if near is None else finite & ~near
    measured = {"max_ulp": largest(ulp, judged), "n_over_threshold": count(judged & (ulp > threshold)),
                "n_nonfinite_mismatch": count(~finite & differs), "any_finite": anywhere(finite)}
    if near is not None:
        measured.update(n_near_zero=count(near), max_ulp_near_zero=largest(ulp, finite & near))
    return measured


def real_scale_tolerance_verdict(m: dict[str, float] | None, threshold: int = DEFAULT_ULP_THRESHOLD) -> Verdict:
    """Check 6 from a unit's `real_scale_tolerance_measure` numbers; None outside the real-scale regime."""
    if m is None:
        return inapplicable("real-scale-tolerance", "applies to the real-scale regime", threshold=threshold)
    max_ulp = optional_int(m["max_ulp"])
    ev = {"max_ulp": max_ulp, "n_over_threshold": int(m["n_over_threshold"]),
          "n_nonfinite_mismatch": int(m["n_nonfinite_mismatch"])}
    near = "n_near_zero" in m
    if near:
        ev.update(n_near_zero=int(m["n_near_zero"]), max_ulp_near_zero=optional_int(m["max_ulp_near_zero"]))
    if not m["any_finite"] and not ev["n_nonfinite_mismatch"]:
        return inapplicable("real-scale-tolerance", "no finite output pair to measure", threshold=threshold,
                             evidence=ev)
    if ev["n_over_threshold"] or ev["n_nonfinite_mismatch"]:
        return fired("real-scale-tolerance", f"max ulp distance {max_ulp} > {threshold} or non-finite outputs "
                      f"differ ({ev['n_nonfinite_mismatch']})", threshold=threshold, evidence=ev)
    if max_ulp is None:  # finite pairs, every one of them near zero
        return passed("real-scale-tolerance", "every finite output is near zero (reported apart)", threshold=threshold,
                      evidence=ev)
    return passed("real-scale-tolerance", f"max ulp distance {max_ulp} ≤ {threshold}"
                  + (" above the near-zero floor" if near else ""), threshold=threshold, evidence=ev)


def real_scale_tolerance(comparison: OutputComparison, real_regime: bool,
                         threshold: int = DEFAULT_ULP_THRESHOLD, near: torch.Tensor | None = None) -> Verdict:
    """Fires when the max finite ulp distance exceeds `threshold`, or finite/non-finite patterns differ
    (`comparison`: the arms' outputs compared, `compare_outputs`).

    near: elements whose exact value is near zero (`near_zero`); they are not held to the ulp
    threshold — their distances are reported apart — because their ulps measure cancellation, not
    the kernels (the epilogue-model check still holds every one of them to the declared bits).
    """
    if not real_regime:
        return real_scale_tolerance_verdict(None, threshold)
    (m,) = numbers(real_scale_tolerance_measure(_one(comparison.ulp), _one(comparison.differs), threshold, _one(near)))
    return real_scale_tolerance_verdict(m, threshold)


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
def epilogue_model_measure(out: torch.Tensor, expected: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Per unit of a batch: how many outputs differ from the declared model's; and the mask of the differing
    elements (a violation's largest ulp distance is measured when there is one: `Deviation`)."""
    differs = bitwise_differ_mask(out, expected)
    return {"n_differing": count(differs)}, differs


@dataclass(frozen=True)
class Deviation:
    """Where one unit's output leaves its declared model's, measured only when it does: the first differing
    element and the largest ulp distance over the whole output (-1 when no pair is finite)."""

    out: torch.Tensor
    expected: torch.Tensor
    differs: torch.Tensor

    def first(self) -> list[int] | None:
        return first_mismatch(self.differs)

    def max_ulp(self) -> int:
        return int(ulp_distance(self.out, self.expected).max())


def epilogue_model_verdict(arms: dict[str, tuple[str | None, dict[str, float] | None, Callable[[], Deviation]]],
                           names: dict[str, str] | None = None) -> Verdict:
    """The epilogue-model check from each arm's (declared model name, `epilogue_model_measure` numbers or None
    when it cannot be judged, its `Deviation` when it has one)."""
    judged, bad, unjudged, undeclared = {}, {}, [], []
    for arm, (model, m, deviation) in arms.items():
        if model is None:
            undeclared.append(arm)
        if model is None or m is None:
            unjudged.append(arm)
            continue
        judged[arm] = model
        if m["n_differing"]:
            d = deviation()
            bad[arm] = {"model": model, "n_differing": int(m["n_differing"]), "first": d.first(),
                        "max_ulp": d.max_ulp()}
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
    measured = {}
    for arm, (model, out, expected) in arms.items():
        if model is None or expected is None:
            measured[arm] = (model, None, lambda: None)  # never asked: the arm is not judged
            continue
        m, differs = epilogue_model_measure(_one(out), _one(expected))
        measured[arm] = (model, numbers(m)[0], lambda o=out, e=expected, d=differs: Deviation(o, e, d[0]))
    return epilogue_model_verdict(measured, names)


def undeclared_model_reason(arms: list[str], names: dict[str, str] | None = None) -> str:
    """Why a check that needs every arm's declared epilogue model decided nothing: which arms declare none
    (`names`: each arm's kernel name, to name it too)."""
    which = " and ".join(f"arm {a}" + (f" (`{names[a]}`)" if names and a in names else "") for a in arms)
    return (f"{which} declare{'s' if len(arms) == 1 else ''} no epilogue model: run `alibi identify` to find "
            "which model to declare")


def predicted_differences_measure(observed: torch.Tensor, predicted: torch.Tensor
                                  ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Per unit of a batch: predicted, observed, unpredicted and missing differences; and the mask of the last two."""
    unpredicted, missing = observed & ~predicted, predicted & ~observed
    return {"n_predicted": count(predicted), "n_observed": count(observed), "n_unpredicted": count(unpredicted),
            "n_predicted_not_observed": count(missing)}, unpredicted | missing


def predicted_differences_verdict(m: dict[str, float] | None, first: Callable[[], list[int] | None],
                                  why_not: str = "", cause: str | None = None) -> Verdict:
    """Fires when the elements where the arms differ are not exactly those where their declared models do.

    m: the numbers of `predicted_differences_measure` over the observed mask (elements whose bits differ between
    the arms) and the predicted one (where the two declared models applied to the exact accumulator differ);
    None: inapplicable, `why_not` says why. A difference the models do not predict is a finding of its own, and so is
    a predicted difference that did not happen.
    """
    if m is None:
        return inapplicable("predicted-differences", why_not)
    ev = {"n_predicted": int(m["n_predicted"]), "n_observed": int(m["n_observed"]),
          "n_unpredicted": int(m["n_unpredicted"]), "n_predicted_not_observed": int(m["n_predicted_not_observed"]),
          "cause": cause}
    if ev["n_unpredicted"] or ev["n_predicted_not_observed"]:
        ev["first"] = first()
        return fired("predicted-differences", f"{ev['n_unpredicted']} differing elements the declared models do not "
                     f"predict, {ev['n_predicted_not_observed']} predicted differences absent", evidence=ev)
    if not ev["n_predicted"]:
        return passed("predicted-differences", "the declared models agree here, and so do the arms", evidence=ev)
    return passed("predicted-differences", f"the arms differ exactly where their declared models do "
                  f"({ev['n_predicted']} elements; cause: {cause})", evidence=ev)


def m_invariance_verdict(counts: dict[str, list[tuple[list[int], int]]]) -> Verdict:
    """M-invariance from, per arm, each sub-batch run (its row indices) and how many of its outputs differed from
    the same rows of the full tile."""
    if not any(counts.values()):
        return inapplicable("m-invariance", "no sub-batches were run")
    sizes = sorted({len(rows) for runs in counts.values() for rows, _ in runs})
    bad: dict[str, Any] = {}
    for arm, runs in counts.items():
        for rows, n in runs:
            if n:
                bad.setdefault(arm, []).append({"M": len(rows), "rows": [rows[0], rows[-1]], "n_differing": n})
    ev = {"sub_batch_sizes": sizes, **({"violations": bad} if bad else {})}
    if bad:
        return fired("m-invariance", "row outputs depend on the batch: arm(s) " + ", ".join(sorted(bad)),
                      evidence=ev)
    return passed("m-invariance", f"rows identical at M = {', '.join(map(str, sizes))} and in the full tile",
                   evidence=ev)


def m_invariance(full: dict[str, torch.Tensor], subsets: dict[str, list[tuple[list[int], torch.Tensor]]]) -> Verdict:
    """Fires when a row computed inside a smaller M (1, 4, 16 rows, various positions) differs from the same row
    computed inside the full tile. `subsets[arm]` holds (row indices, output rows) pairs."""
    return m_invariance_verdict({arm: [(rows, int(bitwise_differ_mask(out, full[arm][rows]).sum()))
                                       for rows, out in runs] for arm, runs in subsets.items()})


def run_to_run_verdict(arms: list[str], bad: dict[str, int]) -> Verdict:
    """Run-to-run from the arms run twice and, per arm, how many elements differed (only the nonzero ones)."""
    if bad:
        return fired("run-to-run", "nondeterministic: " + ", ".join(f"arm {a}: {n} elements" for a, n in bad.items()),
                      evidence={"n_differing": bad})
    return passed("run-to-run", "each arm reproduced its own bits", evidence={"arms": sorted(arms)})


def run_to_run(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> Verdict:
    """Fires when an arm run twice on the same operands gives different bits."""
    if not first:
        return inapplicable("run-to-run", "no repeated runs")
    bad = {arm: int(bitwise_differ_mask(first[arm], second[arm]).sum()) for arm in first}
    return run_to_run_verdict(list(first), {arm: n for arm, n in bad.items() if n})
