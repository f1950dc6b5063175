"""The exact model of Hopper's FP8 tensor-core accumulation: one MMA step, a chain of steps, promotion, split-K.

An fp8 GEMM's accumulator is not exact: every product of two fp8 values is (a few significant bits each), but
the tensor core adds them in a reduced-precision datapath. The model, as published by Xie et al. ("MMA-Sim",
arXiv 2511.10909) and Khattak & Mikaitis ("Accurate Models of NVIDIA Tensor Cores", arXiv 2512.07004) for the
sm_90 `wgmma` FP8 instruction and measured on this project's GPUs by `alibi probe fp8-mma`
(`alibi.controls.fp8_probe`), is one *step* per k = 32 products:

1. The 32 exact products `a_i·b_i` and the incoming fp32 accumulator `C` are the terms. A product's nominal
   exponent is `ea + eb` and its significand `sa·sb` lies in [0, 4) (not renormalised); an fp8 subnormal keeps
   its format's minimum exponent (e4m3 −6, e5m2 −14) with a significand below 1. A zero product counts with
   exponent −126 (it cannot raise the alignment); `C`'s exponent is its fp32 exponent (−126 when subnormal or zero).
2. `E` is the largest exponent among the terms (`c_joins_alignment`: C is one of them). Every term is cut to the
   grid `2^(E − align_bits)` (`align_cut`: toward zero as published, or toward −∞ as a sign-fill shift would).
3. The cut terms are summed exactly; the sum is renormalised and cut to `result_bits` fractional bits
   (`result_cut`): an fp32 whose 10 low mantissa bits are zero.
4. NaN/Inf follow IEEE through the exact sum; a NaN result is `nan_bits`; an exact zero sum is +0 whatever the
   signs of the zero terms (measured on the H100: all −0 products with C = −0 give +0, where IEEE addition gives −0).

A *chain* feeds each step's result to the next as `C` (a kernel's accumulator register across its K loop). A
*promotion* adds a chain into a separate full-fp32 accumulator every `promotion_k` products and starts a fresh
chain (CUTLASS's default sm90 FP8 mainloop: FADD every 4 `wgmma`); `split_k` sums independently accumulated K
ranges in fp32 in a declared order. `AccumulationSchedule` is the declaration a kernel makes beside its epilogue;
`accumulate` computes the fp32 accumulator it prescribes, bit for bit.

Arithmetic. Everything runs in float64 torch on any device and is exact: a product has at most 8 significant
bits (e4m3) or 6 (e5m2); scaling it by `2^(align_bits − E)` is exact (powers of two, far from fp64's range ends);
a cut term is an integer below `2^(align_bits + 2)`, and 33 of them sum below `2^(align_bits + 8)` < 2⁵³. The
renormalised result has at most 14 significant bits, so its cast to fp32 is exact (or overflows to ±inf).
`alibi.exact.fp8_reference` is an independent scalar implementation in Python integers that the tests hold this
one to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch

from alibi.errors import InputError

Cut = Literal["toward_zero", "toward_minus_inf", "nearest"]
CUTS: tuple[str, ...] = ("toward_zero", "toward_minus_inf", "nearest")  # nearest: ties to even
KOrder = Literal["contiguous", "pair-interleaved"]
K_ORDERS: tuple[str, ...] = ("contiguous", "pair-interleaved")
"""Which products one instruction takes: `contiguous`, k after k; `pair-interleaved`, of each 2k products the
first instruction takes the pairs at even pair index (products 0, 1, 4, 5, …), the second the odd ones."""
ZERO_EXPONENT = -126  # a zero term's exponent: fp32's smallest normal exponent, below any nonzero fp8 product's
CANONICAL_NAN = 0x7FFFFFFF


@dataclass(frozen=True)
class StepModel:
    """One tensor-core MMA step (module docstring). The defaults are the published Hopper `wgmma` FP8 model.

    k: products per step; align_bits: the terms are cut to `2^(E − align_bits)`; align_cut: how;
    result_bits / result_cut: the renormalised sum keeps this many fractional bits, cut so; c_joins_alignment: the
    incoming accumulator is one of the aligned terms (else the products are aligned among themselves and C is added
    to their cut sum before the result cut); zero_from_fields: a zero product's exponent is `ea + eb` read from the
    operands' exponent fields (a zero's field reads as the format's minimum exponent) instead of −126;
    nan_bits: the fp32 bit pattern of a NaN result; k_order: which products one instruction takes (`K_ORDERS`);
    f16_operands: the fp8 operands reach the tensor core converted to f16, where every e4m3 subnormal is normal, so
    an operand's exponent is its value's (floor(log2|x|)), not its field's.
    """

    k: int = 32
    align_bits: int = 13
    align_cut: Cut = "toward_zero"
    result_bits: int = 13
    result_cut: Cut = "toward_zero"
    c_joins_alignment: bool = True
    zero_from_fields: bool = False
    nan_bits: int = CANONICAL_NAN
    k_order: KOrder = "contiguous"
    f16_operands: bool = False

    def __post_init__(self) -> None:
        if self.k < 1 or not 1 <= self.align_bits <= 30 or not 1 <= self.result_bits <= 23:
            raise InputError(f"step model: k={self.k}, align_bits={self.align_bits}, result_bits={self.result_bits} "
                             "out of range (k ≥ 1, 1 ≤ align_bits ≤ 30, 1 ≤ result_bits ≤ 23)")
        for name in ("align_cut", "result_cut"):
            if getattr(self, name) not in CUTS:
                raise InputError(f"step model: {name}={getattr(self, name)!r}; choose one of {', '.join(CUTS)}")
        if self.k_order not in K_ORDERS:
            raise InputError(f"step model: k_order={self.k_order!r}; choose one of {', '.join(K_ORDERS)}")

    @property
    def period(self) -> int:
        """The products a chain is cut into whole instructions by: k, or 2k where two instructions share their
        products between them (`k_order`); a chain's length is a multiple of it (zero-padded)."""
        return self.k if self.k_order == "contiguous" else 2 * self.k

    @property
    def name(self) -> str:
        base = f"k{self.k}/e8m{self.result_bits}"
        extras = [f"align{self.align_bits}"] if self.align_bits != self.result_bits else []
        extras += [f"{n}:{v}" for n, v in (("align", self.align_cut), ("result", self.result_cut))
                   if v != "toward_zero"]
        extras += [] if self.c_joins_alignment else ["c-after"]
        extras += ["zero-fields"] if self.zero_from_fields else []
        extras += [] if self.k_order == "contiguous" else [self.k_order]
        extras += ["f16-operands"] if self.f16_operands else []
        return "+".join([base, *extras])


WGMMA_FP8 = StepModel()
"""The published (and, on this project's H100/H200, measured: docs/fp8.md) model of sm_90 `wgmma` FP8 steps."""
TRITON_F16_MMA = StepModel(k=16, align_bits=25, result_bits=23, k_order="pair-interleaved", f16_operands=True)
"""A Triton 3.6 fp8 `tl.dot` below 64 rows on sm_90: `mma.sync.m16n8k16.f32.f16.f16.f32` on the operands converted
to f16. The step is the published Hopper `mma` model (Xie et al., "MMA-Sim": 16 products and C aligned to 25
fractional bits, cut toward zero, the sum cut toward zero to fp32); which products one instruction takes is Triton's
8-bit operand layout: of each 32 products the first instruction takes those at (i // 2) even, the second the rest.
Both read from 176 recorded chains on an H100 (45,056 outputs, every bit: analysis/results/cpu/mma16-fit). The
operands' exponents are their f16 values' (the instruction's input format); those chains fit that reading and the
fields' alike, and a hand-worked case tells them apart (tests/exact/test_fp8_mma.py)."""


# --- operands ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Fp8Operand:
    """An fp8 tensor decoded once: exact values (float64; NaN/±inf where the byte is one), nominal exponents
    (int32: the format's minimum exponent for subnormals and zeros) and the zero mask."""

    value: torch.Tensor
    exponent: torch.Tensor
    zero: torch.Tensor


_FORMAT = {torch.float8_e4m3fn: (3, 7, 0xF), torch.float8_e5m2: (2, 15, 0x1F)}  # mantissa bits, bias, exp mask


def decode(x: torch.Tensor) -> Fp8Operand:
    """Decode an e4m3fn or e5m2 tensor (module docstring, step 1)."""
    if x.dtype not in _FORMAT:
        raise InputError(f"fp8 operands must be float8_e4m3fn or float8_e5m2, got {x.dtype}")
    mant_bits, bias, exp_mask = _FORMAT[x.dtype]
    raw = x.view(torch.uint8).to(torch.int32)
    field = (raw >> mant_bits) & exp_mask
    exponent = torch.where(field == 0, torch.full_like(field, 1 - bias), field - bias)
    value = x.to(torch.float64)
    return Fp8Operand(value, exponent, value == 0)


def fp32_exponent(c: torch.Tensor) -> torch.Tensor:
    """The exponent of fp32 values as the step aligns them: their biased exponent field less 127, −126 for
    subnormals and zeros (int32)."""
    field = (c.to(torch.float32).contiguous().view(torch.int32) >> 23) & 0xFF
    return torch.where(field == 0, torch.full_like(field, -126), field - 127)


def as_instruction_sees(x: Fp8Operand, model: StepModel) -> Fp8Operand:
    """`x` [..., K] (K a multiple of `model.period`) as the instruction takes it: its products reordered so that
    every k consecutive ones are one instruction's (`k_order`), its exponents its values' where the operands are
    converted to f16 first (`f16_operands`)."""
    if model.f16_operands:
        finite = ~x.zero & torch.isfinite(x.value)
        _, ex = torch.frexp(torch.where(finite, x.value, torch.ones_like(x.value)))
        x = Fp8Operand(x.value, torch.where(finite, ex.to(torch.int32) - 1, x.exponent), x.zero)
    if model.k_order == "contiguous":
        return x
    K = x.value.shape[-1]
    if K % model.period:
        raise InputError(f"{model.name}: K={K} is not a multiple of the instructions' period {model.period}")
    i = torch.arange(model.period)
    chunk = torch.cat([i[(i // 2) % 2 == 0], i[(i // 2) % 2 == 1]])
    order = (torch.arange(0, K, model.period)[:, None] + chunk[None]).reshape(-1).to(x.value.device)
    return Fp8Operand(x.value[..., order], x.exponent[..., order], x.zero[..., order])


def instruction_operands(a_q: torch.Tensor, w_q: torch.Tensor, model: StepModel) -> tuple[Fp8Operand, Fp8Operand, int]:
    """fp8 `a_q` [M, K] and `w_q` [N, K] on `a_q`'s device, K zero-padded to a multiple of the step's period (the
    zero byte is +0 in both formats, as a masked-off load reads it: a zero product counts nothing), decoded as the
    instruction sees them (`as_instruction_sees`); and the padded K."""
    pad = -a_q.shape[-1] % model.period
    if pad:
        a_q, w_q = (torch.nn.functional.pad(x.view(torch.uint8), (0, pad)).view(x.dtype) for x in (a_q, w_q))
    a, w = (as_instruction_sees(decode(x.to(a_q.device)), model) for x in (a_q, w_q))
    return a, w, a_q.shape[-1]


# --- one step ---------------------------------------------------------------------------------------------

def _cut(x: torch.Tensor, how: str) -> torch.Tensor:
    if how == "nearest":
        return torch.round(x)  # half to even
    return torch.trunc(x) if how == "toward_zero" else torch.floor(x)


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """2^e (float64) for an integer tensor with −1022 ≤ e ≤ 1023, built from its bit pattern: exact on every device.
    (`torch.pow(2.0, e)` is not: on the H100 it returned values a few ulps off, which moved cuts by one unit.)"""
    return ((e.to(torch.int64) + 1023) << 52).view(torch.float64)


def step(prod: torch.Tensor, prod_exp: torch.Tensor, c: torch.Tensor, model: StepModel = WGMMA_FP8) -> torch.Tensor:
    """One MMA step: fp32 `c` [...] plus the exact products `prod` [..., k] (float64) whose nominal exponents are
    `prod_exp` [..., k] (int32: `ea + eb`, read from the fields), as the tensor core adds them (fp32 result)."""
    c32 = c.to(torch.float32)
    c64 = c32.to(torch.float64)
    special = ~torch.isfinite(prod).all(-1) | ~torch.isfinite(c64)
    p = torch.where(torch.isfinite(prod), prod, torch.zeros_like(prod))
    cv = torch.where(torch.isfinite(c64), c64, torch.zeros_like(c64))
    # A product is zero exactly when an operand is (the smallest nonzero fp8 product, 2^-18, is far from underflow).
    pexp = prod_exp if model.zero_from_fields else torch.where(p == 0, torch.full_like(prod_exp, ZERO_EXPONENT),
                                                               prod_exp)
    cexp = fp32_exponent(c32)
    top = pexp.amax(-1) if pexp.shape[-1] else torch.full_like(cexp, ZERO_EXPONENT)
    E = torch.maximum(top, cexp) if model.c_joins_alignment else top
    up = _pow2(model.align_bits - E)
    total = _cut(p * up.unsqueeze(-1), model.align_cut).sum(-1)
    if model.c_joins_alignment:
        total = total + _cut(cv * up, model.align_cut)
        value = total / up
    else:
        value = total / up + cv  # exact in float64: both lie on grids far above 2^-1074, within 2^53 of each other's
    result = _renormalise(value, model)
    # An exact zero sum is +0, even when every term is −0 (measured: the hardware's sum has no sign of zero)
    out = torch.where(result == 0, torch.zeros_like(result), result).to(torch.float32)
    if bool(special.any()):
        out = torch.where(special, _special(prod, c64, model), out)
    return out


def _renormalise(value: torch.Tensor, model: StepModel) -> torch.Tensor:
    """`value` cut to `result_bits` fractional bits of its own binade (zero stays zero)."""
    _, ex = torch.frexp(value)  # value = m·2^ex, 0.5 ≤ |m| < 1, so floor(log2|value|) = ex − 1
    scale = _pow2(model.result_bits - (ex.to(torch.int32) - 1))
    return torch.where(value == 0, value, _cut(value * scale, model.result_cut) / scale)


def _special(prod: torch.Tensor, c64: torch.Tensor, model: StepModel) -> torch.Tensor:
    """The fp32 result of a step with a NaN or infinite term: NaN (`nan_bits`) for any NaN or for +inf and −inf
    together, else the infinity."""
    terms = torch.cat([prod, c64.unsqueeze(-1)], -1)
    nan = torch.isnan(terms).any(-1) | ((terms == math.inf).any(-1) & (terms == -math.inf).any(-1))
    inf = torch.where((terms == math.inf).any(-1), math.inf, -math.inf).to(torch.float32)
    nan_value = torch.tensor(model.nan_bits & 0xFFFFFFFF, dtype=torch.int64).to(torch.int32).view(torch.float32)
    return torch.where(nan, nan_value.to(inf.device).expand_as(inf), inf)


def products(a: Fp8Operand, b: Fp8Operand) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact products `a·b` (float64, broadcasting) and their nominal exponents `ea + eb` (int32; `step` decides
    what a zero product's exponent is)."""
    return a.value * b.value, a.exponent + b.exponent


def dot_steps(a: Fp8Operand, b: Fp8Operand, c: torch.Tensor, model: StepModel = WGMMA_FP8) -> torch.Tensor:
    """A chain of steps over dot products given as rows: `a`, `b` [..., K] (K a multiple of `model.k`), `c` [...]
    the initial accumulator; returns the fp32 result [...] (the probes' form of the model)."""
    K = a.value.shape[-1]
    if K % model.period:
        raise InputError(f"dot_steps: K={K} is not a multiple of the step's period {model.period}")
    a, b = as_instruction_sees(a, model), as_instruction_sees(b, model)
    acc = c.to(torch.float32)
    for k0 in range(0, K, model.k):
        sl = slice(k0, k0 + model.k)
        prod, pexp = products(_part(a, sl), _part(b, sl))
        acc = step(prod, pexp, acc, model)
    return acc


def _part(x: Fp8Operand, sl: slice) -> Fp8Operand:
    return Fp8Operand(x.value[..., sl], x.exponent[..., sl], x.zero[..., sl])


# --- schedules --------------------------------------------------------------------------------------------

Reduction = Literal["ascending", "descending", "nondeterministic"]


@dataclass(frozen=True)
class SplitK:
    """K cut into `parts` contiguous ranges (each a multiple of `granule` products, as even as that allows, the
    first ones longer), each accumulated on its own, then summed in fp32 (`reduction`: ascending order from zero,
    i.e. `((0 + p0) + p1) + …`, or descending, `((0 + pₙ) + pₙ₋₁) + …`; `nondeterministic`: an order that varies
    from run to run, e.g. atomics)."""

    parts: int
    granule: int = 128
    reduction: Reduction = "ascending"

    def ranges(self, K: int) -> list[tuple[int, int]]:
        units = -(-K // self.granule)
        parts = max(1, min(self.parts, units))
        base, extra = divmod(units, parts)
        out, start = [], 0
        for i in range(parts):
            n = (base + (1 if i < extra else 0)) * self.granule
            out.append((start, min(K, start + n)))
            start += n
        return out


@dataclass(frozen=True)
class AccumulationSchedule:
    """How a kernel accumulates an fp8 GEMM: the declaration `alibi` holds it to, beside its epilogue.

    step: the MMA step model (its instruction's); promotion_k: every this many products (a multiple of step.k,
      counted from the start of each K range) the chain is added into a full fp32 accumulator with one fp32
      addition and restarted from zero; None: never (one chain over the range, "fast accumulation");
    split_k: None (one K range), or the ranges and their reduction. `nondeterministic` is a legal declaration:
      `accumulate` then refuses, and conformance reports the pair not judged, naming the shape.
    label: a short name for reports (`fast-accum`, `promote-128`, ...).
    """

    label: str
    step: StepModel = field(default=WGMMA_FP8)
    promotion_k: int | None = None
    split_k: SplitK | None = None

    def __post_init__(self) -> None:
        if self.promotion_k is not None and (self.promotion_k <= 0 or self.promotion_k % self.step.k):
            raise InputError(f"schedule {self.label!r}: promotion_k={self.promotion_k} must be a positive multiple "
                             f"of the step's k={self.step.k}")

    @property
    def deterministic(self) -> bool:
        return self.split_k is None or self.split_k.reduction != "nondeterministic"

    def describe(self) -> str:
        promo = "never promoted" if self.promotion_k is None else f"fp32 FADD every {self.promotion_k} k"
        split = "" if self.split_k is None else (f", split-K into {self.split_k.parts} parts of {self.split_k.granule}-k "
                                                 f"granules, {self.split_k.reduction} fp32 reduction")
        return f"{self.label}: {self.step.name} steps in ascending k, {promo}{split}"

    def chains(self, K: int) -> list[list[tuple[int, int]]]:
        """The K ranges of each chain, grouped by split part: within a part, chains are promoted in order."""
        parts = self.split_k.ranges(K) if self.split_k else [(0, K)]
        out = []
        for start, end in parts:
            span = self.promotion_k or max(end - start, 1)
            out.append([(k0, min(end, k0 + span)) for k0 in range(start, end, span)])
        return out

    def boundaries(self, K: int) -> list[int]:
        """The k offsets (multiples of step.k) where one chain ends and another starts: a product before and one
        after such an offset are never cut against each other (what the schedule probe measures)."""
        return sorted({r[0] for part in self.chains(K) for r in part} - {0})


FAST_ACCUM = AccumulationSchedule("fast-accum")
PROMOTE_128 = AccumulationSchedule("promote-128", promotion_k=128)
SCHEDULE_SYNTAX = "fast-accum, promote-<k>, split-<parts>x<granule>[+promote-<k>] (k a multiple of 32)"


def parse_schedule(text: str, step_model: StepModel = WGMMA_FP8) -> AccumulationSchedule:
    """A schedule from its label (`SCHEDULE_SYNTAX`): `fast-accum`, `promote-128`, `split-4x128+promote-128`."""
    def number(part: str, prefix: str) -> int:
        try:
            return int(part.removeprefix(prefix))
        except ValueError:
            raise InputError(f"accumulation schedule {text!r}: {part!r} is not {prefix}<number>; use "
                             f"{SCHEDULE_SYNTAX}") from None
    parts = text.split("+")
    promotion, split = None, None
    for part in parts:
        if part == "fast-accum" and len(parts) == 1:
            continue
        if part.startswith("promote-"):
            promotion = number(part, "promote-")
        elif part.startswith("split-") and "x" in part:
            count, _, granule = part.removeprefix("split-").partition("x")
            split = SplitK(number(count, ""), number(granule, ""))
        else:
            raise InputError(f"accumulation schedule {text!r}: unknown part {part!r}; use {SCHEDULE_SYNTAX}")
    if split is not None and split.parts < 1 or split is not None and split.granule % step_model.k:
        raise InputError(f"accumulation schedule {text!r}: split-K needs ≥ 1 part and a granule that is a multiple "
                         f"of {step_model.k}")
    return AccumulationSchedule(text, step_model, promotion, split)


def accumulate(schedule: AccumulationSchedule, a_q: torch.Tensor, w_q: torch.Tensor, *,
               max_elements: int = 2**24) -> torch.Tensor:
    """The fp32 accumulator [M, N] that `schedule` prescribes for fp8 `a_q` [M, K] and `w_q` [N, K], on their
    device; K is padded with zeros to a multiple of the step (as kernels' masked loads do: zero products count
    nothing). `max_elements` bounds the float64 products held at once (rows of the output at a time)."""
    if not schedule.deterministic:
        raise InputError(f"schedule {schedule.label!r} declares a nondeterministic reduction: its accumulator "
                         "cannot be predicted bit for bit")
    if a_q.dim() != 2 or w_q.dim() != 2 or a_q.shape[1] != w_q.shape[1]:
        raise InputError(f"accumulate: operands must be A [M,K] and W [N,K]; got {list(a_q.shape)} and "
                         f"{list(w_q.shape)}")
    M, K = a_q.shape
    N = w_q.shape[0]
    kstep = schedule.step.k
    a, w, Kp = instruction_operands(a_q, w_q, schedule.step)
    rows = max(1, min(M, max_elements // max(1, N * kstep)))
    out = torch.empty((M, N), dtype=torch.float32, device=a_q.device)
    for m0 in range(0, M, rows):
        ar = Fp8Operand(a.value[m0:m0 + rows, None, :], a.exponent[m0:m0 + rows, None, :], a.zero[m0:m0 + rows, None, :])
        wr = Fp8Operand(w.value[None], w.exponent[None], w.zero[None])
        out[m0:m0 + rows] = _scheduled(schedule, ar, wr, Kp)
    return out


def _scheduled(schedule: AccumulationSchedule, a: Fp8Operand, w: Fp8Operand, K: int) -> torch.Tensor:
    shape = torch.broadcast_shapes(a.value.shape[:-1], w.value.shape[:-1])
    zero = torch.zeros(shape, dtype=torch.float32, device=a.value.device)
    total = zero
    parts = schedule.chains(K)
    if schedule.split_k is not None and schedule.split_k.reduction == "descending":
        parts = parts[::-1]
    for part in parts:
        main = zero
        for k0, k1 in part:
            chain = zero
            for s0 in range(k0, k1, schedule.step.k):
                sl = slice(s0, s0 + schedule.step.k)
                prod, pexp = products(_part(a, sl), _part(w, sl))
                chain = step(prod, pexp, chain, schedule.step)
            main = chain if schedule.promotion_k is None else main + chain  # fp32 FADD (RN) at each promotion
        total = main if schedule.split_k is None else total + main
    return total


def accumulate_prefixes(schedule: AccumulationSchedule, a_q: torch.Tensor, w_q: torch.Tensor,
                        Ks: list[int]) -> dict[int, torch.Tensor]:
    """`accumulate(schedule, a_q[:, :K], w_q[:, :K])` for every K of `Ks` (multiples of the step's k) in one pass
    over the steps (the depth sweep's nested prefixes); schedules without split-K only."""
    if schedule.split_k is not None or not schedule.deterministic:
        raise InputError(f"accumulate_prefixes: schedule {schedule.label!r} splits K; use accumulate per K")
    kstep, period = schedule.step.k, schedule.step.period
    if any(K % period or K <= 0 for K in Ks):
        raise InputError(f"accumulate_prefixes: every K must be a positive multiple of {period}, got {Ks}")
    a, w = (as_instruction_sees(decode(x[..., :max(Ks)]), schedule.step)
            for x in (a_q[:, None, :], w_q.to(a_q.device)[None]))
    zero = torch.zeros((a_q.shape[0], w_q.shape[0]), dtype=torch.float32, device=a_q.device)
    main, chain, out = zero, zero, {}
    for s0 in range(0, max(Ks), kstep):
        sl = slice(s0, s0 + kstep)
        prod, pexp = products(_part(a, sl), _part(w, sl))
        chain = step(prod, pexp, chain, schedule.step)
        end = s0 + kstep
        if schedule.promotion_k is not None and end % schedule.promotion_k == 0:
            main, chain = main + chain, zero
        if end in Ks:  # a residue chain is added as the kernel's last promotion does
            out[end] = chain if schedule.promotion_k is None else (main if end % schedule.promotion_k == 0
                                                                   else main + chain)
    return out


__all__ = ["AccumulationSchedule", "CUTS", "FAST_ACCUM", "Fp8Operand", "K_ORDERS", "PROMOTE_128", "SCHEDULE_SYNTAX",
           "SplitK", "StepModel", "TRITON_F16_MMA", "WGMMA_FP8", "ZERO_EXPONENT", "accumulate", "accumulate_prefixes",
           "as_instruction_sees", "decode", "dot_steps", "fp32_exponent", "instruction_operands", "parse_schedule",
           "products", "step"]
