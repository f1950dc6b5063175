"""The arithmetic facts the integer alibi rests on, checked through each kernel (the paper's §VI).

For every available int8 kernel, four groups of facts, each observed in the kernel's own output
bits (or its exposed accumulator), on tiles built so that the fact and its negation give
different bits:

1. `round-trip`: ±(2²⁴−1) and ±2²⁴ convert int32 → fp32 exactly, ±(2²⁴+1) do not (they round to
   ±2²⁴, ties to even), ±(2²⁴+2) do. A tile whose accumulators are exactly these values runs with
   s_a = 1 and a weight scale chosen per value so that the value's fp32 image and each of its two
   fp32 neighbours land on different sides of a bf16 rounding midpoint: the output is monotone in
   the converted value, so matching both probes pins the converted value down to one fp32 number.
2. `exact-accumulation`: the int32 accumulator equals the int64 reference for random operands
   (−128 included) and all-(−128) operands up to K = 32768 (2²⁹, the largest sum an int8 GEMM
   reaches there), checked on the exposed accumulator and on the output against the declared
   epilogue model. M and N stay tiny so the Triton interpreter does K = 32768 in seconds. K = 1 is
   included: a one-element reduction is a degenerate layout, and layouts are where paths break.
3. `pow2-commutation`: with power-of-two weight scales across the exponent range (2⁻¹⁴⁰ … 2¹¹⁰),
   every element whose result and intermediates are normal, and every element whose result is a
   signed zero (+0 from a zero accumulator, −0 from a negative one scaled below 2⁻¹⁵⁰), is
   bitwise the same under all three scale orders and equals the kernel's output; and for
   subnormal results commutation fails (the orders disagree on some element) while the kernel
   still follows its own declared order there.
4. `bf16-midpoint`: fp32 values exactly on a bf16 rounding midpoint round to the even neighbour,
   one fp32 ulp below to the lower and one above to the upper (in magnitude), both signs, at
   several exponents — through the kernel's output cast (s_a = 1, s_w = 2ᵏ, so the fp32 value
   before the cast is exactly acc·2ᵏ; acc = m·2¹⁵ + δ with m odd, 257 ≤ m < 512, lies in
   [2²³, 2²⁴) where fp32 integers are one ulp apart).

The result is a `BoundaryReport` (schema `alibi.boundary/v1`, see docs/positive-controls.md),
stamped with the toolkit and the environment it ran in.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from alibi.errors import InputError
from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator
from alibi.exact.numerics import bits, bitwise_differ_mask, bitwise_equal_mask
from alibi.governance.environment import environment_record, toolkit_record
from alibi.io.typed import TypedResult
from alibi.kernels.base import Kernel, private_copy
from alibi.kernels.registry import get_kernel, kernel_names
from alibi.tiles.tile import Tile

SCHEMA = "alibi.boundary/v1"
TWO24 = 2**24
ROUND_TRIP_VALUES = (TWO24 - 1, TWO24, TWO24 + 1, TWO24 + 2)
EXACTLY_REPRESENTABLE = {TWO24 - 1: True, TWO24: True, TWO24 + 1: False, TWO24 + 2: True}
ACCUMULATION_CASES = (("random", 1), ("random", 1000), ("random", 4097), ("random", 32768),
                      ("all-minus-128", 1000), ("all-minus-128", 32768))
POW2_EXPONENTS = (-140, -110, -90, -60, -30, -7, 0, 30, 60, 90, 110)
MIDPOINT_MANTISSAS = (257, 259)  # 257: the tie goes down to the even 256; 259: up to the even 260
MIDPOINT_EXPONENTS = (-100, -23, 0, 50)
ORDERS = ("w_then_a", "a_then_w", "product_first")
_TARGET_K = 1042  # enough int8 pairs to build any |acc| ≤ 2²⁴ + 2 exactly (see `target_operands`)


# --- result types ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Fact:
    """One fact checked on one kernel: `group` (round-trip, exact-accumulation, pow2-commutation,
    bf16-midpoint), `fact` (its identifier within the group), `statement` (the claim), `holds`,
    `detail` (one sentence saying what was observed) and `evidence` (the numbers)."""

    group: str
    fact: str
    statement: str
    holds: bool
    detail: str
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class KernelFacts:
    """The facts of one kernel; `available` False (with `how` saying why) means none could be checked."""

    kernel: str
    available: bool
    how: str
    epilogue_model: str | None
    facts: tuple[Fact, ...]

    @property
    def all_hold(self) -> bool:
        return all(f.holds for f in self.facts)


@dataclass(frozen=True)
class BoundaryReport(TypedResult):
    """Every kernel's facts, stamped with where they were observed (schema `alibi.boundary/v1`).

    all_hold: every fact of every available kernel holds and at least one kernel was available.
    """

    SCHEMA = SCHEMA
    REMEDY = "re-run `alibi boundary`"

    schema: str
    created_at: str
    toolkit: Mapping[str, Any]
    environment: Mapping[str, Any]
    kernels: tuple[KernelFacts, ...]
    all_hold: bool

    @property
    def exit_code(self) -> int:
        return 0 if self.all_hold else 1


# --- operands with a prescribed accumulator ----------------------------------------------------------

def target_operands(targets: Iterable[int], N: int, K: int = _TARGET_K) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 A [len(targets), K] and W [N, K] whose exact accumulator is `targets[m]` in every column.

    Every weight row is 127 except a last 1: acc = 127·Σₖ<K−1 aₖ + a_{K−1}. For |v|: u = round(v/127),
    written as q entries of 127 and one of u − 127q, and the remainder v − 127u (|·| ≤ 63) last.
    """
    targets = list(targets)
    a = torch.zeros((len(targets), K), dtype=torch.int64)
    for m, v in enumerate(targets):
        u = round(abs(v) / 127)
        q, r = divmod(u, 127)
        if q + 2 > K:
            raise InputError(f"target accumulator {v} needs K ≥ {q + 2}")
        a[m, :q] = 127
        a[m, q] = r
        a[m, K - 1] = abs(v) - 127 * u
        a[m] *= 1 if v >= 0 else -1
    w = torch.full((N, K), 127, dtype=torch.int8)
    w[:, K - 1] = 1
    return a.to(torch.int8), w


def _run(kernel: Kernel, tile: Tile):
    """One launch on private operands, with the kernel's accumulator (the boundary checks read it)."""
    return kernel.run(private_copy(tile), accumulator=True)


# --- 1. int32 → fp32 round trip -------------------------------------------------------------------

def _bf16_out(f: float, s: float) -> int:
    """bf16 bits of RN32(f · s) for fp32 `f`, `s` (what every scale order gives when s_a = 1)."""
    y = torch.tensor([f], dtype=torch.float32) * torch.tensor([s], dtype=torch.float32)
    return int(bits(y.to(torch.bfloat16))[0])


def separating_scale(f: float, neighbour: float, start: float = 0.75) -> float:
    """An fp32 scale s with bf16(RN32(f·s)) ≠ bf16(RN32(neighbour·s)): a bf16 rounding midpoint lies between.

    The two products are about one fp32 ulp apart, so s must put f·s within an ulp of a bf16
    midpoint, on the right side, with the tie going the right way. Which scales do depends on how
    f's significand meets the fp32 grid (for f = 2²⁴ every f·s is exact, for f = 2²⁴ − 1 the products
    drift by 2⁻²⁴ of an ulp per step of s), so the search walks bf16 midpoints upward from f·start
    and tries the scales within 8 fp32 ulps of midpoint/f for each; the check itself is exact.
    """
    target = abs(f) * start
    e = math.floor(math.log2(target))
    step = 2.0 ** (e - 7)  # bf16 spacing in [2^e, 2^(e+1))
    first = math.floor(target / step)
    for j in range(128):
        midpoint = (first + j + 0.5) * step  # halfway between two bf16 neighbours
        s0 = np.float32(midpoint / abs(f))
        up = down = s0
        for _ in range(9):
            for s in (up, down):
                if _bf16_out(f, float(s)) != _bf16_out(neighbour, float(s)):
                    return float(s)
            up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(0))
    raise RuntimeError(f"no separating scale found for {f} against {neighbour}")


def round_trip_facts(kernel: Kernel) -> list[Fact]:
    values = [s * v for v in ROUND_TRIP_VALUES for s in (1, -1)]
    images = [float(np.float32(v)) for v in values]
    scales, probes = [], []
    for m, f in enumerate(images):
        for side, toward in (("below", -math.inf), ("above", math.inf)):
            nb = float(np.nextafter(np.float32(f), np.float32(toward)))
            scales.append(separating_scale(f, nb))
            probes.append((m, side, nb))
    a, w = target_operands(values, len(scales))
    tile = Tile("round-trip", a, torch.ones(len(values)), w, torch.tensor(scales, dtype=torch.float32))
    out = bits(_run(kernel, tile).out)
    facts = []
    for m, v in enumerate(values):
        f = images[m]
        observed = {}
        for col, (row, side, nb) in enumerate(probes):
            if row != m:
                continue
            got, want, other = int(out[m, col]), _bf16_out(f, scales[col]), _bf16_out(nb, scales[col])
            observed[side] = {"scale": scales[col], "output_bits": got, "bits_if_converted_to_fp32_image": want,
                              "bits_if_converted_to_neighbour": other, "neighbour": nb}
        pinned = all(o["output_bits"] == o["bits_if_converted_to_fp32_image"] for o in observed.values())
        exact = pinned and f == v
        expected = EXACTLY_REPRESENTABLE[abs(v)]
        holds = pinned and exact == expected
        claim = "round-trips int32 → fp32 exactly" if expected else f"does not round-trip (RN32 gives {f:.0f})"
        if not pinned:
            detail = f"the kernel did not convert {v} to RN32({v}) = {f:.0f}: a probe output differs"
        else:
            detail = f"converted to {f:.0f}" + (" (exact)" if f == v else f" (≠ {v})")
        facts.append(Fact("round-trip", f"{v:+d}", f"{v:+d} {claim}", holds, detail,
                          {"value": v, "fp32_image": f, "probes": observed}))
    return facts


# --- 2. exact accumulation -------------------------------------------------------------------------

def accumulation_tile(kind: str, K: int, seed: int = 0, M: int = 2, N: int = 3) -> Tile:
    g = torch.Generator().manual_seed(seed + K)
    if kind == "all-minus-128":
        a = torch.full((M, K), -128, dtype=torch.int8)
        w = torch.full((N, K), -128, dtype=torch.int8)
    else:
        a = torch.randint(-128, 128, (M, K), generator=g, dtype=torch.int8)
        w = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
    s_a = (torch.rand(M, generator=g) + 0.5) * 2.0**-10
    s_w = (torch.rand(N, generator=g) + 0.5) * 2.0**-10
    return Tile(f"{kind}-K{K}", a, s_a, w, s_w)


def accumulation_facts(kernel: Kernel) -> list[Fact]:
    facts = []
    for kind, K in ACCUMULATION_CASES:
        tile = accumulation_tile(kind, K)
        reference = exact_accumulator(tile.a_q, tile.w_q)
        result = _run(kernel, tile)
        ev: dict[str, Any] = {"M": tile.M, "K": K, "N": tile.N, "max_abs_reference": int(reference.abs().max())}
        problems = []
        if result.acc is not None:
            wrong = result.acc.to(torch.int64) != reference
            ev["accumulator_mismatches"] = int(wrong.sum())
            if bool(wrong.any()):
                at = wrong.nonzero()[0].tolist()
                ev["first"] = {"at": at, "got": int(result.acc[tuple(at)]), "expected": int(reference[tuple(at)])}
                problems.append(f"{int(wrong.sum())} of {wrong.numel()} accumulators differ from the int64 reference")
        else:
            ev["accumulator_mismatches"] = None
        if kernel.epilogue is not None:
            model = apply_epilogue(kernel.epilogue, reference, tile.s_a, tile.s_w, None, tile.out_dtype)
            n = int(bitwise_differ_mask(result.out, model).sum())
            ev["output_mismatches_vs_declared_model"] = n
            if n:
                problems.append(f"{n} outputs differ from the declared model on the exact accumulator")
        seen = "accumulator" if result.acc is not None else "output only (no exposed accumulator)"
        facts.append(Fact("exact-accumulation", f"{kind}:K={K}",
                          f"{kind} int8 operands at K = {K}: the int32 accumulator equals the int64 reference",
                          not problems, "; ".join(problems) or f"exact ({seen}; max |acc| {ev['max_abs_reference']})",
                          ev))
    return facts


# --- 3. pow2 commutation ----------------------------------------------------------------------------

def pow2_tile(seed: int = 0) -> Tile:
    """Rows: 0 all zero (acc = 0), 1 a −1 accumulator with a tiny scale, 2–6 ordinary scales, 7–11 tiny
    scales; columns: s_w = 2ᵏ for k in POW2_EXPONENTS. Results span normal, subnormal and underflow."""
    g = torch.Generator().manual_seed(seed)
    M, K = 12, 64
    a = torch.randint(-127, 128, (M, K), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (len(POW2_EXPONENTS), K), generator=g, dtype=torch.int8)
    a[0] = 0
    a[1] = 0
    a[1, 0] = -1
    w[:, 0] = 1
    s_a = (torch.rand(M, generator=g) + 0.5) * 2.0**-7
    s_a[7:] = (torch.rand(M - 7, generator=g) + 0.5) * 2.0**-100
    s_a[1] = 2.0**-100
    s_w = torch.tensor([2.0**k for k in POW2_EXPONENTS], dtype=torch.float32)
    return Tile("pow2-sweep", a, s_a, w, s_w)


def pow2_subnormal_tile(seed: int = 0) -> Tile:
    """Accumulators near 2²⁰ (int8 values in [119, 127]) under s_a ≈ 2⁻⁷ and s_w = 2⁻¹⁴⁰ … 2⁻¹³³: the
    scale product s_a·2ᵏ is subnormal (2 to 9 significant bits) and the results straddle 2⁻¹²⁶."""
    g = torch.Generator().manual_seed(seed)
    M, K, N = 16, 64, 8
    a = (127 - torch.randint(0, 9, (M, K), generator=g)).to(torch.int8)
    w = (127 - torch.randint(0, 9, (N, K), generator=g)).to(torch.int8)
    s_a = (torch.rand(M, generator=g) + 0.5) * 2.0**-7
    s_w = torch.tensor([2.0**k for k in range(-140, -140 + N)], dtype=torch.float32)
    return Tile("pow2-subnormal", a, s_a, w, s_w)


def _pow2_classes(tile: Tile, out: torch.Tensor) -> dict[str, torch.Tensor]:
    acc = exact_accumulator(tile.a_q, tile.w_q)
    models = {o: apply_epilogue(EpilogueModel(o), acc, tile.s_a, tile.s_w, None, tile.out_dtype) for o in ORDERS}
    # Exact values in fp64 (ints ≤ 2²⁰ times fp32 scales and powers of two: ≤ 44 bits, no rounding).
    accd, sa, sw = acc.double(), tile.s_a.double()[:, None], tile.s_w.double()[None, :]
    tiny, big = 2.0**-126, float(torch.finfo(torch.float32).max)

    def normal(x: torch.Tensor) -> torch.Tensor:
        return (x.abs() >= tiny) & (x.abs() < big)

    value = accd * sa * sw
    # The first product of either order (acc·s_a, acc·2ᵏ) must be normal; acc·(s_a·2ᵏ) also needs a
    # normal s_a·2ᵏ for a normal result. A result below 2⁻¹⁵¹ rounds to a signed zero in every order
    # (product_first's s_a·2ᵏ then is below 2⁻¹⁵¹ too, rounds to +0, and acc·(+0) keeps acc's sign).
    first_ok = (normal(accd * sa) & normal(accd * sw)) | (accd == 0)
    is_normal = first_ok & normal(sa * sw) & normal(value)
    is_zero = (accd == 0) | (first_ok & (value.abs() < 2.0**-151))
    # A subnormal anywhere on the way: the result, or a product one of the orders rounds (acc·s_a,
    # s_a·2ᵏ; acc·2ᵏ is a multiple of 2⁻¹⁴⁹ for k ≥ −149 and never rounds). Rounding a subnormal keeps
    # fewer than 24 bits, so `rnd(x)·2ᵏ = rnd(x·2ᵏ)` no longer holds and the orders can part.
    def subnormal(x: torch.Tensor) -> torch.Tensor:
        return (x.abs() > 0) & (x.abs() < tiny)

    is_subnormal = ~is_zero & (subnormal(value) | subnormal(accd * sa) | subnormal(sa * sw)) & (accd != 0)
    agree = bitwise_equal_mask(models["w_then_a"], models["a_then_w"]) & \
        bitwise_equal_mask(models["a_then_w"], models["product_first"])
    return {"normal": is_normal, "zero": is_zero, "subnormal": is_subnormal, "agree": agree,
            "follows": bitwise_equal_mask(out, models["a_then_w"]) & agree, "out": out,
            "exponent": torch.log2(tile.s_w.double())[None, :].expand_as(value).round().long(),
            **{f"model:{o}": m for o, m in models.items()}}


def pow2_facts(kernel: Kernel) -> list[Fact]:
    own = kernel.epilogue.order if kernel.epilogue else None
    sweep, sub = (_pow2_classes(t, _run(kernel, t).out) for t in (pow2_tile(), pow2_subnormal_tile()))
    is_normal, is_zero, follows, out = sweep["normal"], sweep["zero"], sweep["follows"], sweep["out"]
    facts = []
    n = int(is_normal.sum())
    bad = int((is_normal & ~follows).sum())
    ks = sorted(set(sweep["exponent"][is_normal].tolist()))
    facts.append(Fact("pow2-commutation", "normal", "for normal results, (acc·s_a)·2ᵏ, (acc·2ᵏ)·s_a and acc·(s_a·2ᵏ) "
                      "round to the same bits, and the kernel gives them", n > 0 and bad == 0,
                      f"{n - bad} of {n} normal elements agree across the orders and the kernel "
                      f"(k from {ks[0] if ks else None} to {ks[-1] if ks else None})",
                      {"normal_elements": n, "mismatches": bad, "exponents": ks}))
    zeros = is_zero & follows
    pos = int((zeros & ~torch.signbit(out)).sum())
    neg = int((zeros & torch.signbit(out)).sum())
    zbad = int((is_zero & ~follows).sum())
    facts.append(Fact("pow2-commutation", "signed-zeros", "results +0 and −0 commute too: every order and the "
                      "kernel give the same signed zero", zbad == 0 and pos > 0 and neg > 0,
                      f"{pos} elements +0 and {neg} elements −0 agree; {zbad} differ",
                      {"positive_zeros": pos, "negative_zeros": neg, "mismatches": zbad}))
    ns = int(sweep["subnormal"].sum() + sub["subnormal"].sum())
    vllm_pair = sum(int((c["subnormal"] & bitwise_differ_mask(c["model:w_then_a"], c["model:a_then_w"])).sum())
                    for c in (sweep, sub))
    disagree = int((sweep["subnormal"] & ~sweep["agree"]).sum() + (sub["subnormal"] & ~sub["agree"]).sum())
    off = None if own is None else sum(int((c["subnormal"] & bitwise_differ_mask(c["out"], c[f"model:{own}"])).sum())
                                       for c in (sweep, sub))
    facts.append(Fact("pow2-commutation", "subnormal-failure", "once a result or a rounded product is subnormal, "
                      "commutation fails (the scale orders disagree), and the kernel still follows its declared order",
                      disagree > 0 and off == 0,
                      f"on {disagree} of {ns} elements with a subnormal result or product the three orders disagree; "
                      "the kernel "
                      + ("declares no order" if own is None else f"differs from its declared {own} on {off}"),
                      {"subnormal_elements": ns, "orders_disagree": disagree,
                       "w_then_a_vs_a_then_w_disagree": vllm_pair, "off_declared_order": off}))
    return facts


# --- 4. bf16 midpoints -------------------------------------------------------------------------------

def midpoint_cases() -> list[tuple[int, int, int]]:
    """(sign, m, δ): accumulators sign·(m·2¹⁵ + δ) for the midpoint mantissas, δ ∈ {−1, 0, +1}."""
    return [(s, m, d) for s in (1, -1) for m in MIDPOINT_MANTISSAS for d in (-1, 0, 1)]


def expected_midpoint_rounding(sign: int, m: int, delta: int, k: int) -> float:
    """Round-to-nearest-even of sign·(m·2¹⁵ + δ)·2ᵏ to bf16, from the integers alone.

    The bf16 neighbours of m·2¹⁵ (m odd, 2⁸ < m < 2⁹) are (m−1)·2¹⁵ and (m+1)·2¹⁵; δ = −1 rounds to
    the lower magnitude, δ = +1 to the upper, δ = 0 is the tie, which goes to the neighbour whose
    8-bit significand (m ± 1)/2 is even.
    """
    lower, upper = m - 1, m + 1
    if delta < 0:
        pick = lower
    elif delta > 0:
        pick = upper
    else:
        pick = lower if (lower // 2) % 2 == 0 else upper
    return sign * pick * 2.0 ** (15 + k)


def midpoint_facts(kernel: Kernel) -> list[Fact]:
    cases = midpoint_cases()
    a, w = target_operands([s * (m * 2**15 + d) for s, m, d in cases], len(MIDPOINT_EXPONENTS))
    s_w = torch.tensor([2.0**k for k in MIDPOINT_EXPONENTS], dtype=torch.float32)
    out = _run(kernel, Tile("bf16-midpoints", a, torch.ones(len(cases)), w, s_w)).out
    facts = []
    for label, deltas in (("tie-to-even", (0,)), ("one-ulp-below", (-1,)), ("one-ulp-above", (1,))):
        wrong, n = [], 0
        for row, (s, m, d) in enumerate(cases):
            if d not in deltas:
                continue
            for col, k in enumerate(MIDPOINT_EXPONENTS):
                n += 1
                want = torch.tensor([expected_midpoint_rounding(s, m, d, k)], dtype=torch.float64).to(torch.bfloat16)
                if int(bits(out[row:row + 1, col]).item()) != int(bits(want).item()):
                    wrong.append({"acc": s * (m * 2**15 + d), "k": k, "got": float(out[row, col]),
                                  "expected": float(want)})
        statement = {"tie-to-even": "an fp32 value exactly on a bf16 midpoint rounds to the even neighbour",
                     "one-ulp-below": "one fp32 ulp below a bf16 midpoint rounds to the lower magnitude",
                     "one-ulp-above": "one fp32 ulp above a bf16 midpoint rounds to the upper magnitude"}[label]
        facts.append(Fact("bf16-midpoint", label, statement + " (through the kernel's output cast)", not wrong,
                          f"{n - len(wrong)} of {n} elements as predicted" + (f"; first: {wrong[0]}" if wrong else ""),
                          {"elements": n, "mismatches": len(wrong), "first": wrong[0] if wrong else None,
                           "exponents": list(MIDPOINT_EXPONENTS), "mantissas": list(MIDPOINT_MANTISSAS)}))
    return facts


# --- the suite ---------------------------------------------------------------------------------------

FACT_GROUPS: tuple[Callable[[Kernel], list[Fact]], ...] = (round_trip_facts, accumulation_facts, pow2_facts,
                                                          midpoint_facts)


def default_kernels() -> list[str]:
    """Every registered int8 kernel that is an implementation (not a reference emulator, not a mutant)."""
    names = []
    for name in kernel_names():
        if name.startswith(("emulator:", "mutant:")):
            continue
        if "int8" in get_kernel(name).formats:
            names.append(name)
    return names


def check_kernel(name: str, kernel: Kernel, progress: Callable[[str], None] | None = None) -> KernelFacts:
    ok, how = kernel.available()
    if not ok:
        return KernelFacts(name, False, how, kernel.epilogue.name if kernel.epilogue else None, ())
    if "int8" not in kernel.formats:
        raise InputError(f"kernel {name!r} handles {', '.join(kernel.formats)} operands; the boundary facts are "
                         "about int8 kernels")
    facts: list[Fact] = []
    for group in FACT_GROUPS:
        facts += group(kernel)
        if progress:
            progress(f"{name}: {group.__name__.removesuffix('_facts').replace('_', '-')} done")
    return KernelFacts(name, True, how, kernel.epilogue.name if kernel.epilogue else None, tuple(facts))


def run_boundary(names: Iterable[str] | None = None, progress: Callable[[str], None] | None = None) -> BoundaryReport:
    """The facts for `names` (default: every int8 implementation, unavailable ones listed as such).

    An explicitly named kernel that is unavailable here raises KernelUnavailable (exit 3).
    """
    explicit = names is not None
    names = list(dict.fromkeys(names)) if explicit else default_kernels()
    kernels = [(n, get_kernel(n)) for n in names]
    if explicit:
        for _, k in kernels:
            k.require_available()
            if "int8" not in k.formats:
                raise InputError(f"kernel {k.name!r} handles {', '.join(k.formats)} operands; the boundary facts "
                                 "are about int8 kernels")
    results = tuple(check_kernel(n, k, progress) for n, k in kernels)
    ran = [r for r in results if r.available]
    return BoundaryReport(SCHEMA, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), toolkit_record(),
                          environment_record(), results, bool(ran) and all(r.all_hold for r in ran))


def summary_lines(report: BoundaryReport) -> list[str]:
    groups = ("round-trip", "exact-accumulation", "pow2-commutation", "bf16-midpoint")
    width = max([len(k.kernel) for k in report.kernels] + [6])
    lines = [(f"alibi boundary ({report.environment.get('cpu')}; gpus: "
              f"{', '.join(g['name'] for g in report.environment.get('gpus', [])) or 'none'})"),
             f"  {'kernel':<{width}}  " + "  ".join(f"{g:>18}" for g in groups)]
    for k in report.kernels:
        if not k.available:
            lines.append(f"  {k.kernel:<{width}}  not available here: {k.how}")
            continue
        cells = []
        for g in groups:
            fs = [f for f in k.facts if f.group == g]
            held = sum(f.holds for f in fs)
            cells.append(f"{held}/{len(fs)} hold" if held == len(fs) else f"{held}/{len(fs)} FAIL")
        lines.append(f"  {k.kernel:<{width}}  " + "  ".join(f"{c:>18}" for c in cells))
        lines += [f"    FAILED {f.group} {f.fact}: {f.detail}" for f in k.facts if not f.holds]
    lines.append(f"  verdict: {'all facts hold' if report.all_hold else 'SOME FACT FAILS'}")
    return lines


__all__ = ["SCHEMA", "BoundaryReport", "Fact", "KernelFacts", "default_kernels", "expected_midpoint_rounding",
           "run_boundary", "separating_scale", "summary_lines", "target_operands"]
