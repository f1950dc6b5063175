"""`alibi probe fp8-mma`: measure the tensor core's fp8 MMA step from crafted inputs, then from random ones.

Method (Fasi, Higham, Mikaitis & Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021, and its
successors): each *family* of crafted dot products isolates one feature of the step, and the instrument
(`alibi.kernels.triton_mma`: raw `tl.dot` chains compiled to `wgmma` or `mma.sync`) computes them on the GPU. Every
output is compared bit for bit with the published model (`alibi.exact.fp8_mma.WGMMA_FP8`) and with *alternative
hypotheses*, each the published model with one parameter changed (alignment width, cut direction, result width,
whether C joins the alignment, what a zero's exponent is, products per step). A parameter is measured when the
hardware's bits match the published value on every case and each alternative fails somewhere: the result says,
per family, which hypotheses reproduce every output. Then ≥ 2^20 random dot products (operands drawn from every
finite fp8 byte, so exponents spread; C zero, on the model's e8m13 grid, or an arbitrary fp32) and random chains
are compared with the model bit for bit. Whatever the hardware does is the answer; where it disagrees with the
model, the result lists the first cases.

Every crafted case is a dot product `C + Σ a_i·b_i` given as bytes; a family's cases are laid on the diagonal of
one launch (case i is output (i, i) with `C` there; the off-diagonal outputs, other valid dot products with C = 0,
are compared too).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch

from alibi.exact.fp8_mma import WGMMA_FP8, Fp8Operand, StepModel, decode, dot_steps
from alibi.exact.numerics import bits
from alibi.io.typed import TypedResult

SCHEMA = "alibi.fp8-mma-probe/v1"
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def fp8_byte(x: float, dtype: torch.dtype = E4M3) -> int:
    """The byte of `x` in `dtype`, which must hold it exactly."""
    t = torch.tensor([x], dtype=torch.float64).to(dtype)
    if t.to(torch.float64).item() != x and not (math.isnan(x) and math.isnan(t.to(torch.float64).item())):
        raise ValueError(f"{x!r} is not exactly representable in {dtype}")
    return int(t.view(torch.uint8).item())


def f32(x: float) -> float:
    """`x` rounded to fp32 (nearest even)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


@dataclass(frozen=True)
class Case:
    """One crafted dot product: `c + Σ a_i·b_i` over K bytes (a in `fmt_a`, b in `fmt_b`)."""

    label: str
    a: tuple[int, ...]
    b: tuple[int, ...]
    c: float
    fmt_a: torch.dtype = E4M3
    fmt_b: torch.dtype = E4M3


def case(label: str, pairs: list[tuple[float, float]] | dict[int, tuple[float, float]], c: float = 0.0, K: int = 32,
         fmt_a: torch.dtype = E4M3, fmt_b: torch.dtype = E4M3) -> Case:
    """A case from (a, b) value pairs at positions 0, 1, ... (a list) or at given positions (a dict); zeros
    elsewhere."""
    a, b = [0] * K, [0] * K
    items = pairs.items() if isinstance(pairs, dict) else enumerate(pairs)
    for k, (x, y) in items:
        a[k], b[k] = fp8_byte(x, fmt_a), fp8_byte(y, fmt_b)
    return Case(label, tuple(a), tuple(b), f32(c), fmt_a, fmt_b)


def _pow2_pair(e: int) -> tuple[float, float]:
    """Two e4m3 powers of two whose product is 2^e (−18 ≤ e ≤ 16)."""
    hi = max(-9, min(8, math.ceil(e / 2)))
    return 2.0 ** hi, 2.0 ** (e - hi)


# --- the crafted families --------------------------------------------------------------------------------

def alignment() -> Iterator[Case]:
    """1 (or 1.875² = 3.515625, a significand above 2) beside ±2^−j: kept exactly when 2^−j is on the grid
    2^(E − align_bits)."""
    for big in (1.0, 1.875):
        for j in range(8, 19):
            for sign in (1, -1):
                x, y = _pow2_pair(-j)
                yield case(f"{big}^2 {'+' if sign > 0 else '-'} 2^-{j}", [(big, big), (sign * x, y)])


def truncation() -> Iterator[Case]:
    """A large term beside a negative (or positive beside a negative large) small one: toward zero drops it, toward
    −∞ takes a whole grid step; and sums whose renormalised result has bits below the kept width."""
    for j in range(12, 19):
        x, y = _pow2_pair(-j)
        yield case(f"1 - 2^-{j}", [(1.0, 1.0), (-x, y)])
        yield case(f"-1 + 2^-{j}", [(-1.0, 1.0), (x, y)])
        yield case(f"-1 - 2^-{j}", [(-1.0, 1.0), (-x, y)])
    for j in range(10, 16):  # the exact sum has bits below 2^-13 after renormalisation: the result cut shows
        x, y = _pow2_pair(-j)
        yield case(f"1.5 + 0.5 + 2^-{j}", [(1.5, 1.0), (0.5, 1.0), (x, y)])
        yield case(f"-(1.5 + 0.5 + 2^-{j})", [(-1.5, 1.0), (-0.5, 1.0), (-x, y)])


def group() -> Iterator[Case]:
    """A large product at position p and 2^−14 at every other position: the smalls are cut against the large one
    only when they share its step, so the result shows how many products one step adds (and in which groups)."""
    for K in (32, 64):
        for p in range(K):
            pairs = {k: (2.0 ** -7, 2.0 ** -7) for k in range(K)}
            pairs[p] = (1.0, 1.0)
            yield case(f"K{K} 1 at {p}, 2^-14 elsewhere", pairs, K=K)


def c_alignment() -> Iterator[Case]:
    """A large C beside products that are small against it: cut to its grid when C joins the alignment."""
    for e in (4, 8, 10, 12, 13, 14, 16, 20):
        yield case(f"C=2^{e}, 16 x 2^-4", {k: (0.25, 0.25) for k in range(16)}, c=2.0 ** e)
        yield case(f"C=2^{e}, 1", [(1.0, 1.0)], c=2.0 ** e)
        yield case(f"C=-2^{e}, 1 + 2^-3", [(1.0, 1.0), (0.5, 0.25)], c=-(2.0 ** e))


def c_cut() -> Iterator[Case]:
    """C off the e8m13 grid: with zero products (is C cut on entry?) and with products that set the alignment."""
    for value in (1 + 2.0 ** -20, 1 + 2.0 ** -14, -(1 + 2.0 ** -14), 1.9999999, 3.1415927, -2.7182817, 2.0 ** -20 * 1.3,
                  1e-30, 65504.123):
        yield case(f"C={value!r}, zero products", [], c=value)
        yield case(f"C={value!r}, product 1", [(1.0, 1.0)], c=value)
        yield case(f"C={value!r}, product 2^-8", [_pow2_pair(-8)], c=value)


def carry() -> Iterator[Case]:
    """Sums that carry into the next binade or beyond (products with significands up to 3.52)."""
    for n in (2, 3, 8, 16, 31, 32):
        yield case(f"{n} x 1.875^2", [(1.875, 1.875)] * n)
        yield case(f"{n} x 1.875^2 + 2^-9", [(1.875, 1.875)] * (n - 1) + [_pow2_pair(-9)])
        yield case(f"{n} x 1.75*1.875 - 2^-10", [(1.75, 1.875)] * (n - 1) + [(-2.0 ** -5, 2.0 ** -5)])
    yield case("C=2-2^-13 + 2^-13", [_pow2_pair(-13)], c=2 - 2.0 ** -13)
    yield case("C=1.9998779 + 1.875^2", [(1.875, 1.875)], c=2 - 2.0 ** -13)


def cancellation() -> Iterator[Case]:
    """Large terms that cancel beside a small one: the small one was cut against the large exponent."""
    for j in (8, 12, 13, 14, 16):
        x, y = _pow2_pair(-j)
        yield case(f"1 - 1 + 2^-{j}", [(1.0, 1.0), (-1.0, 1.0), (x, y)])
        yield case(f"C=-1: 1 + 2^-{j}", [(1.0, 1.0), (x, y)], c=-1.0)
        yield case(f"C=1: -1 - 2^-{j}", [(-1.0, 1.0), (-x, y)], c=1.0)
    yield case("448^2 - 448^2 + 1", [(448.0, 448.0), (-448.0, 448.0), (1.0, 1.0)])


def subnormals() -> Iterator[Case]:
    """fp8 subnormal operands keep the format's minimum exponent with a significand below 1; fp32 subnormal C."""
    for sub in (2.0 ** -9, 3 * 2.0 ** -9, 7 * 2.0 ** -9):
        for j in range(9, 16):
            x, y = _pow2_pair(-j)
            yield case(f"{sub!r} x 256 + 2^-{j}", [(sub, 256.0), (x, y)])
    for cv in (2.0 ** -130, -(2.0 ** -140), 2.0 ** -149, 1.5 * 2.0 ** -127):
        yield case(f"C={cv!r}, zero products", [], c=cv)
        yield case(f"C={cv!r}, 2^-18", [_pow2_pair(-18)], c=cv)


def zero_exponent() -> Iterator[Case]:
    """0 × 448 (a zero whose partner has a large exponent) beside 1 + 2^-j: if a zero product's exponent came from
    the fields it would raise the alignment."""
    for zero, partner in ((0.0, 448.0), (448.0, 0.0), (-0.0, 448.0)):
        for j in (10, 11, 12, 13):
            x, y = _pow2_pair(-j)
            yield case(f"{zero}x{partner} beside 1 + 2^-{j}", [(zero, partner), (1.0, 1.0), (x, y)])


def chaining() -> Iterator[Case]:
    """Two and four steps: the running accumulator enters each step as C (on the e8m13 grid after the first)."""
    for j in (10, 13, 14, 16):
        x, y = _pow2_pair(-j)
        yield case(f"1 | 2^-{j}", {0: (1.0, 1.0), 32: (x, y)}, K=64)
        yield case(f"2^-{j} | 1", {0: (x, y), 32: (1.0, 1.0)}, K=64)
        yield case(f"1 | -1 | 2^-{j} | 1", {0: (1.0, 1.0), 32: (-1.0, 1.0), 64: (x, y), 96: (1.0, 1.0)}, K=128)
        yield case(f"16 x 2^-{j} each step", {32 * s + i: (x, y) for s in range(4) for i in range(16)}, c=1.0, K=128)


def specials() -> Iterator[Case]:
    """NaN operands, infinite and NaN C, overflow past fp32's range, signed zeros; e5m2 infinities."""
    nan = 0x7F  # e4m3fn NaN
    yield Case("a NaN", (nan,) + (0,) * 31, (fp8_byte(1.0),) + (0,) * 31, 0.0)
    yield case("C=+inf, 1", [(1.0, 1.0)], c=math.inf)
    yield case("C=-inf, 1", [(1.0, 1.0)], c=-math.inf)
    yield case("C=nan, 1", [(1.0, 1.0)], c=math.nan)
    yield case("C=FLT_MAX, 448^2", [(448.0, 448.0)], c=3.4028234663852886e38)
    yield case("C=-FLT_MAX, -448^2", [(-448.0, 448.0)], c=-3.4028234663852886e38)
    yield case("C=2^127*1.99, 32 x 448^2", [(448.0, 448.0)] * 32, c=2.0 ** 127 * 1.99)
    yield case("all -0, C=-0", [(-0.0, 1.0)] * 32, c=-0.0)
    yield case("all +0, C=-0", [], c=-0.0)
    yield case("1 - 1", [(1.0, 1.0), (-1.0, 1.0)])
    yield case("-1 + 1, C=-0", [(-1.0, 1.0), (1.0, 1.0)], c=-0.0)
    inf5 = fp8_byte(math.inf, E5M2)
    one5 = fp8_byte(1.0, E5M2)
    yield Case("e5m2 inf x 1", (inf5,) + (0,) * 31, (one5,) + (0,) * 31, 0.0, E5M2, E5M2)
    yield Case("e5m2 inf - inf", (inf5, inf5) + (0,) * 30, (one5, fp8_byte(-1.0, E5M2)) + (0,) * 30, 0.0, E5M2, E5M2)
    yield Case("e5m2 inf x 0", (inf5,) + (0,) * 31, (0,) * 32, 0.0, E5M2, E5M2)


def e5m2_cases() -> Iterator[Case]:
    """The same features in e5m2 (and e4m3 × e5m2): subnormals keep −14, products of 2-bit significands."""
    for j in range(10, 18):
        x, y = 2.0 ** -(j // 2), 2.0 ** -(j - j // 2)
        yield case(f"e5m2 1 + 2^-{j}", [(1.0, 1.0), (x, y)], fmt_a=E5M2, fmt_b=E5M2)
        yield case(f"e4m3xe5m2 1.875*1.75 + 2^-{j}", [(1.875, 1.75), (x, y)], fmt_a=E4M3, fmt_b=E5M2)
    for sub in (2.0 ** -16, 3 * 2.0 ** -16):
        yield case(f"e5m2 subnormal {sub!r} x 2^8 + 2^-16", [(sub, 256.0), (2.0 ** -8, 2.0 ** -8)], fmt_a=E5M2,
                   fmt_b=E5M2)


FAMILIES: dict[str, Callable[[], Iterator[Case]]] = {
    "alignment": alignment, "truncation": truncation, "group": group, "c-alignment": c_alignment, "c-cut": c_cut,
    "carry": carry, "cancellation": cancellation, "subnormals": subnormals, "zero-exponent": zero_exponent,
    "chaining": chaining, "specials": specials, "e5m2": e5m2_cases,
}


def hypotheses(published: StepModel = WGMMA_FP8) -> dict[str, StepModel]:
    """The published model and its one-parameter departures, by name."""
    alt = {"published": published}
    for n in (12, 14, 15, 16, 23):
        alt[f"align_bits={n}"] = replace(published, align_bits=n)
    for n in (12, 14, 23):
        alt[f"result_bits={n}"] = replace(published, result_bits=n)
    alt["align_cut=toward_minus_inf"] = replace(published, align_cut="toward_minus_inf")
    alt["result_cut=toward_minus_inf"] = replace(published, result_cut="toward_minus_inf")
    alt["sign-fill (both cuts toward -inf)"] = replace(published, align_cut="toward_minus_inf",
                                                       result_cut="toward_minus_inf")
    alt["c_joins_alignment=False"] = replace(published, c_joins_alignment=False)
    alt["zero_from_fields=True"] = replace(published, zero_from_fields=True)
    alt["k=16"] = replace(published, k=16)
    return alt


# --- the result types ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Mismatch:
    """One output that differs from the published model: the case, both fp32 bit patterns (hex)."""

    label: str
    hardware: str
    model: str


@dataclass(frozen=True)
class FamilyResult:
    """One family on one instruction: outputs compared (`n_outputs`: diagonal cases and off-diagonal products),
    how many differ from each hypothesis (`mismatches`, by hypothesis name), the first differences from the
    published model, and `skipped` when the instrument could not run these operands (the reason)."""

    family: str
    n_cases: int
    n_outputs: int
    mismatches: dict[str, int]
    first: tuple[Mismatch, ...]
    skipped: str | None = None

    @property
    def matching(self) -> list[str]:
        return [name for name, n in self.mismatches.items() if n == 0]


@dataclass(frozen=True)
class RandomResult:
    """Random dot products: `steps` per chain, the C distribution, outputs compared and how many differ from the
    published model."""

    label: str
    steps: int
    c_mode: str
    n_outputs: int
    n_differing: int
    first: tuple[Mismatch, ...]


@dataclass(frozen=True)
class InstructionResult:
    """Everything measured on one instruction: the PTX's MMA instructions, each family, the random runs."""

    instruction: str
    ptx: str
    families: tuple[FamilyResult, ...]
    random: tuple[RandomResult, ...]

    @property
    def n_random(self) -> int:
        return sum(r.n_outputs for r in self.random)

    @property
    def n_random_differing(self) -> int:
        return sum(r.n_differing for r in self.random)


@dataclass(frozen=True)
class Fp8ProbeResult(TypedResult):
    """`alibi probe fp8-mma`: the measured step on each instruction, where it ran (device, versions)."""

    SCHEMA = SCHEMA
    JSON_INDENT = 2
    REMEDY = "re-run `alibi probe fp8-mma`"

    device: str
    environment: dict
    published_model: str
    instructions: tuple[InstructionResult, ...]
    schema: str = SCHEMA

    def published_holds(self, instruction: str = "wgmma") -> bool:
        """The published model reproduces every crafted and random output on `instruction`."""
        r = next(i for i in self.instructions if i.instruction == instruction)
        return (all(f.mismatches.get("published") == 0 for f in r.families if f.skipped is None)
                and r.n_random_differing == 0 and r.n_random > 0)


# --- running -------------------------------------------------------------------------------------------------

Instrument = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _hex(x: float) -> str:
    return f"0x{struct.unpack('<I', struct.pack('<f', x))[0]:08x}"


def _batch(cases: list[Case]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    K = len(cases[0].a)
    a = torch.tensor([c.a for c in cases], dtype=torch.uint8).view(cases[0].fmt_a).reshape(len(cases), K)
    b = torch.tensor([c.b for c in cases], dtype=torch.uint8).view(cases[0].fmt_b).reshape(len(cases), K)
    c = torch.zeros((len(cases), len(cases)), dtype=torch.float32)
    c.diagonal().copy_(torch.tensor([x.c for x in cases], dtype=torch.float32))
    return a, b, c


def predict(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, model: StepModel,
            device: torch.device | str = "cpu") -> torch.Tensor:
    """The model's fp32 outputs [M, N] for rows `a` [M, K], `b` [N, K] and C [M, N], computed on `device`, returned
    on the CPU."""
    da, db = decode(a.to(device)), decode(b.to(device))
    ea = Fp8Operand(da.value[:, None, :], da.exponent[:, None, :], da.zero[:, None, :])
    eb = Fp8Operand(db.value[None], db.exponent[None], db.zero[None])
    return dot_steps(ea, eb, c.to(device), model).cpu()


def _differ(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return bits(x) != bits(y)


def _mismatches(hw: torch.Tensor, pred: torch.Tensor, label: Callable[[int, int], str],
                most: int = 8) -> tuple[Mismatch, ...]:
    """The first `most` outputs where the hardware's bits differ from the model's, labelled `label(row, col)`."""
    idx = _differ(hw, pred).nonzero().tolist()[:most]
    return tuple(Mismatch(label(i, j), _hex(hw[i, j].item()), _hex(pred[i, j].item())) for i, j in idx)


def run_family(name: str, instrument: Instrument, models: dict[str, StepModel]) -> list[FamilyResult]:
    """One family's cases, grouped by K and formats, through `instrument` and every hypothesis."""
    groups: dict[tuple, list[Case]] = {}
    for c in FAMILIES[name]():
        groups.setdefault((len(c.a), c.fmt_a, c.fmt_b), []).append(c)
    out = []
    for (K, fa, fb), cases in groups.items():
        label = name if len(groups) == 1 else f"{name} (K={K}, {str(fa)[6:]} x {str(fb)[6:]})"
        a, b, c = _batch(cases)
        try:
            hw = instrument(a, b, c).cpu()
        except Exception as exc:  # noqa: BLE001 - an instrument that cannot take these operands is reported
            out.append(FamilyResult(label, len(cases), 0, {}, (), f"{type(exc).__name__}: {str(exc)[:200]}"))
            continue
        counts, first = {}, ()
        for hyp, model in models.items():
            if K % model.k:
                continue
            pred = predict(a, b, c, model)
            counts[hyp] = int(_differ(hw, pred).sum())
            if hyp == "published":
                first = _mismatches(hw, pred, lambda i, j: cases[i].label if i == j else
                                    f"a of {cases[i].label!r} x b of {cases[j].label!r}")
        out.append(FamilyResult(label, len(cases), hw.numel(), counts, first))
    return out


FINITE_E4M3 = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)


def random_operands(rows: int, K: int, gen: torch.Generator) -> torch.Tensor:
    """`rows` × K e4m3 operands drawn uniformly from every finite byte (so exponents spread over the range)."""
    return FINITE_E4M3[torch.randint(len(FINITE_E4M3), (rows, K), generator=gen)].view(E4M3)


def random_c(M: int, N: int, mode: str, gen: torch.Generator) -> torch.Tensor:
    """C for the random runs: `zero`; `grid`: fp32 values on the e8m13 grid (what a chain carries) with exponents
    over ±24; `any`: arbitrary fp32 bit patterns with exponents over ±40 (not on the grid)."""
    if mode == "zero":
        return torch.zeros((M, N), dtype=torch.float32)
    exp = torch.randint(-40 if mode == "any" else -24, 41 if mode == "any" else 25, (M, N), generator=gen)
    mant = torch.randint(0, 1 << 23, (M, N), generator=gen)
    if mode == "grid":
        mant = mant & ~0x3FF
    sign = torch.randint(0, 2, (M, N), generator=gen)
    u = (sign << 31) | ((exp + 127) << 23) | mant  # int64: the bit pattern as an unsigned 32-bit number
    return ((u + 2**31) % 2**32 - 2**31).to(torch.int32).view(torch.float32)


def run_random(instrument: Instrument, model: StepModel, label: str, M: int, N: int, steps: int, c_mode: str,
               seed: int) -> RandomResult:
    gen = torch.Generator().manual_seed(seed)
    a, b = random_operands(M, 32 * steps, gen), random_operands(N, 32 * steps, gen)
    c = random_c(M, N, c_mode, gen)
    hw = instrument(a, b, c).cpu()
    pred = predict(a, b, c, model, "cuda" if torch.cuda.is_available() else "cpu")
    first = _mismatches(hw, pred, lambda i, j: f"row {i} x col {j}")
    return RandomResult(label, steps, c_mode, hw.numel(), int(_differ(hw, pred).sum()), first)


# (label, M, N, steps per chain, C mode): 3 × 2^20 single steps, and chains
RANDOM_RUNS = (("single step, C = 0", 1024, 1024, 1, "zero"), ("single step, C on the e8m13 grid", 1024, 1024, 1, "grid"),
               ("single step, arbitrary fp32 C", 1024, 1024, 1, "any"), ("chains of 4 steps", 512, 256, 4, "zero"),
               ("chains of 32 steps", 256, 256, 32, "grid"))


def probe_instruction(instruction: str, instrument: Instrument, *, families=tuple(FAMILIES),
                      random_runs=RANDOM_RUNS, seed: int = 0, ptx: str = "") -> InstructionResult:
    models = hypotheses()
    fams = tuple(f for name in families for f in run_family(name, instrument, models))
    rand = tuple(run_random(instrument, models["published"], label, M, N, steps, mode, seed + i)
                 for i, (label, M, N, steps, mode) in enumerate(random_runs))
    return InstructionResult(instruction, ptx, fams, rand)


__all__ = ["FAMILIES", "Case", "Fp8ProbeResult", "InstructionResult", "RandomResult", "hypotheses", "predict",
           "probe_instruction", "run_family", "run_random"]
