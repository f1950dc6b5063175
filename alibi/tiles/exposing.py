"""Tiles built so that every fault of `alibi.kernels.mutants` changes output bits.

Most faults show on ordinary operands only rarely (an epilogue fault moves a few parts per million
of real-layer outputs) or never (an fp32 reduction is exact while partial sums stay below 2²⁴; a
flushed subnormal needs subnormal outputs). `alibi mutants` without a tile source runs on this
set, so that a check that stays silent on a row really missed an observable fault:

* `epilogue-probe` (from `alibi.tiles.synthetic`): uniform int8 operands over the full range and fp32
  scales searched so the three scale orders disagree on many outputs. Shows every epilogue fault,
  the operand faults, a wrong row scale, saturating 16-bit pairs (pairs of large products clip)
  and, with M = 64 > 16, the M-dependent order in conform's small sub-batches.
* `epilogue-probe-bias`: the same with an fp32 bias that cancels one row per column, so the bias
  modes disagree (unfused-bias, ignore-bias).
* `fp32-partials`: partial sums beyond 2²⁴ whose final accumulator is tiny (see `fp32_partials_tile`):
  an fp32 accumulator or split-K reduction rounds on the way, while the exact accumulator stays
  ≤ 128, so checks 2 and 3 (tile properties) stay silent and the detection is the mutant's.
* `subnormal-outputs`: scales that put a large share of the outputs in the subnormal range.

Every tile here keeps K ≤ 3072 and |acc| ≤ 2²⁴, so checks 2 and 3 do not fire on any of them:
a check that fires against the null mutant would be a false positive of the procedure itself.
"""

from __future__ import annotations

import torch

from alibi.errors import InputError
from alibi.tiles.synthetic import synthetic_tiles
from alibi.tiles.tile import Tile

EXPOSING_TILES = ("epilogue-probe", "epilogue-probe-bias", "fp32-partials", "subnormal-outputs")


def fp32_partials_tile(seed: int = 0, M: int = 24, N: int = 48, K: int = 3072) -> Tile:
    """Partial sums far beyond 2²⁴ that cancel: an exact accumulator of at most 128 in magnitude.

    The first half of K holds products of values in [112, 127] (each ≥ 12,544, so the running sum
    passes 2²⁴ after about 1,340 terms and reaches ≈ 2.2·10⁷); the second half repeats the
    activations against the negated weights, so it cancels the first half exactly. The last
    position of each half is replaced by small values in [−8, 8], which leaves an exact
    accumulator a₁w₁ + a₂w₂ with |acc| ≤ 128. An fp32 reduction rounds its partial sums once they
    pass 2²⁴ (where fp32 integers are 2 apart), and an error of a few units in an accumulator of
    ≤ 128 changes the output by many bf16 ulps.
    """
    if K % 2 or K < 4:
        raise InputError(f"fp32_partials_tile needs an even K ≥ 4, got {K}")
    g = torch.Generator().manual_seed(seed)
    half = K // 2
    a1 = torch.randint(112, 128, (M, half), generator=g, dtype=torch.int8)
    w1 = torch.randint(112, 128, (N, half), generator=g, dtype=torch.int8)
    a = torch.cat([a1, a1], 1)
    w = torch.cat([w1, -w1], 1)
    for k in (half - 1, K - 1):
        a[:, k] = torch.randint(-8, 9, (M,), generator=g, dtype=torch.int8)
        w[:, k] = torch.randint(-8, 9, (N,), generator=g, dtype=torch.int8)
    s_a = (torch.rand(M, generator=g) + 0.5) * 2.0**-7
    s_w = (torch.rand(N, generator=g) + 0.5) * 2.0**-7
    meta = {"source": "exposing:fp32-partials", "seed": str(seed)}
    return Tile("fp32-partials", a.contiguous(), s_a, w.contiguous(), s_w, None, torch.bfloat16, meta).validate()


def subnormal_outputs_tile(seed: int = 0, M: int = 24, N: int = 48, K: int = 64) -> Tile:
    """Outputs spread across the bf16 (= fp32) normal/subnormal boundary at 2⁻¹²⁶.

    |acc| ≈ 2¹²–2¹⁹ for uniform int8 operands at K = 64; s_w ≈ 2⁻⁴⁰ and s_a ≈ 2⁻⁹⁸…2⁻¹⁰⁵ (by row),
    so |y| ≈ 2⁻¹³⁵…2⁻¹²¹: every row has subnormal outputs and most rows normal ones too. Both
    intermediate products of either scale order are normal, so only the final result is subnormal.
    """
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-127, 128, (M, K), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    s_a = (torch.rand(M, generator=g) + 0.5) * torch.exp2(-98.0 - (torch.arange(M) % 8).float())
    s_w = (torch.rand(N, generator=g) + 0.5) * 2.0**-40
    meta = {"source": "exposing:subnormal-outputs", "seed": str(seed)}
    return Tile("subnormal-outputs", a, s_a, w, s_w, None, torch.bfloat16, meta).validate()


def exposing_tile(name: str, seed: int = 0) -> Tile:
    """One tile of the exposing set by name."""
    if name in ("epilogue-probe", "epilogue-probe-bias"):
        tile = synthetic_tiles(name, seed=seed)[0]
        return tile.replace(name=name)
    if name == "fp32-partials":
        return fp32_partials_tile(seed)
    if name == "subnormal-outputs":
        return subnormal_outputs_tile(seed)
    raise InputError(f"unknown exposing tile {name!r}; choose one of {', '.join(EXPOSING_TILES)}")


def exposing_tiles(seed: int = 0) -> list[Tile]:
    """The whole exposing set, in `EXPOSING_TILES` order."""
    return [exposing_tile(name, seed) for name in EXPOSING_TILES]


__all__ = ["EXPOSING_TILES", "exposing_tile", "exposing_tiles", "fp32_partials_tile", "subnormal_outputs_tile"]
