"""The fp8 MMA step model against cases worked out by hand, one per parameter, and against the independent scalar
reference (`alibi.exact.fp8_reference`) on random operands.

Each hand case states the published model's answer and the answer of the model with that one parameter changed, so
the test fails when the parameter changes. The values follow from the rules in `alibi.exact.fp8_mma`'s docstring:
terms cut to the grid 2^(E − 13) of the largest exponent E among the 33 terms, an exact sum, a result cut to 13
fractional bits.
"""

from __future__ import annotations

import math
import random
import struct
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from alibi.exact import fp8_reference
from alibi.exact.fp8_mma import (
    FAST_ACCUM,
    PROMOTE_128,
    TRITON_F16_MMA,
    WGMMA_FP8,
    AccumulationSchedule,
    SplitK,
    StepModel,
    accumulate,
    decode,
    dot_steps,
    parse_schedule,
)

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def dot(pairs, c: float = 0.0, model: StepModel = WGMMA_FP8, K: int = 32, fmt=(E4M3, E4M3)) -> float:
    """`c + Σ a·b` through the model; `pairs` is a list of (a, b) at positions 0, 1, ... or a dict position → (a, b)."""
    a, b = torch.zeros(K, dtype=torch.float64), torch.zeros(K, dtype=torch.float64)
    for k, (x, y) in (pairs.items() if isinstance(pairs, dict) else enumerate(pairs)):
        a[k], b[k] = x, y
    qa, qb = a.to(fmt[0]), b.to(fmt[1])
    assert all(torch.allclose(q.to(torch.float64), v, rtol=0, atol=0, equal_nan=True) for q, v in ((qa, a), (qb, b)))
    return dot_steps(decode(qa), decode(qb), torch.tensor(c, dtype=torch.float32), model).item()


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def test_a_product_on_the_13_bit_grid_of_the_largest_term_is_kept_and_one_below_is_cut():
    assert dot([(1.0, 1.0), (2.0**-7, 2.0**-6)]) == 1 + 2.0**-13
    assert dot([(1.0, 1.0), (2.0**-7, 2.0**-7)]) == 1.0
    # a wider alignment would keep -2^-14, and 1 - 2^-14 has 13 fractional bits in its binade (-1)
    assert dot([(1.0, 1.0), (-(2.0**-7), 2.0**-7)]) == 1.0
    assert dot([(1.0, 1.0), (-(2.0**-7), 2.0**-7)], model=replace(WGMMA_FP8, align_bits=14)) == 1 - 2.0**-14


def test_terms_are_cut_toward_zero_not_toward_minus_infinity():
    assert dot([(1.0, 1.0), (-(2.0**-8), 2.0**-8)]) == 1.0
    assert dot([(1.0, 1.0), (-(2.0**-8), 2.0**-8)], model=replace(WGMMA_FP8, align_cut="toward_minus_inf")) \
        == 1 - 2.0**-13


def test_the_renormalised_sum_keeps_13_fractional_bits_of_its_own_binade():
    # 1.5 + 0.5 + 2^-13 is exact on the alignment grid (E = 0) but 2 + 2^-13 needs 14 fractional bits at binade 1
    pairs = [(1.5, 1.0), (0.5, 1.0), (2.0**-7, 2.0**-6)]
    assert dot(pairs) == 2.0
    assert dot(pairs, model=replace(WGMMA_FP8, result_bits=14)) == 2 + 2.0**-13


def test_the_result_is_cut_toward_zero_for_negative_sums_too():
    pairs = [(-1.5, 1.0), (-0.5, 1.0), (-(2.0**-7), 2.0**-6)]
    assert dot(pairs) == -2.0
    assert dot(pairs, model=replace(WGMMA_FP8, result_cut="toward_minus_inf")) == -(2 + 2.0**-12)


def test_the_incoming_accumulator_joins_the_alignment():
    sixteen_small = {k: (0.25, 0.25) for k in range(16)}  # 16 x 2^-4 = 1, each below 2^(10-13)
    assert dot(sixteen_small, c=2.0**10) == 2.0**10
    assert dot(sixteen_small, c=2.0**10, model=replace(WGMMA_FP8, c_joins_alignment=False)) == 2.0**10 + 1


def test_an_incoming_accumulator_off_the_grid_is_cut_on_entry():
    assert dot([], c=1 + 2.0**-20) == 1.0
    assert dot([(1.0, 1.0)], c=1 + 2.0**-20) == 2.0


def test_a_zero_product_does_not_raise_the_alignment_whatever_its_partner():
    pairs = [(0.0, 448.0), (1.0, 1.0), (2.0**-6, 2.0**-6)]  # 0 x 448: fields would say exponent -6 + 8 = 2
    assert dot(pairs) == 1 + 2.0**-12
    assert dot(pairs, model=replace(WGMMA_FP8, zero_from_fields=True)) == 1.0


def test_one_step_adds_32_products_so_small_products_anywhere_in_it_are_cut_against_a_large_one():
    pairs = {k: (2.0**-7, 2.0**-7) for k in range(31)}  # 31 x 2^-14 before a 1 at position 31
    pairs[31] = (1.0, 1.0)
    assert dot(pairs) == 1.0
    # in steps of 16 the first half sums exactly to 16 x 2^-14 = 2^-10, which then enters as C on the grid
    assert dot(pairs, model=replace(WGMMA_FP8, k=16)) == 1 + 2.0**-10


def test_a_product_significand_above_two_keeps_the_nominal_exponent_for_the_alignment():
    # 1.875^2 = 3.515625 has nominal exponent 0: the grid is 2^-13, but the result's binade is 1 (grid 2^-12)
    assert dot([(1.875, 1.875), (2.0**-7, 2.0**-6)]) == 3.515625
    assert dot([(1.875, 1.875), (2.0**-6, 2.0**-6)]) == 3.515625 + 2.0**-12


def test_an_fp8_subnormal_keeps_the_minimum_exponent_with_a_significand_below_one():
    # 2^-9 (e4m3 subnormal, exponent -6) x 256 = 0.5 with nominal exponent 2: grid 2^-11, so 2^-12 is cut
    assert dot([(2.0**-9, 256.0), (2.0**-6, 2.0**-6)]) == 0.5
    assert dot([(2.0**-9, 256.0), (2.0**-5, 2.0**-6)]) == 0.5 + 2.0**-11


def test_a_chain_feeds_each_steps_result_to_the_next_as_c():
    # step 1 holds 1, so 2^-14 in step 2 is cut against it; alone in its own step it would be kept
    assert dot({0: (1.0, 1.0), 32: (2.0**-7, 2.0**-7)}, K=64) == 1.0
    assert dot({0: (2.0**-7, 2.0**-7), 32: (1.0, 1.0)}, K=64) == 1.0
    assert dot({0: (2.0**-7, 2.0**-7)}, K=64) == 2.0**-14


def test_nan_and_infinities_follow_ieee_through_the_sum():
    nan_case = dot([(float("nan"), 1.0)])
    assert math.isnan(nan_case) and f32_bits(nan_case) == 0x7FFFFFFF
    assert dot([(1.0, 1.0)], c=math.inf) == math.inf
    assert dot([(1.0, 1.0)], c=-math.inf) == -math.inf
    assert dot([(math.inf, 1.0)], fmt=(E5M2, E5M2)) == math.inf
    assert math.isnan(dot([(math.inf, 1.0), (math.inf, -1.0)], fmt=(E5M2, E5M2)))
    assert math.isnan(dot([(math.inf, 0.0)], fmt=(E5M2, E5M2)))


def test_an_exact_zero_sum_is_positive_even_when_every_term_is_a_negative_zero():
    # measured on the H100 (alibi probe fp8-mma, specials): IEEE addition would give -0 for the second case
    assert f32_bits(dot([(1.0, 1.0), (-1.0, 1.0)])) == 0
    assert f32_bits(dot([(-0.0, 1.0)] * 32, c=-0.0)) == 0
    assert f32_bits(dot([(1.0, 1.0), (-1.0, 1.0)], c=-0.0)) == 0


def test_promotion_adds_each_chain_into_full_fp32_so_a_small_product_beyond_a_boundary_survives():
    a = torch.zeros(1, 256, dtype=torch.float64)
    w = torch.zeros(1, 256, dtype=torch.float64)
    a[0, 0] = w[0, 0] = 1.0
    a[0, 128] = w[0, 128] = 2.0**-9  # 2^-18: below a chain's grid beside 1, within fp32's 24 bits
    qa, qw = a.to(E4M3), w.to(E4M3)
    assert accumulate(FAST_ACCUM, qa, qw).item() == 1.0
    assert accumulate(PROMOTE_128, qa, qw).item() == 1 + 2.0**-18
    assert accumulate(AccumulationSchedule("s", split_k=SplitK(2, 128)), qa, qw).item() == 1 + 2.0**-18
    assert accumulate(AccumulationSchedule("p", promotion_k=256), qa, qw).item() == 1.0


def test_split_k_ranges_cover_k_in_granules_longest_first():
    assert SplitK(3, 128).ranges(1000) == [(0, 384), (384, 768), (768, 1000)]
    assert SplitK(4, 128).ranges(256) == [(0, 128), (128, 256)]
    assert AccumulationSchedule("x", promotion_k=128, split_k=SplitK(2, 128)).boundaries(768) == [128, 256, 384, 512, 640]


def test_schedule_labels_parse_into_the_schedules_they_name():
    assert parse_schedule("fast-accum") == AccumulationSchedule("fast-accum")
    assert parse_schedule("promote-128").promotion_k == 128
    s = parse_schedule("split-4x128+promote-64")
    assert (s.split_k, s.promotion_k) == (SplitK(4, 128), 64)


FINITE_E4M3 = [b for b in range(256) if b & 0x7F != 0x7F]
FINITE_E5M2 = [b for b in range(256) if (b >> 2) & 0x1F != 0x1F]


@pytest.mark.parametrize("fmt_a,fmt_b,steps", [("e4m3", "e4m3", 1), ("e4m3", "e4m3", 4), ("e5m2", "e5m2", 2),
                                              ("e4m3", "e5m2", 1)])
def test_the_vectorised_model_equals_the_scalar_integer_reference_on_random_dot_products(fmt_a, fmt_b, steps):
    rng = random.Random(f"{fmt_a}{fmt_b}{steps}")
    n, K = 600, 32 * steps
    pool = {"e4m3": FINITE_E4M3, "e5m2": FINITE_E5M2}
    dtype = {"e4m3": E4M3, "e5m2": E5M2}
    a = [[rng.choice(pool[fmt_a]) for _ in range(K)] for _ in range(n)]
    b = [[rng.choice(pool[fmt_b]) for _ in range(K)] for _ in range(n)]
    c = [struct.unpack("<f", struct.pack("<f", rng.gauss(0, 1) * 2.0 ** rng.randint(-30, 30)))[0] for _ in range(n)]
    qa = torch.tensor(a, dtype=torch.uint8).view(dtype[fmt_a])
    qb = torch.tensor(b, dtype=torch.uint8).view(dtype[fmt_b])
    got = dot_steps(decode(qa), decode(qb), torch.tensor(c, dtype=torch.float32))
    want = [fp8_reference.chain(a[i], b[i], c[i], fmt_a=fmt_a, fmt_b=fmt_b) for i in range(n)]
    assert [f32_bits(x) for x in got.tolist()] == [f32_bits(x) for x in want]


def test_the_reference_agrees_with_the_model_under_sign_fill_cuts_too():
    rng = random.Random(7)
    a = [[rng.choice(FINITE_E4M3) for _ in range(64)] for _ in range(300)]
    b = [[rng.choice(FINITE_E4M3) for _ in range(64)] for _ in range(300)]
    model = replace(WGMMA_FP8, align_cut="toward_minus_inf", result_cut="toward_minus_inf")
    got = dot_steps(decode(torch.tensor(a, dtype=torch.uint8).view(E4M3)),
                    decode(torch.tensor(b, dtype=torch.uint8).view(E4M3)), torch.zeros(300), model)
    want = [fp8_reference.chain(a[i], b[i], 0.0, toward_minus_inf=True) for i in range(300)]
    assert [f32_bits(x) for x in got.tolist()] == [f32_bits(x) for x in want]


def test_accumulate_equals_a_chain_of_steps_over_each_output_row_and_column():
    g = torch.Generator().manual_seed(3)
    a = torch.tensor(FINITE_E4M3, dtype=torch.uint8)[torch.randint(len(FINITE_E4M3), (5, 100), generator=g)].view(E4M3)
    w = torch.tensor(FINITE_E4M3, dtype=torch.uint8)[torch.randint(len(FINITE_E4M3), (7, 100), generator=g)].view(E4M3)
    acc = accumulate(FAST_ACCUM, a, w, max_elements=200)  # several row blocks
    pad = lambda x: torch.nn.functional.pad(x.view(torch.uint8), (0, 28)).tolist()  # noqa: E731
    for i in range(5):
        for j in range(7):
            assert f32_bits(acc[i, j].item()) == f32_bits(fp8_reference.chain(pad(a)[i], pad(w)[j], 0.0))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_model_gives_the_same_bits_on_the_gpu_as_on_the_cpu():
    g = torch.Generator().manual_seed(5)
    a = torch.tensor(FINITE_E4M3, dtype=torch.uint8)[torch.randint(len(FINITE_E4M3), (64, 512), generator=g)].view(E4M3)
    w = torch.tensor(FINITE_E4M3, dtype=torch.uint8)[torch.randint(len(FINITE_E4M3), (48, 512), generator=g)].view(E4M3)
    for schedule in (FAST_ACCUM, PROMOTE_128, parse_schedule("split-3x128+promote-64")):
        cpu = accumulate(schedule, a, w)
        gpu = accumulate(schedule, a.cuda(), w.cuda()).cpu()
        assert torch.equal(cpu.view(torch.int32), gpu.view(torch.int32))


def test_powers_of_two_are_built_exactly_over_the_whole_exponent_range():
    """The model's 2^e comes from the bit pattern, not torch.pow, whose GPU result was a few ulps off on the H100
    (analysis/results/h100/fp8/983cf50/README.md)."""
    from alibi.exact.fp8_mma import _pow2

    e = torch.arange(-1022, 1024)
    got = _pow2(e)
    assert [math.frexp(x) for x in got.tolist()] == [(0.5, k + 1) for k in range(-1022, 1024)]


# --- the f16 mma.sync step of a 16-row Triton fp8 dot (TRITON_F16_MMA) ---------------------------------------

MMA16_RECORDED = (Path(__file__).resolve().parents[2] / "analysis" / "results" / "h100" / "fp8-block" / "b1d8bb0"
                  / "call-2" / "mma16.safetensors")
CANCEL = {0: (256.0, 256.0), 1: (-256.0, 256.0)}  # 2^16 − 2^16 = 0 in the first instruction: 2^-18 there is cut


@pytest.mark.parametrize("tiny_at, survives", [(2, True), (3, True), (4, False), (5, False), (6, True), (16, False),
                                               (18, True), (31, True)])
def test_of_each_32_products_the_first_f16_instruction_takes_the_even_pairs(tiny_at, survives):
    """2^-18 beside 2^16 is below the 25-bit grid (2^-9) and cut when one instruction adds both; in the other
    instruction it meets only C = 0 and is kept."""
    got = dot({**CANCEL, tiny_at: (2.0**-9, 2.0**-9)}, model=TRITON_F16_MMA)
    assert got == (2.0**-18 if survives else 0.0)
    contiguous = dot({**CANCEL, tiny_at: (2.0**-9, 2.0**-9)}, model=replace(TRITON_F16_MMA, k_order="contiguous"))
    assert contiguous == (2.0**-18 if tiny_at >= 16 else 0.0)


def test_f16_operands_align_to_the_exponent_of_an_e4m3_subnormals_value():
    """2^-9 is an e4m3 subnormal (field exponent −6) and an f16 normal (exponent −9): the product's exponent is
    −18, not −12, so the grid is 2^-43 and C = 2^-40 is kept; read from the fields it would be cut on 2^-37."""
    assert dot([(2.0**-9, 2.0**-9)], c=2.0**-40, model=TRITON_F16_MMA) == 2.0**-18 + 2.0**-40
    assert dot([(2.0**-9, 2.0**-9)], c=2.0**-40, model=replace(TRITON_F16_MMA, f16_operands=False)) == 2.0**-18


def test_the_f16_mma_step_reproduces_every_bit_of_the_chains_recorded_on_an_h100_and_the_contiguous_order_does_not():
    """176 chains `C + a·b` through Triton's 16-row fp8 dot (`mma.sync.m16n8k16.f32.f16.f16.f32`), K 32 to 512,
    recorded on an H100 80GB HBM3 (analysis/h200/fp8_block_measure.py, part mma16)."""
    from safetensors import safe_open

    differ = {"declared": 0, "contiguous": 0}
    with safe_open(str(MMA16_RECORDED), "pt") as f:
        assert f.metadata()["instructions"] == "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
        tags = sorted({k.rsplit("/", 1)[0] for k in f.keys()})
        assert len(tags) == 176
        for tag in tags:
            a, b = (decode(f.get_tensor(f"{tag}/{x}").view(E4M3)) for x in ("a", "b"))
            A = type(a)(a.value[:, None], a.exponent[:, None], a.zero[:, None])
            B = type(b)(b.value[None], b.exponent[None], b.zero[None])
            out = f.get_tensor(f"{tag}/out").view(torch.int32)
            for name, model in (("declared", TRITON_F16_MMA),
                                ("contiguous", replace(TRITON_F16_MMA, k_order="contiguous"))):
                got = dot_steps(A, B, f.get_tensor(f"{tag}/c"), model)
                differ[name] += int((got.view(torch.int32) != out).sum())
    assert differ["declared"] == 0
    assert differ["contiguous"] > 1000
