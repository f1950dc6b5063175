"""The exact reference: int32 accumulators, headroom predictions and bit-exact epilogue models.

Accumulator. Every product of two int8 values is an integer of magnitude ≤ 2¹⁴. A float GEMM whose
every partial sum is an integer the format holds exactly is exact *whatever* order, blocking or
fused multiply-adds the BLAS uses. For fp32 that holds over any K-chunk of ≤ 1024 terms
(1024 · 2¹⁴ = 2²⁴); the chunk results are then summed in int64. So the emulator computes fp32
GEMMs over K-chunks of 1024 — exact by construction, faster than one fp64 GEMM — provided fp32
matmuls really run in fp32 (`torch.get_float32_matmul_precision() == "highest"`, the default);
otherwise it falls back to one fp64 GEMM (exact for K ≤ 2³⁹: partial sums < 2⁵³).

Epilogue models. A kernel's epilogue is a short program over fp32: convert the int32 accumulator
(round to nearest even), multiply by the two scales in some order (each product rounded to fp32),
maybe add a bias, and round to the output dtype. PyTorch's CPU fp32 elementwise operations and
casts are IEEE round-to-nearest-even, so running the same program with torch on the CPU gives
the bits an IEEE-conforming GPU would. The one operation CPUs do not offer through torch is a
fused multiply-add; `fma_f32` emulates it exactly (see its docstring).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from alibi.errors import InputError
from alibi.exact.numerics import round_to

if TYPE_CHECKING:  # annotations only: tiles/ sits above exact/ (tests/test_layers.py)
    from alibi.tiles.tile import Tile

Order = Literal["w_then_a", "a_then_w", "product_first"]
BiasMode = Literal["fma", "add_before_cast", "add_after_cast"]
ORDERS: tuple[str, ...] = ("w_then_a", "a_then_w", "product_first")
BIAS_MODES: tuple[str, ...] = ("fma", "add_before_cast", "add_after_cast")
ROUND_BETWEEN = "round_between"
STATISTICS = "absmax_stats*"
ABSMAX_LEVELS = 127.0  # a symmetric int8 absmax statistic is 127 times the scale

FP32_EXACT_LIMIT = 2**24
INT32_LIMIT = 2**31
_LOW_WORD = 0 if sys.byteorder == "little" else 1  # where an int64's low 32-bit word lies


@dataclass(frozen=True)
class EpilogueModel:
    """How a kernel turns an int32 accumulator into its output.

    order: which scale multiplies first — `w_then_a` = `RN32(s_a·RN32(s_w·acc))` (vLLM CUTLASS),
      `a_then_w` = `RN32(s_w·RN32(s_a·acc))` (vLLM Triton), `product_first` = `RN32(acc·RN32(s_a·s_w))`.
    bias: how a bias enters — `fma`: fused into the last multiplication, one rounding;
      `add_before_cast`: a separate fp32 add before the output cast; `add_after_cast`: the
      output is cast first, then the bias is added and the sum cast again (two roundings).
    round_between: the first scaled product is rounded to the output dtype before the second
      scale multiplies it (TorchAO's W8A8 linear: `out(RN32(acc·s_a))`, then `· s_w` in fp32);
      written `+round_between` after the bias mode. Only for the two orders that have a first
      product (`product_first` multiplies the accumulator once).
    statistics: a statistics-based dequantization (bitsandbytes' `int8_mm_dequant`): the scales enter as absmax
      statistics `RN32(127·s)` (exact where the kernel's adapter accepts the operands), the scale program runs on
      them, and the result is multiplied by this fp32 constant (≈ 1/127²) — fused with the bias under `fma`
      (with a zero bias when there is none, as the CUDA kernel does), else rounded before the bias is added.
      Written `+absmax_stats*<constant>`.
    """

    order: Order
    bias: BiasMode = "fma"
    round_between: bool = False
    statistics: float | None = None

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise InputError(f"epilogue order {self.order!r} is unknown; choose one of {', '.join(ORDERS)}")
        if self.bias not in BIAS_MODES:
            raise InputError(f"bias mode {self.bias!r} is unknown; choose one of {', '.join(BIAS_MODES)}")
        if self.statistics is not None:  # the constant is an fp32 value: kept as the fp32 the kernel multiplies by
            object.__setattr__(self, "statistics", float(np.float32(self.statistics)))
        if self.round_between and self.order == "product_first":
            raise InputError("round_between rounds the first of two scaled products; product_first multiplies the "
                             "accumulator once, so it has none: use w_then_a or a_then_w with round_between")

    @property
    def name(self) -> str:
        return (f"{self.order}+{self.bias}" + (f"+{ROUND_BETWEEN}" if self.round_between else "")
                + ("" if self.statistics is None else f"+{STATISTICS}{self.statistics:.9g}"))

    @classmethod
    def parse(cls, text: str) -> EpilogueModel:
        """`w_then_a`, `a_then_w+add_after_cast`, `a_then_w+add_before_cast+round_between`, ... (bias mode
        defaults to `fma`)."""
        order, *rest = text.split("+")
        round_between = ROUND_BETWEEN in rest
        stats = [r for r in rest if r.startswith(STATISTICS)]
        rest = [r for r in rest if r != ROUND_BETWEEN and not r.startswith(STATISTICS)]
        if len(rest) > 1 or len(stats) > 1:
            raise InputError(f"epilogue model {text!r}: expected <order>[+<bias mode>][+{ROUND_BETWEEN}]"
                             f"[+{STATISTICS}<constant>]")
        constant = None
        if stats:
            try:
                constant = float(np.float32(float(stats[0].removeprefix(STATISTICS))))
            except ValueError:
                raise InputError(f"epilogue model {text!r}: {stats[0]!r} does not end in a number") from None
        return cls(order, rest[0] if rest else "fma", round_between, constant)  # type: ignore[arg-type]


# The epilogues of the two vLLM int8 kernels, read from their source (science.md §3).
VLLM_CUTLASS = EpilogueModel("w_then_a", "fma")
VLLM_TRITON = EpilogueModel("a_then_w", "add_after_cast")
# TorchAO 0.18's W8A8 linear (Int8Tensor, alibi/kernels/torchao.py): out(RN32(acc·s_a)), · s_w in fp32, + bias in fp32.
TORCHAO_INT8 = EpilogueModel("a_then_w", "add_before_cast", round_between=True)


EXACT_FP32_CHUNK = FP32_EXACT_LIMIT // 2**14  # 1024 products of magnitude ≤ 2^14 sum to ≤ 2^24


def exact_accumulator(a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """The exact accumulator `a_q @ w_qᵀ` as int64 [M,N], on the operands' device.

    On a GPU: one fp64 GEMM (cuBLAS DGEMM, a different path from the int8 kernels under test), exact
    because every partial sum is an integer below 2⁵³ whatever the order (K ≤ 2³⁹). On the CPU:
    chunked fp32 GEMMs (module docstring); dtype conversions go through numpy there, because
    torch's CPU int8→float and float→int64 casts are not vectorized and cost more than the GEMM.
    """
    if a_q.dtype != torch.int8 or w_q.dtype != torch.int8:
        raise InputError(f"exact_accumulator needs int8 operands, got {a_q.dtype} and {w_q.dtype}")
    if a_q.device.type == "cuda":
        w_q = w_q.to(a_q.device)
        return (a_q.to(torch.float64) @ w_q.to(torch.float64).T).to(torch.int64)
    a, w = a_q.detach().cpu().numpy(), w_q.detach().cpu().numpy()
    if torch.get_float32_matmul_precision() != "highest":
        acc64 = torch.from_numpy(a.astype(np.float64)) @ torch.from_numpy(w.astype(np.float64)).T
        return torch.from_numpy(acc64.numpy().astype(np.int64))
    acc = None
    for k0 in range(0, a.shape[1], EXACT_FP32_CHUNK):
        part = (torch.from_numpy(a[:, k0:k0 + EXACT_FP32_CHUNK].astype(np.float32))
                @ torch.from_numpy(w[:, k0:k0 + EXACT_FP32_CHUNK].astype(np.float32)).T).numpy()
        acc = part.astype(np.int64) if acc is None else np.add(acc, part.astype(np.int64), out=acc)
    return torch.from_numpy(acc)


def int32_wrap(acc: torch.Tensor) -> torch.Tensor:
    """The value an int32 register holds for an integer accumulator (two's-complement wrap); an int32 tensor is
    that already.

    The wrap of a two's-complement int64 is its low 32-bit word, read here as int32 (no arithmetic, one copy, and
    no need to know first whether any value is out of range)."""
    if acc.dtype == torch.int32:
        return acc
    words = acc.to(torch.int64).contiguous().reshape(-1).view(torch.int32)
    return words[_LOW_WORD::2].reshape(acc.shape)


def fma_f32(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Exactly rounded fp32 fused multiply-add `RN32(x·y + z)`, on the inputs' device.

    `x·y` of two fp32 values is exact in fp64 (48 ≤ 53 significant bits). The fp64 sum `s = p + z`
    may round; TwoSum recovers its error `e` exactly, so `p + z = s + e`. Rounding `s` to fp32
    equals rounding `s + e` unless `s` lies exactly halfway between two fp32 neighbours and `e ≠ 0`:
    fp32 midpoints are fp64 numbers, so if `s + e` were on the other side of a midpoint `m ≠ s`,
    `m` would be a closer fp64 value than `s` — impossible. In the halfway case the exact value
    lies strictly on the side of `e`, and that neighbour is the answer. At the overflow boundary the
    neighbour of ±FLT_MAX is ±2¹²⁸, so `s = ±(2¹²⁸ − 2¹⁰³)` is a halfway case too: the fp64 cast
    rounds it to ±inf, and a residual towards zero makes the answer ±FLT_MAX. (fp64 overflow of `s`
    cannot happen for fp32 operands.) Only IEEE fp64 +, −, × and the fp64→fp32 cast are used, so the
    result is the same on the CPU and on a GPU (tests/exact/test_emulator_device.py holds them equal).
    """
    x, y, z = torch.broadcast_tensors(x.to(torch.float32), y.to(torch.float32), z.to(torch.float32))
    p = x.to(torch.float64) * y.to(torch.float64)
    zn = z.to(torch.float64)
    s = p + zn
    bv = s - p
    err = (p - (s - bv)) + (zn - bv)
    r = s.to(torch.float32)
    # An overflow rounds to ±inf; for the halfway test the neighbour beyond ±FLT_MAX is ±2¹²⁸ (the
    # next point of the fp32 grid with an unbounded exponent, where IEEE puts the overflow
    # threshold): s = 2¹²⁸ − 2¹⁰³ is exactly halfway, and a negative residual means FLT_MAX.
    r64 = torch.where(torch.isinf(r) & torch.isfinite(s), torch.copysign(torch.full_like(s, 2.0**128), s),
                      r.to(torch.float64))
    toward = torch.where(r64 < s, torch.full_like(r, math.inf), torch.full_like(r, -math.inf))
    other = torch.nextafter(r, toward)
    other64 = other.to(torch.float64)
    halfway = ((r64 + other64) / 2 == s) & (r64 != s)
    toward_other = torch.sign(err) == torch.sign(other64 - s)
    return torch.where(halfway & (err != 0) & toward_other & torch.isfinite(err), other, r).contiguous()


def apply_epilogue(
    model: EpilogueModel,
    acc: torch.Tensor,
    s_a: torch.Tensor,
    s_w: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """Run `model` bit-exactly: integer accumulator [M,N] → `out_dtype` [M,N], on `acc`'s device.

    `acc` may be int64 (as from `exact_accumulator`); it is first taken to int32 the way the
    hardware register holds it, then converted to fp32 with round-to-nearest-even.
    `s_a` is [M] (or [1]), `s_w` is [N] (or [1]). Every step is one IEEE fp32 operation (or
    `fma_f32`) and a round-to-nearest-even cast, so a GPU gives the CPU's bits. A batch of units runs at
    once with leading dimensions: `acc` [B, M, N], `s_a` [B, M] (or [B, 1]), `s_w` and `bias` [B, N]; every
    operation is elementwise, so each unit gets the bits it gets alone.
    """
    dev = acc.device
    lead = acc.shape[:-2]
    accf = int32_wrap(acc).to(torch.float32) if not acc.is_floating_point() else acc.to(torch.float32)
    sa = s_a.to(dev, torch.float32).reshape(*lead, -1, 1)
    sw = s_w.to(dev, torch.float32).reshape(*lead, 1, -1)
    if bias is not None:
        bias = bias.to(dev, torch.float32).reshape(*lead, 1, -1)
    if model.statistics is not None:
        return _statistics_epilogue(model, accf, sa * ABSMAX_LEVELS, sw * ABSMAX_LEVELS, bias, out_dtype)
    if model.order == "w_then_a":
        first, last = accf * sw, sa
    elif model.order == "a_then_w":
        first, last = accf * sa, sw
    else:
        first, last = accf, sa * sw
    if model.round_between:
        first = round_to(first, out_dtype).to(torch.float32)
    if bias is None:
        return round_to(first * last, out_dtype)
    b = bias
    if model.bias == "fma":
        return round_to(fma_f32(last, first, b), out_dtype)
    if model.bias == "add_before_cast":
        return round_to(first * last + b, out_dtype)
    cast = round_to(first * last, out_dtype).to(torch.float32)
    return round_to(cast + b, out_dtype)


def _statistics_epilogue(model: EpilogueModel, accf: torch.Tensor, row: torch.Tensor, col: torch.Tensor,
                         bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """`model.statistics`: the scale program on the statistics `row`, `col`, then `· constant` and the bias (fp32,
    shaped to broadcast against `accf`, or None)."""
    if model.order == "product_first":
        y = accf * (row * col)
    else:
        first, last = (accf * col, row) if model.order == "w_then_a" else (accf * row, col)
        if model.round_between:
            first = round_to(first, out_dtype).to(torch.float32)
        y = first * last
    c = torch.full((), model.statistics, dtype=torch.float32, device=accf.device)  # no host copy: capturable
    if model.bias == "fma":
        b = torch.zeros((*y.shape[:-2], 1, y.shape[-1]), device=y.device) if bias is None else bias
        return round_to(fma_f32(y, c, b), out_dtype)
    if bias is None:
        return round_to(y * c, out_dtype)
    b = bias
    if model.bias == "add_before_cast":
        return round_to(y * c + b, out_dtype)
    return round_to(round_to(y * c, out_dtype).to(torch.float32) + b, out_dtype)


def run_model(model: EpilogueModel, tile: Tile, acc: torch.Tensor | None = None) -> torch.Tensor:
    """The output `model` prescribes for `tile` (computing the exact accumulator unless given)."""
    if acc is None:
        acc = exact_accumulator(tile.a_q, tile.w_q)
    return apply_epilogue(model, acc, tile.s_a, tile.s_w, tile.bias, tile.out_dtype)


@dataclass(frozen=True)
class Prediction:
    """What the exact emulation says about a tile before any kernel runs.

    product_bound: the largest |a·w| the operands allow (16256 when at most one operand contains
      −128, 16384 when both do); k_limit: the largest K with `product_bound·K < 2³¹`;
    int32_safe: K ≤ k_limit, so no int32 accumulator can wrap (check 2);
    fp32_lossless: max|acc| ≤ 2²⁴, so every accumulator enters fp32 exactly (check 3);
    headroom_bits: log2(2²⁴ / max|acc|) (inf for an all-zero accumulator);
    prediction: `bitwise-safe` when both hold — then two correct kernels may differ only in their
      epilogue arithmetic — else `eligible-to-diverge`.
    """

    max_abs_acc: int
    headroom_bits: float
    product_bound: int
    k_limit: int
    int32_safe: bool
    fp32_lossless: bool
    prediction: str


def product_bound(a_q: torch.Tensor, w_q: torch.Tensor) -> int:
    return _bound(bool((a_q == -128).any()), bool((w_q == -128).any()))


def _bound(a_has_min: bool, w_has_min: bool) -> int:
    """The largest |a·w|: 128² only when both operands contain −128."""
    return 128 * 128 if (a_has_min and w_has_min) else 128 * 127


def predict(a_q: torch.Tensor, w_q: torch.Tensor, acc: torch.Tensor | None = None) -> Prediction:
    """Headroom and safety prediction for one int8 GEMM from its exact accumulator."""
    if acc is None:
        acc = exact_accumulator(a_q, w_q)
    max_abs = int(acc.abs().max()) if acc.numel() else 0
    return prediction(max_abs, bool((a_q == -128).any()), bool((w_q == -128).any()), a_q.shape[1])


def prediction(max_abs: int, a_has_min: bool, w_has_min: bool, K: int) -> Prediction:
    """The prediction from its three measurements: the exact max|acc|, and whether each operand contains −128
    (`predict` measures them on one tile; the conformance pipeline on a batch of tiles at once)."""
    bound = _bound(a_has_min, w_has_min)
    k_limit = (INT32_LIMIT - 1) // bound
    int32_safe = K <= k_limit
    lossless = max_abs <= FP32_EXACT_LIMIT
    headroom = math.inf if max_abs == 0 else math.log2(FP32_EXACT_LIMIT / max_abs)
    return Prediction(max_abs, headroom, bound, k_limit, int32_safe, lossless,
                      "bitwise-safe" if (int32_safe and lossless) else "eligible-to-diverge")


def predict_tile(tile: Tile, acc: torch.Tensor | None = None) -> Prediction:
    if tile.fmt != "int8":
        raise InputError(f"tile {tile.name!r}: headroom predictions apply to int8 tiles, not {tile.fmt}")
    return predict(tile.a_q, tile.w_q, acc)
