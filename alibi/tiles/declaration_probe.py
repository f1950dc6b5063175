"""Declaration probes: small tiles on which a departure from a declared epilogue model in any attribute shows.

The default tile source (`alibi.tiles.synthetic`, preset `default`) adds these to its SmolLM2 block so that a
kernel which declares one epilogue and implements another fails the default `alibi conform` whichever attribute it
departs in: the scale order, the intermediate rounding, the bias mode with an fp32 bias, the bias mode with a bias
in the output dtype, in bfloat16 and in float16 outputs, at a decode M (1) and at a prefill M. Real operands show
epilogue differences at parts per million, and a tile without a bias shows no bias mode at all.

Each tile is M × K × N = M × 128 × 128. In every column the designed element is in row 0; the other rows' activation
scales are 2⁻⁴ of row 0's, so that their values stay well below row 0's and no bias cancels them. Column n takes
the role `ROLES[n mod 6]`:

0. *order* (half the columns): no bias (0). The weight scale is the one among `ORDER_CANDIDATES` for which the
   three scale orders round the designed element to the most distinct values of the output dtype, so that any two
   orders differ somewhere.
1. *bias, plain*: the bias cancels the `w_then_a` value y of the designed element: b = −y·(1 + 2⁻²⁰) in fp32
   (2⁻¹⁸ for float16), or, in the output dtype, b = −out(y) with the weight scale chosen among the candidates
   for which y lies closest to a value of the output dtype, and is not an exact product (`alibi.tiles.out_bias_probe`'s
   bias probe). After the cancellation only a residual of a few fp32 ulps of y is left, in which `fma` (the
   unrounded product), `add_before_cast` (the rounded product) and `add_after_cast` (the product cast first) give
   different bits.
2. *bias, w_then_a with intermediate rounding*: as 1, cancelling out(acc·s_w)·s_a, so that the bias modes of a
   model with `round_between` differ too (a plain cancellation leaves it a residual of 2⁻⁹·|y|, too large to show
   the product's rounding).
3. *bias, a_then_w with intermediate rounding*: as 2 with out(acc·s_a)·s_w.

A column whose designed |acc| is below the median of row 0 gets no bias (row 0 might not outweigh the other rows
there), nor one whose residual would fall below 16 times the output dtype's smallest normal. Scales: bfloat16
s_a ≈ 2⁻⁶, s_w ≈ 2⁻⁷ (|y| ≈ 10); float16 s_a ≈ 2⁻³, s_w ≈ 2⁻⁴ (|y| ≈ 600), so that every residual is a normal
float16 and no first product of an intermediate rounding overflows float16.

Each fp32-bias tile alone makes every single-attribute departure of each of the 15 models show; with a bias in
bfloat16, role 2 cannot separate `fma` from `add_before_cast` under `w_then_a+round_between` (the rounded first
product leaves too few distinct values to bring y close to a bfloat16 value), which the fp32-bias tile of the same
context does. Per context (output dtype × decode or prefill) the default source's tiles show every departure of
every model (tests/conform/test_default_source.py); `alibi.conform.exercised` measures it on each run of a source
that claims it.
"""

from __future__ import annotations

import torch

from alibi.exact.numerics import dtype_name, round_to
from alibi.tiles.out_bias_probe import output_ulp
from alibi.tiles.tile import Tile

ORDER_CANDIDATES = 32768
SCALE_CANDIDATES = 4096
ROLES = (0, 1, 0, 2, 0, 3)  # column n takes role ROLES[n mod 6] (module docstring): half the columns tell orders apart
DECODE_M = 1
PREFILL_M = 64
K, N = 128, 128


def declaration_probe(out_dtype: torch.dtype = torch.bfloat16, bias_dtype: torch.dtype = torch.float32,
                      seed: int = 0, M: int = PREFILL_M) -> Tile:
    """One declaration probe (module docstring): `out_dtype` outputs, a bias in `bias_dtype` (float32 or the output
    dtype), M rows."""
    gen = torch.Generator().manual_seed(seed + 3)
    a_q = torch.randint(-127, 128, (M, K), generator=gen, dtype=torch.int8)
    w_q = torch.randint(-127, 128, (N, K), generator=gen, dtype=torch.int8)
    acc = (a_q.to(torch.float64) @ w_q.to(torch.float64).T).to(torch.float32)  # exact: |acc| < 2^24
    bf16 = out_dtype == torch.bfloat16
    sa_base, sw_base = (2.0**-6, 2.0**-7) if bf16 else (2.0**-3, 2.0**-4)
    s_a = (torch.rand(M, generator=gen) + 0.5) * sa_base
    s_w = (torch.rand(N, generator=gen) + 0.5) * sw_base
    order_cand = (torch.rand(ORDER_CANDIDATES, generator=gen) + 0.5) * sw_base
    bias_cand = (torch.rand(SCALE_CANDIDATES, generator=gen) + 0.5) * sw_base
    s_a[1:] *= 2.0**-4  # the other rows' values stay below a quarter of row 0's: no cancellation against its bias
    cols = torch.arange(N)
    t, sa = acc[0].unsqueeze(1), s_a[:1].unsqueeze(1)  # [N, 1]: each column's designed element, in row 0
    role = torch.tensor(ROLES)[cols % len(ROLES)]
    small = t[:, 0].abs() < t.abs().median()  # cancelled where row 0 outweighs every other row: bias 0 here

    def out(x: torch.Tensor) -> torch.Tensor:
        return round_to(x, out_dtype).to(torch.float32)

    # role 0: the candidate weight scale whose designed element the three orders round to the most distinct values
    sw = order_cand.unsqueeze(0)
    wa, aw, pf = out((t * sw) * sa), out((t * sa) * sw), out(t * (sa * sw))
    distinct = (wa != aw).int() + (aw != pf).int() + (wa != pf).int()
    s_w = torch.where(role == 0, order_cand[distinct.argmax(1)], s_w)

    def factors(sw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # the last product each column's bias meets
        role_ = role.unsqueeze(1)
        first = torch.where(role_ == 2, out(t * sw), torch.where(role_ == 3, out(t * sa), t * sw))
        return first, torch.where(role_ == 3, sw, sa).expand_as(first)

    def designed(sw: torch.Tensor) -> torch.Tensor:  # the value each column's bias cancels, per candidate
        first, last = factors(sw)
        return first * last

    floor = 16.0 * torch.finfo(out_dtype).tiny
    if bias_dtype == torch.float32:
        y = designed(s_w.unsqueeze(1))[:, 0]
        off = 2.0**-20 if bf16 else 2.0**-18
        b = -(y * (1 + off))
        b[(role == 0) | small | (y.abs() * off < floor)] = 0.0
    elif bias_dtype == out_dtype:
        y = designed(bias_cand.unsqueeze(0))  # [N, candidates]
        ulp = output_ulp(y, out_dtype)
        distance = (y - out(y)).abs() / ulp
        first, last = factors(bias_cand.unsqueeze(0))
        exact = first.to(torch.float64) * last.to(torch.float64) == y.to(torch.float64)  # then fma = add_before_cast
        distance[(distance * ulp < floor) | ~torch.isfinite(y) | exact] = float("inf")
        best = distance.argmin(1)
        cancel = (role != 0) & ~small
        s_w = torch.where(cancel, bias_cand[best], s_w)
        b = torch.where(cancel, -out(y[cols, best]), torch.zeros(N))
    else:
        raise ValueError(f"a declaration probe's bias is float32 or the output dtype, not {dtype_name(bias_dtype)}")
    bias = b.to(bias_dtype)
    name = f"declaration-probe-{dtype_name(out_dtype)}-bias-{dtype_name(bias_dtype)}-M{M}"
    meta = {"source": "alibi.declaration_probe", "seed": str(seed), "model": "probe", "kind": "declaration-probe"}
    return Tile(name, a_q, s_a, w_q, s_w.contiguous(), bias, out_dtype, meta).validate()


def declaration_probes(seed: int = 0, ms: tuple[int, ...] = (DECODE_M, PREFILL_M)) -> list[Tile]:
    """Every declaration probe: bfloat16 and float16 outputs × an fp32 bias and one in the output dtype × `ms`."""
    return [declaration_probe(out_dtype, bias_dtype, seed, M)
            for M in ms for out_dtype in (torch.bfloat16, torch.float16)
            for bias_dtype in (torch.float32, out_dtype)]


__all__ = ["DECODE_M", "PREFILL_M", "declaration_probe", "declaration_probes"]
