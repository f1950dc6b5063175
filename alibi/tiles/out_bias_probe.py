"""Epilogue probes with the bias in the output dtype, for kernels that take it only that way.

`alibi identify` tells the nine epilogue models apart on the `epilogue-probe-bias` preset, whose
bias is fp32: it cancels one output per column to about 2⁻²⁰ of its size, which no bfloat16 or
float16 bias can do. vLLM's CUTLASS op reads the bias in the output dtype (its epilogue loads it
as `ElementD`), so it cannot be given that tile. These two tiles do the same job with an
output-dtype bias:

1. an *order probe* without bias: random int8 operands and fp32 weight scales; each row's
   activation scale is the one among 512 candidates for which the three scale orders give the
   most distinct outputs in the output dtype. Without a bias the bias modes coincide, so this tile
   separates the orders only.
2. a *bias probe*: in each column n, the row r with the largest |acc| is the designed element.
   Column n's weight scale is the one among 2048 candidates for which that element's `w_then_a`
   value y lies closest to a value of the output dtype, and the bias is b = −out(y), exactly
   representable. On that element the bias modes give visibly different results:
   `add_after_cast` computes out(y) + b = 0; `add_before_cast` keeps RN32(y_order) − out(y), a
   residual of about 2⁻²⁰·|y| (the median for seed 0, bfloat16 and float16 alike); `fma` keeps
   the unrounded product instead, which differs from that by the product's fp32 rounding error
   (up to 2⁻²⁴·|y|), a sizeable fraction of the residual, so the output differs. The orders,
   whose fp32 values differ by an ulp, differ in the residual too.

Together every one of the 9 models reproduces a different set of output bits (tested for
bfloat16 and float16 outputs in tests/tiles/test_out_bias_probe.py, by running `alibi.controls.identify` on the
emulator of each model). Every output stays a normal number (subnormal results are where GPU and
interpreter conversions are least trustworthy): for float16 the activation scales are 2⁶ larger,
and candidates whose residual would fall below 16 times float16's smallest normal are not chosen.
"""

from __future__ import annotations

import torch

from alibi.exact.numerics import round_to
from alibi.tiles.tile import Tile

ORDER_CANDIDATES = 512
SCALE_CANDIDATES = 2048
OUT_DTYPES = (torch.bfloat16, torch.float16)


def _activation_scale_base(out_dtype: torch.dtype, max_abs: int) -> float:
    # |y| ≈ 10 with 2⁻⁶ at max_abs 127 (bfloat16); float16 residuals need |y| ≳ 2⁶ to stay normal,
    # hence 2⁰. |acc| grows as max_abs², so smaller operands get proportionally larger scales.
    return (2.0**-6 if out_dtype == torch.bfloat16 else 1.0) * (127 / max_abs) ** 2


def output_ulp(x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """The output dtype's ulp at |x| (for normal x), as fp32."""
    mantissa = 8 if out_dtype == torch.bfloat16 else 11
    return torch.ldexp(torch.ones_like(x), torch.frexp(x.abs())[1] - mantissa)


def order_probe(out_dtype: torch.dtype = torch.bfloat16, seed: int = 0, M: int = 64, K: int = 256,
                N: int = 256, max_abs: int = 127) -> Tile:
    """Tile 1 (see the module docstring): tells the three scale orders apart in `out_dtype`.

    max_abs: operands are uniform integers in [-max_abs, max_abs]; 16 makes them exact e4m3
    values whose every fp32 partial sum is exact (16·16·K < 2²⁴ for K < 65536), for fp8 kernels.
    """
    gen = torch.Generator().manual_seed(seed)
    a_q = torch.randint(-max_abs, max_abs + 1, (M, K), generator=gen, dtype=torch.int8)
    w_q = torch.randint(-max_abs, max_abs + 1, (N, K), generator=gen, dtype=torch.int8)
    acc = (a_q.to(torch.float64) @ w_q.to(torch.float64).T).to(torch.float32)  # exact: |acc| < 2^24
    s_w = (torch.rand(N, generator=gen) + 0.5) * 2.0**-7
    candidates = (torch.rand((ORDER_CANDIDATES, 1), generator=gen) + 0.5) * _activation_scale_base(out_dtype, max_abs)
    s_a = torch.empty(M)
    for m in range(M):
        row = acc[m].unsqueeze(0)
        wa = round_to((row * s_w) * candidates, out_dtype)
        aw = round_to((row * candidates) * s_w, out_dtype)
        pf = round_to(row * (candidates * s_w), out_dtype)
        score = (wa != aw).sum(1) + (aw != pf).sum(1) + (wa != pf).sum(1)
        s_a[m] = candidates[int(score.argmax()), 0]
    meta = {"source": "alibi.out_bias_probe:order", "seed": str(seed), "model": "probe", "kind": "order-probe"}
    return Tile(f"order-probe-{str(out_dtype).removeprefix('torch.')}", a_q, s_a, w_q, s_w, None, out_dtype,
                meta).validate()


def bias_probe(out_dtype: torch.dtype = torch.bfloat16, seed: int = 0, M: int = 64, K: int = 256,
               N: int = 256, max_abs: int = 127) -> Tile:
    """Tile 2 (see the module docstring): tells the bias modes apart with a bias in `out_dtype`."""
    gen = torch.Generator().manual_seed(seed + 1)
    a_q = torch.randint(-max_abs, max_abs + 1, (M, K), generator=gen, dtype=torch.int8)
    w_q = torch.randint(-max_abs, max_abs + 1, (N, K), generator=gen, dtype=torch.int8)
    acc = (a_q.to(torch.float64) @ w_q.to(torch.float64).T).to(torch.float32)
    s_a = (torch.rand(M, generator=gen) + 0.5) * _activation_scale_base(out_dtype, max_abs)
    candidates = (torch.rand(SCALE_CANDIDATES, generator=gen) + 0.5) * 2.0**-7
    cols = torch.arange(N)
    rows = acc.abs().argmax(0)  # the largest |acc| of each column: the largest residuals, never zero
    target = acc[rows, cols]  # [N]: the designed element of each column
    # w_then_a in fp32 for every (column, candidate): each product rounded to fp32, as the model does.
    y = (target.unsqueeze(1) * candidates.unsqueeze(0)) * s_a[rows].unsqueeze(1)
    distance = (y - round_to(y, out_dtype).to(torch.float32)).abs() / output_ulp(y, out_dtype)
    # Keep every residual a normal number of the output dtype (float16: above 2^-14), with a margin of
    # 2^4 for the other orders and the fma, whose residuals differ from this one by a few fp32 ulps of y.
    residual = distance * output_ulp(y, out_dtype)
    distance[residual < 16.0 * torch.finfo(out_dtype).tiny] = float("inf")
    best = distance.argmin(1)
    s_w = candidates[best]
    y_best = y[cols, best]
    bias = (-round_to(y_best, out_dtype)).to(out_dtype)
    meta = {"source": "alibi.out_bias_probe:bias", "seed": str(seed), "model": "probe", "kind": "bias-probe"}
    return Tile(f"bias-probe-{str(out_dtype).removeprefix('torch.')}", a_q, s_a, w_q, s_w, bias, out_dtype,
                meta).validate()


def out_bias_probe_tiles(out_dtype: torch.dtype = torch.bfloat16, seed: int = 0, M: int = 64,
                         max_abs: int = 127) -> list[Tile]:
    """The order probe and the bias probe for `out_dtype`; `alibi identify` on both names one model."""
    return [order_probe(out_dtype, seed, M=M, max_abs=max_abs), bias_probe(out_dtype, seed, M=M, max_abs=max_abs)]


def as_e4m3(tile: Tile) -> Tile:
    """The same tile with e4m3 operands: exact for |values| ≤ 16 (e4m3 holds every integer up to 16)."""
    if int(tile.a_q.abs().max()) > 16 or int(tile.w_q.abs().max()) > 16:
        raise ValueError("as_e4m3 needs operands within [-16, 16] (build the probe with max_abs=16)")
    return tile.replace(a_q=tile.a_q.to(torch.float8_e4m3fn), w_q=tile.w_q.to(torch.float8_e4m3fn),
                        name=f"{tile.name}-e4m3")


__all__ = ["OUT_DTYPES", "as_e4m3", "bias_probe", "order_probe", "out_bias_probe_tiles", "output_ulp"]
