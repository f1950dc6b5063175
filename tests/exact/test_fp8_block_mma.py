"""The block-scaled accumulation model (alibi/exact/fp8_block_mma.py) against cases worked by hand: each promotion
association, fusion, interval, block order and split-K order gives its own bit pattern on a crafted tile, so a test
here fails when any of them changes; the exact FMA against Python fractions; the schedule syntax."""

from __future__ import annotations

import math
import struct
from fractions import Fraction
from itertools import combinations
from pathlib import Path

import pytest
import torch

from alibi.errors import InputError
from alibi.exact.emulator import fma_f32
from alibi.exact.fp8_block import DEEPSEEK_V3, BlockLayout, quantize_fp8_blocks, quantize_fp8_groups
from alibi.exact.fp8_block_mma import (
    PROMOTIONS,
    accumulate_blocks,
    block_schedule_differences,
    candidate_block_schedules,
    parse_block_schedule,
)
from alibi.tiles.block_probe import association_probe_tile

RESULTS = Path(__file__).resolve().parents[2] / "analysis" / "results" / "h100" / "fp8-block"

E4M3 = torch.float8_e4m3fn


def bits(x: torch.Tensor) -> list[int]:
    return [v & 0xFFFFFFFF for v in x.contiguous().view(torch.int32).reshape(-1).tolist()]


def one_element(products: dict[int, tuple[float, float]], K: int, s_a: list[float], s_w: list[float]):
    """A 1×1×K tile: a_q[k]·w_q[k] = the given products, zeros elsewhere; group scales s_a and s_w."""
    a, w = torch.zeros(1, K), torch.zeros(1, K)
    for k, (x, y) in products.items():
        a[0, k], w[0, k] = x, y
    return a.to(E4M3), torch.tensor([s_a]), w.to(E4M3), torch.tensor([s_w])


def acc_bits(schedule: str, operands, layout: BlockLayout = DEEPSEEK_V3) -> int:
    a_q, s_a, w_q, s_w = operands
    return bits(accumulate_blocks(parse_block_schedule(schedule), a_q, s_a, w_q, s_w, layout))[0]


# Group 0 gives acc0 = 1 + 2^-8 (products 1·1 and 2^-4·2^-4, scales 1); group 1 gives p1 = 2.25 + 2^-12 (1.5·1.5 and
# 2^-6·2^-6) with sa = 14911463·2^-49 and sw = 1. Then 9217·14911463 = 2^37 + 999, so sa·p1 = 2^-24·(1 + 999·2^-37):
# just above 2^-24, and RN32(sa·p1) = 2^-24 exactly. acc0 + 2^-24 is a tie that rounds to the even acc0
# (0x3f808000); acc0 + the exact product is above it (0x3f808001). So a promotion that rounds sa·p1 (or p1·sa)
# before the addition gives ...00, one that fuses the exact product into the addition gives ...01.
TIE = one_element({0: (1.0, 1.0), 1: (2.0**-4, 2.0**-4), 128: (1.5, 1.5), 129: (2.0**-6, 2.0**-6)}, 256,
                  [1.0, 14911463 * 2.0**-49], [1.0, 1.0])
EXPECTED = {"fma(sa*sw,p,acc)": 0x3F808001, "acc+(sa*sw)*p": 0x3F808000, "fma(p*sa,sw,acc)": 0x3F808000,
            "acc+(p*sa)*sw": 0x3F808000, "fma(p*sw,sa,acc)": 0x3F808001, "acc+(p*sw)*sa": 0x3F808000}


@pytest.mark.parametrize("promotion", list(PROMOTIONS))
def test_each_promotion_gives_the_hand_worked_bits_on_a_rounding_tie(promotion):
    assert acc_bits(f"block128:{promotion}", TIE) == EXPECTED[promotion]


def test_every_pair_of_promotions_gives_different_accumulators_on_the_association_probe():
    t = association_probe_tile()
    accs = {p: accumulate_blocks(parse_block_schedule(f"block128:{p}"), t.a_q, t.s_a, t.w_q, t.s_w, DEEPSEEK_V3)
            for p in PROMOTIONS}
    for x, y in combinations(PROMOTIONS, 2):
        assert bits(accs[x].to(torch.bfloat16).float()) != bits(accs[y].to(torch.bfloat16).float()), (x, y)


def test_a_shorter_promotion_interval_keeps_a_product_the_chain_cuts_away():
    # 1·1 at k = 0 and 2^-7·2^-7 = 2^-14 at k = 64: one chain aligns both to 2^-13 and drops 2^-14 (1.0,
    # 0x3f800000); chains of 64 promote each alone, and fp32 keeps 1 + 2^-14 (0x3f800200).
    ops = one_element({0: (1.0, 1.0), 64: (2.0**-7, 2.0**-7)}, 128, [1.0], [1.0])
    assert acc_bits("block128:fma(sa*sw,p,acc)", ops) == 0x3F800000
    assert acc_bits("block64:fma(sa*sw,p,acc)", ops) == 0x3F800200


# Three groups: 1, then 2^-24 twice (2^-6·2^-6 = 2^-12 scaled by sa = 2^-12). In ascending order each 2^-24 meets 1
# and is lost to the tie-to-even (1.0); reversed, the two small ones add to 2^-23 first, which 1 keeps (1 + 2^-23).
ORDER = one_element({0: (1.0, 1.0), 128: (2.0**-6, 2.0**-6), 256: (2.0**-6, 2.0**-6)}, 384,
                    [1.0, 2.0**-12, 2.0**-12], [1.0, 1.0, 1.0])


@pytest.mark.parametrize("schedule, expected", [
    ("block128:fma(sa*sw,p,acc)", 0x3F800000),
    ("block128:fma(sa*sw,p,acc):reverse", 0x3F800001),
    ("block128:acc+(p*sa)*sw:split-3", 0x3F800000),
    ("block128:acc+(p*sa)*sw:split-3-desc", 0x3F800001),
])
def test_block_order_and_split_k_order_give_the_hand_worked_bits(schedule, expected):
    assert acc_bits(schedule, ORDER) == expected


def test_a_rescaled_chain_carries_the_ratio_of_the_scales_through_the_tensor_core():
    # Two groups, product 1 each, block scales 1 and 3. Promoting gives 1 + 3 = 4. The rescaled chain multiplies 1 by
    # RN32(1/3), feeds it to the next step as C, which cuts it to 13 fractional bits (2730/8192) beside the product
    # 1, then multiplies by 3: 3·10922/8192 = 3.999755859375.
    ops = one_element({0: (1.0, 1.0), 128: (1.0, 1.0)}, 256, [1.0, 3.0], [1.0, 1.0])
    assert acc_bits("block128:fma(sa*sw,p,acc)", ops) == struct.unpack("<I", struct.pack("<f", 4.0))[0]
    assert acc_bits("block128:rescale", ops) == struct.unpack("<I", struct.pack("<f", 3.999755859375))[0]


def test_a_ragged_k_gives_the_bits_of_its_zero_padded_tile():
    g = torch.Generator().manual_seed(0)
    a, w = torch.randn(3, 200, generator=g), torch.randn(5, 200, generator=g)
    (a_q, s_a), (w_q, s_w) = quantize_fp8_groups(a), quantize_fp8_blocks(w)
    (ap, sap), (wp, swp) = (quantize_fp8_groups(torch.nn.functional.pad(a, (0, 56))),
                            quantize_fp8_blocks(torch.nn.functional.pad(w, (0, 56))))
    assert torch.equal(s_a, sap) and torch.equal(s_w, swp)
    for text in ("block128:fma(sa*sw,p,acc)", "block64:acc+(p*sa)*sw", "block128:rescale"):
        s = parse_block_schedule(text)
        assert bits(accumulate_blocks(s, a_q, s_a, w_q, s_w, DEEPSEEK_V3)) == \
            bits(accumulate_blocks(s, ap, sap, wp, swp, DEEPSEEK_V3)), text


# --- the exact FMA against fractions --------------------------------------------------------------------------

def rn32(x: Fraction) -> float:
    """Round a rational to the nearest fp32 (ties to even), by integer arithmetic alone."""
    if x == 0:
        return 0.0
    sign, x = (-1 if x < 0 else 1), abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    while Fraction(2) ** e > x:
        e -= 1
    while Fraction(2) ** (e + 1) <= x:
        e += 1
    q = Fraction(2) ** (max(e, -126) - 23)  # the fp32 grid spacing at x (subnormals below 2^-126)
    n, r = divmod(x, q)
    n = int(n) + (1 if r > q / 2 or (r == q / 2 and int(n) % 2) else 0)
    value = n * q
    return sign * (math.inf if value >= Fraction(2) ** 128 else float(value))


def f32(v: float) -> float:
    return struct.unpack("<f", struct.pack("<f", v))[0]


def test_fma_is_rounded_once_where_a_float64_sum_would_round_twice():
    # (1 + 2^-12)² = 1 + 2^-11 + 2^-24 is an fp32 midpoint; ± 2^-60 decides it, and float64 loses it.
    x = y = 1 + 2.0**-12
    for z, want in ((2.0**-60, 1 + 2.0**-11 + 2.0**-23), (-(2.0**-60), 1 + 2.0**-11)):
        assert rn32(Fraction(x) * Fraction(y) + Fraction(z)) == want
        assert fma_f32(torch.tensor([x]), torch.tensor([y]), torch.tensor([z])).item() == want


def test_fma_equals_the_fraction_reference_on_random_fp32_triples():
    g = torch.Generator().manual_seed(7)
    n = 3000
    mant = lambda: torch.rand(n, generator=g) + 1  # noqa: E731
    exps = lambda lo, hi: torch.randint(lo, hi, (n,), generator=g).float()  # noqa: E731
    x = (mant() * torch.exp2(exps(-20, 20))).float()
    y = (mant() * torch.exp2(exps(-20, 20)) * torch.where(torch.rand(n, generator=g) < 0.5, -1, 1)).float()
    z = -(x.double() * y.double()).float() * (1 + torch.randint(-3, 4, (n,), generator=g) * 2.0**-23)  # cancellation
    z = torch.where(torch.rand(n, generator=g) < 0.5, z, (mant() * torch.exp2(exps(-40, 40))).float())
    got = fma_f32(x, y, z).tolist()
    for xi, yi, zi, gi in zip(x.tolist(), y.tolist(), z.tolist(), got, strict=True):
        assert gi == rn32(Fraction(xi) * Fraction(yi) + Fraction(zi)), (xi, yi, zi)


# --- the syntax -----------------------------------------------------------------------------------------------

def test_a_schedule_reads_back_its_label_and_describes_itself():
    s = parse_block_schedule("block128:acc+(p*sa)*sw:reverse:split-2-desc")
    assert (s.chain_k, s.promotion, s.order, s.split.parts, s.split.reduction) == \
        (128, "acc+(p*sa)*sw", "descending", 2, "descending")
    assert s.label == "block128:acc+(p*sa)*sw:reverse:split-2-desc" and "unfused" in s.describe()
    assert not parse_block_schedule("block128:fma(sa*sw,p,acc):stream-k").deterministic
    assert not parse_block_schedule("block128:fma(sa*sw,p,acc):split-4-atomic").deterministic
    assert len(candidate_block_schedules()) == len(PROMOTIONS) + 1


@pytest.mark.parametrize("text", ["block100:fma(sa*sw,p,acc)", "block128:acc+sa*sw*p", "fma(sa*sw,p,acc)",
                                  "block128:fma(sa*sw,p,acc):split-x", "block128:rescale:reverse"])
def test_a_malformed_schedule_is_refused(text):
    with pytest.raises(InputError):
        parse_block_schedule(text)


def test_differences_name_association_contraction_interval_and_split_order():
    p = parse_block_schedule
    assert block_schedule_differences(p("block128:fma(sa*sw,p,acc)"), p("block128:fma(p*sa,sw,acc)")) == \
        ["promotion association"]
    assert block_schedule_differences(p("block128:fma(p*sa,sw,acc)"), p("block128:acc+(p*sa)*sw")) == \
        ["promotion FMA contraction"]
    assert block_schedule_differences(p("block128:fma(sa*sw,p,acc)"), p("block64:fma(sa*sw,p,acc)")) == \
        ["promotion interval"]
    assert block_schedule_differences(p("block128:fma(sa*sw,p,acc):split-2"),
                                      p("block128:fma(sa*sw,p,acc):split-2-desc")) == ["split-K order"]


def test_a_nondeterministic_schedule_is_not_computed():
    with pytest.raises(InputError, match="nondeterministic"):
        accumulate_blocks(parse_block_schedule("block128:fma(sa*sw,p,acc):stream-k"), *TIE, DEEPSEEK_V3)


def test_the_f16_mma_schedule_reproduces_vllms_16_row_triton_block_kernel_recorded_on_an_h100():
    """vLLM 0.26.0's `w8a8_triton_block_scaled_mm` at 1 × 576 × 7168, where its tuned H100 config gives
    BLOCK_SIZE_M = 16 (an f16 mma.sync), recorded in fp32 and bf16 on an H100: its declared schedule reproduces
    every bit; the same promotion on the `wgmma` step misses every fp32 output."""
    from safetensors import safe_open

    from alibi.controls.fp8_block_schedule import random_block_tile

    record = RESULTS / "d7205d1" / "record-vllm-triton.safetensors"
    declared, wgmma = (parse_block_schedule(t) for t in ("block128:fma(p*sa,sw,acc):f16-mma",
                                                         "block128:fma(p*sa,sw,acc)"))
    with safe_open(str(record), "pt") as f:
        assert f.metadata()["kernel"] == "vllm-triton-fp8-block"
        for seed in (0, 1):
            tile = random_block_tile(1, 576, 7168, seed)
            fp32 = f.get_tensor(f"1x576x7168/{seed}/fp32")
            acc = accumulate_blocks(declared, tile.a_q, tile.s_a, tile.w_q, tile.s_w, DEEPSEEK_V3)
            assert torch.equal(acc.view(torch.int32), fp32.view(torch.int32))
            assert torch.equal(acc.to(torch.bfloat16).view(torch.int16),
                               f.get_tensor(f"1x576x7168/{seed}/bf16").view(torch.int16))
            other = accumulate_blocks(wgmma, tile.a_q, tile.s_a, tile.w_q, tile.s_w, DEEPSEEK_V3)
            assert bool((other.view(torch.int32) != fp32.view(torch.int32)).all())
