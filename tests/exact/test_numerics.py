import math
import struct
from fractions import Fraction

import pytest
import torch
from exact_reference import BF16, FP16, round_nearest_even
from hypothesis import given, settings
from hypothesis import strategies as st

from alibi.errors import InputError
from alibi.exact.numerics import (
    bits,
    bitwise_equal,
    bitwise_equal_mask,
    compare_outputs,
    is_pow2,
    is_subnormal,
    max_ulp_distance,
    pow2_round,
    round_f64_to_bf16,
    round_to,
    ulp_distance,
)


def f32(x: float) -> torch.Tensor:
    return torch.tensor([x], dtype=torch.float32)


def bf16_from_bits(pattern: int) -> torch.Tensor:
    return torch.tensor([pattern], dtype=torch.int16).view(torch.bfloat16)


def test_signed_zero_is_a_mismatch_but_identical_nan_payloads_match():
    assert not bitwise_equal(torch.tensor([0.0]), torch.tensor([-0.0]))
    nan_a = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    nan_b = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    nan_c = torch.tensor([0x7FC00002], dtype=torch.int32).view(torch.float32)
    assert bitwise_equal(nan_a, nan_b)
    assert not bitwise_equal(nan_a, nan_c)


def test_ulp_distance_treats_both_zeros_as_one_point_and_skips_non_finite_pairs():
    a = torch.tensor([0.0, 1.0, float("nan"), 1.0, -1.0], dtype=torch.bfloat16)
    b = torch.tensor([-0.0, 1.0078125, float("nan"), float("inf"), 1.0], dtype=torch.bfloat16)
    assert ulp_distance(a, b).tolist() == [0, 1, -1, -1, 2 * 0x3F80]
    assert max_ulp_distance(a[:2], b[:2]) == 1


def test_smallest_subnormals_of_opposite_sign_are_two_ulps_apart():
    a, b = bf16_from_bits(0x0001), bf16_from_bits(-0x7FFF)  # +min subnormal and -min subnormal (0x8001)
    assert ulp_distance(a, b).item() == 2


@given(st.integers(0, 0x7F7F), st.integers(0, 0x7F7F))
def test_ulp_distance_counts_representable_values_between_positive_bf16s(p, q):
    a, b = bf16_from_bits(p), bf16_from_bits(q)
    assert ulp_distance(a, b).item() == abs(p - q)


@given(st.floats(min_value=1e-30, max_value=1e30, allow_subnormal=False))
def test_pow2_round_modes_bracket_the_scale_and_are_exact_powers(x):
    s = f32(x)
    lo, hi, near = pow2_round(s, "floor"), pow2_round(s, "ceil"), pow2_round(s, "nearest")
    for p in (lo, hi, near):
        assert bool(is_pow2(p).all())
    assert lo.item() <= s.item() <= hi.item()
    assert near.item() in (lo.item(), hi.item())
    # nearest in log2: the chosen power is no further from s in log space than the other
    other = hi.item() if near.item() == lo.item() else lo.item()
    assert abs(math.log2(near.item()) - math.log2(s.item())) <= abs(math.log2(other) - math.log2(s.item())) + 1e-12


def test_pow2_round_keeps_powers_of_two_and_rounds_at_sqrt_half():
    assert pow2_round(f32(0.25), "ceil").item() == 0.25
    assert pow2_round(f32(0.25), "floor").item() == 0.25
    below = f32(math.sqrt(0.5) * 0.999)
    above = f32(math.sqrt(0.5) * 1.001)
    assert pow2_round(below).item() == 0.5
    assert pow2_round(above).item() == 1.0


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_pow2_round_refuses_scales_that_are_not_positive_and_finite(bad):
    with pytest.raises(InputError, match="positive finite"):
        pow2_round(torch.tensor([1.0, bad]))


def test_pow2_round_refuses_an_unknown_mode():
    with pytest.raises(InputError, match="unknown"):
        pow2_round(f32(1.0), "up")  # type: ignore[arg-type]


def test_subnormal_detection_uses_the_values_own_dtype():
    x = torch.tensor([1e-40, 2e-38, 0.0, -1e-45], dtype=torch.float32)
    assert is_subnormal(x).tolist() == [True, False, False, True]
    h = torch.tensor([1e-5, 1e-4], dtype=torch.float16)
    assert is_subnormal(h).tolist() == [True, False]


def _fraction(t: torch.Tensor) -> Fraction:
    return Fraction(t.to(torch.float64).item())


@settings(max_examples=300)
@given(st.integers(0, 2**32 - 1))
def test_fp32_to_bf16_and_fp16_casts_round_to_nearest_even(pattern):
    x = torch.tensor([pattern], dtype=torch.int64).to(torch.int32).view(torch.float32)
    if not torch.isfinite(x).all():
        return
    for dtype, fmt in ((torch.bfloat16, BF16), (torch.float16, FP16)):
        got = round_to(x, dtype)
        want = round_nearest_even(_fraction(x), fmt)
        if isinstance(want, float):
            assert got.item() == want
        else:
            assert _fraction(got) == want
            if want == 0:  # sign of zero is kept
                assert math.copysign(1, got.item()) == math.copysign(1, x.item())


@settings(max_examples=300)
@given(st.floats(allow_nan=False, allow_infinity=False, width=64))
def test_float64_to_bf16_rounds_once(x):
    got = round_f64_to_bf16(torch.tensor([x], dtype=torch.float64))
    want = round_nearest_even(Fraction(x), BF16)
    if isinstance(want, float):
        assert got.item() == want
    else:
        assert _fraction(got) == want


def test_float64_to_bf16_avoids_the_double_rounding_of_going_through_fp32():
    # 1 + 2^-8 - 2^-40: rounds to the bf16 midpoint 1 + 2^-8 in fp32, then (ties to even) to 1.0;
    # correctly rounded it is below the midpoint, so also 1.0 — take an odd neighbour instead:
    x = 1 + 2**-7 + 2**-8 - 2**-40  # just below the midpoint between 1+2^-7 (odd) and 1+2^-6 (even)
    assert torch.tensor([x], dtype=torch.float64).to(torch.bfloat16).item() == 1 + 2**-6  # torch: two roundings
    assert round_f64_to_bf16(torch.tensor([x], dtype=torch.float64)).item() == 1 + 2**-7


def _midpoint_cases() -> list[tuple[float, float, str]]:
    """(x, its correct bf16 rounding, what x is) around the midpoints m = L + ulp/2 of bf16 neighbours L, L + ulp.

    L is even and odd (last significand bit), normal at several binades and subnormal, of both signs. x is m − ε,
    m + ε and m itself, with ε = ulp·2⁻³⁰: below half an fp32 ulp of m, so fp32's nearest rounding lands on m
    exactly and only the round-to-odd step keeps the side (fp64 holds m ± ε exactly: m has at most 9 bits)."""
    cases = []
    for significand in (0x80, 0x81, 0xC6, 0xFF):  # 8-bit significands: even, odd, even, odd
        for exponent in (-7, 53, -107, -133):  # ulp = 2^exponent; -133 is the bf16 (= fp32) subnormal ulp
            ulp = Fraction(2) ** exponent
            low = (significand if exponent > -133 else significand - 0x80) * ulp  # subnormal: below 2^-126
            for sign in (1, -1):
                m = low + ulp / 2
                eps = ulp * Fraction(2) ** -30
                odd = (significand & 1) == 1
                for x, want, what in ((m - eps, low, "just below"), (m + eps, low + ulp, "just above"),
                                      (m, low + ulp if odd else low, "exactly on")):
                    named = f"{what} the midpoint above {'odd' if odd else 'even'} {math.copysign(float(low), sign)!r}"
                    cases.append((float(sign * x), math.copysign(float(want), sign), named))
    return cases


def test_float64_to_bf16_rounds_either_side_of_a_midpoint_to_that_side_and_ties_to_even():
    """The round-to-odd step: truncating to fp32 keeps values just below a midpoint below it, the sticky odd bit keeps
    values just above it above (a plain truncation would make them ties), and an exact tie stays a tie (even)."""
    cases = _midpoint_cases()
    assert len({c[2] for c in cases}) == len(cases) == 96
    x = torch.tensor([c[0] for c in cases], dtype=torch.float64)
    want = [c[1] for c in cases]
    assert [Fraction(v) for v in x.tolist()] == [Fraction(c[0]) for c in cases]  # the inputs are exactly as built
    assert [Fraction(w) for w in want] == [round_nearest_even(Fraction(c[0]), BF16) for c in cases]  # the reference
    expected = torch.tensor(want, dtype=torch.float64).to(torch.bfloat16)  # exact: each is a bf16 value
    assert expected.double().tolist() == want and sum(math.copysign(1, w) < 0 for w in want) == len(want) // 2
    got = round_f64_to_bf16(x)
    wrong = [what for what, ok in zip((c[2] for c in cases), (bits(got) == bits(expected)).tolist()) if not ok]
    assert not wrong, f"{len(wrong)} of {len(cases)} rounded to the wrong side: {wrong[:6]}"
    # nearest-even twice (through fp32) errs exactly where the side is lost: above an even, below an odd neighbour
    twice = x.to(torch.float32).to(torch.bfloat16)
    lost = {what for what in (c[2] for c in cases) if what.startswith(("just above the midpoint above even",
                                                                        "just below the midpoint above odd"))}
    assert {c[2] for c, ok in zip(cases, (bits(twice) == bits(expected)).tolist()) if not ok} == lost and lost


def test_bits_gives_the_ieee_pattern():
    assert bits(f32(1.0)).item() == struct.unpack("<i", struct.pack("<f", 1.0))[0]
    assert bits(torch.tensor([-0.0], dtype=torch.bfloat16)).item() == -0x8000
    assert bitwise_equal_mask(f32(1.0), f32(1.0)).all()


def test_one_output_comparison_gives_the_mask_and_the_ulp_distance_that_the_separate_functions_give():
    a = torch.tensor([1.0, -0.0, float("inf"), 3.0, float("nan")], dtype=torch.bfloat16)
    b = torch.tensor([1.0, 0.0, float("inf"), 3.015625, float("nan")], dtype=torch.bfloat16)
    c = compare_outputs(a, b)
    assert c.differs.tolist() == (~bitwise_equal_mask(a, b)).tolist() == [False, True, False, True, False]
    assert c.ulp.tolist() == ulp_distance(a, b).tolist() == [0, 0, -1, 1, -1]
    assert (c.n_elements, c.n_differing, c.max_ulp) == (5, 2, max_ulp_distance(a, b)) == (5, 2, 1)
