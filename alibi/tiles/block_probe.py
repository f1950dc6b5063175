"""A block-scaled tile on which the promotions of `alibi.exact.fp8_block_mma.PROMOTIONS` give different outputs.

On real operands two promotions differ by an fp32 ulp of the accumulator now and then, which a bf16 output shows
about once in 2^16 elements: far too rarely to tell them apart on a small tile. Here every output sits on a bf16
rounding tie that the last promotion decides. K = 256 is two scale groups. Group 0 (scales 1) holds the products
1·1 and 2^-4·2^-4, so every chain gives `p0 = 1 + 2^-8` exactly, promoted unchanged by every operation: `acc0` is
the midpoint between the bf16 values 1 and 1 + 2^-7, with an even fp32 last bit. Group 1 holds the products
1.5·1.5 and 2^-6·2^-6, whose chain keeps both (`p1 = 2.25 + 2^-12`, a 14-bit significand: with fewer bits no fp32
scale puts `s·p1` just above 2^-24 and `RN(s·p1)` on it, which the fused and unfused promotions need to differ),
promoted with scales that make it about 2^-24, half an fp32 ulp of `acc0`: whether the promoted sum
lands on `acc0` (a tie, rounded to even: bf16 1) or one fp32 ulp above (bf16 1 + 2^-7) depends on how that product
was rounded on its way, which is what the promotions disagree about. Row r's activation scale is searched (seeded)
among the fp32 neighbours of the target so that the r-th pair of promotions gives different outputs; the weight
scale of group 1 is the first of a seeded sequence of fp32 values for which every pair has such a row. So every pair of promotions differs on at least one element.
"""

from __future__ import annotations

from itertools import combinations

import torch

from alibi.errors import InputError
from alibi.exact.fp8_block import DEEPSEEK_V3, LAYOUT_KEY
from alibi.exact.fp8_block_mma import PROMOTIONS, promote
from alibi.tiles.tile import Tile

SEARCH_ULPS = 2**14  # fp32 neighbours of the target activation scale tried for each row
ATTEMPTS = 64  # seeded weight scales tried per pair


def association_probe_tile(seed: int = 0, out_dtype: torch.dtype = torch.bfloat16,
                           promotions: tuple[str, ...] = tuple(PROMOTIONS)) -> Tile:
    """The probe (module docstring): row r and weight block r for the r-th pair of `promotions`, K = 256, 128×128
    blocks (15 rows and 15 · 128 columns for all six promotions)."""
    unknown = [p for p in promotions if p not in PROMOTIONS]
    if unknown or len(promotions) < 2:
        raise InputError(f"association probe: give two or more of {', '.join(PROMOTIONS)}; got {list(promotions)}")
    pairs = list(combinations(promotions, 2))
    M, K = len(pairs), 256
    N = M * DEEPSEEK_V3.block_n
    a = torch.zeros((M, K))
    w = torch.zeros((N, K))
    a[:, 0], w[:, 0], a[:, 1], w[:, 1] = 1.0, 1.0, 2.0**-4, 2.0**-4
    a[:, 128], w[:, 128], a[:, 129], w[:, 129] = 1.5, 1.5, 2.0**-6, 2.0**-6
    acc0 = torch.tensor([1 + 2.0**-8], dtype=torch.float32)
    p1 = torch.tensor([2.25 + 2.0**-12], dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    s_a = torch.ones((M, 2), dtype=torch.float32)
    s_w = torch.ones((M, 2), dtype=torch.float32)
    for r, (x, y) in enumerate(pairs):
        for _ in range(ATTEMPTS):
            sw1 = ((torch.rand(1, generator=g) + 1) * 2.0**-12).to(torch.float32)
            target = torch.tensor([2.0**-24], dtype=torch.float64) / (p1.double() * sw1.double())
            start = target.to(torch.float32).view(torch.int32) - SEARCH_ULPS // 2
            candidates = (start + torch.arange(SEARCH_ULPS, dtype=torch.int32)).view(torch.float32)
            apart = (promote(x, acc0, p1, candidates, sw1).to(out_dtype) !=
                     promote(y, acc0, p1, candidates, sw1).to(out_dtype)).nonzero()
            if len(apart):
                s_a[r, 1], s_w[r, 1] = candidates[int(apart[0, 0])], sw1
                break
        else:
            raise InputError(f"association probe (seed {seed}): no scales found that tell {x} from {y}; try another "
                             "seed")
    meta = {"source": "probe:fp8-block-association", "seed": str(seed), "kind": "probe", LAYOUT_KEY: DEEPSEEK_V3.text}
    return Tile("fp8-block-association-probe", a.to(torch.float8_e4m3fn), s_a, w.to(torch.float8_e4m3fn), s_w, None,
                out_dtype, meta).validate()


__all__ = ["association_probe_tile"]
