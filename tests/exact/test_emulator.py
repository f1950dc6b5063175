import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from exact_reference import BF16, FP16, FP32, round_nearest_even
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from alibi.exact.emulator import (
    EpilogueModel,
    apply_epilogue,
    exact_accumulator,
    fma_f32,
    int32_wrap,
    predict,
    product_bound,
)
from alibi.exact.numerics import bitwise_equal, is_pow2

FORMATS = {torch.bfloat16: BF16, torch.float16: FP16, torch.float32: FP32}
int8s = st.integers(-128, 127)
fp32_scales = st.floats(min_value=2.0**-40, max_value=1024.0, width=32, allow_subnormal=False)


def rnd(x, fmt):
    """Correct rounding of a Fraction, passing infinities through."""
    return x if isinstance(x, float) else round_nearest_even(x, fmt)


def mul(x, y, fmt=FP32):
    if isinstance(x, float) or isinstance(y, float):
        return x * y if (x != 0 and y != 0) else math.nan
    return rnd(x * y, fmt)


def reference_epilogue(model: EpilogueModel, acc: int, s_a: float, s_w: float, bias: float | None, out):
    """science.md's epilogue programs in exact rational arithmetic with explicit roundings."""
    a = rnd(Fraction(acc), FP32)
    sa, sw = Fraction(s_a), Fraction(s_w)
    if model.statistics is not None:  # bitsandbytes: the scales enter as absmax statistics RN32(127·s)
        sa, sw = rnd(127 * sa, FP32), rnd(127 * sw, FP32)
    if model.order == "w_then_a":
        first, last = mul(a, sw), sa
    elif model.order == "a_then_w":
        first, last = mul(a, sa), sw
    else:
        first, last = a, rnd(sa * sw, FP32)
    fmt = FORMATS[out]
    if model.round_between:
        first = rnd(first, fmt)
    if model.statistics is not None:  # y·c, fused with the bias (zero when absent) under fma
        y, c = mul(first, last), Fraction(model.statistics)
        if model.bias == "fma":
            return rnd(y if isinstance(y, float) else rnd(y * c + Fraction(bias or 0), FP32), fmt)
        if bias is None:
            return rnd(mul(y, c), fmt)
        if model.bias == "add_before_cast":
            return rnd(rnd(mul(y, c) + Fraction(bias), FP32), fmt)
        return rnd(rnd(rnd(mul(y, c), fmt) + Fraction(bias), FP32), fmt)
    if bias is None:
        return rnd(mul(first, last), fmt)
    b = Fraction(bias)
    if model.bias == "fma":
        return rnd(rnd(first * last + b, FP32), fmt)
    if model.bias == "add_before_cast":
        return rnd(rnd(mul(first, last) + b, FP32), fmt)
    cast = rnd(mul(first, last), fmt)
    return rnd(rnd(cast + b, FP32), fmt)


def as_fraction(t: torch.Tensor):
    v = t.to(torch.float64).item()
    return v if not math.isfinite(v) else Fraction(v)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 40), st.integers(1, 6), st.data())
def test_exact_accumulator_equals_the_int64_dot_products(M, K, N, data):
    a = torch.tensor(data.draw(st.lists(int8s, min_size=M * K, max_size=M * K)), dtype=torch.int8).reshape(M, K)
    w = torch.tensor(data.draw(st.lists(int8s, min_size=N * K, max_size=N * K)), dtype=torch.int8).reshape(N, K)
    want = [[sum(int(a[m, k]) * int(w[n, k]) for k in range(K)) for n in range(N)] for m in range(M)]
    assert exact_accumulator(a, w).tolist() == want


def test_exact_accumulator_is_exact_at_k_32768_with_all_minus_128_operands():
    K = 32768
    a = torch.full((2, K), -128, dtype=torch.int8)
    w = torch.full((3, K), -128, dtype=torch.int8)
    assert (exact_accumulator(a, w) == 128 * 128 * K).all()
    assert int32_wrap(exact_accumulator(a, w)).tolist()[0][0] == 2**29



@pytest.mark.parametrize("shape", [(), (7,), (3, 5), (2, 3, 4)])
def test_int32_wrap_is_the_twos_complement_residue_of_every_int64_in_any_shape(shape):
    edges = [0, 1, -1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32, 2**32 + 5, -(2**32) - 5, 2**63 - 1, -(2**63),
             3 * 2**40 + 12345, -(7 * 2**35) - 1]
    n = math.prod(shape)
    values = (edges * (n // len(edges) + 1))[:n] if n > 1 else [2**31 + 9]
    acc = torch.tensor(values, dtype=torch.int64).reshape(shape)
    wrapped = int32_wrap(acc)
    assert wrapped.dtype == torch.int32 and wrapped.shape == acc.shape
    assert wrapped.reshape(-1).tolist() == [(v + 2**31) % 2**32 - 2**31 for v in values]
    assert int32_wrap(acc.T if acc.dim() == 2 else acc).reshape(-1).tolist() == \
        [(v + 2**31) % 2**32 - 2**31 for v in (acc.T if acc.dim() == 2 else acc).reshape(-1).tolist()]

@settings(max_examples=400, deadline=None)
@given(st.sampled_from(["w_then_a", "a_then_w", "product_first"]),
       st.sampled_from(["fma", "add_before_cast", "add_after_cast"]),
       st.integers(-(2**31), 2**31 - 1), fp32_scales, fp32_scales,
       st.none() | st.floats(min_value=-1024.0, max_value=1024.0, width=16),
       st.sampled_from([torch.bfloat16, torch.float16]), st.booleans(),
       st.sampled_from([None, 6.200012e-05, 6.200124e-05]))
def test_epilogue_models_equal_the_exact_rational_reference(order, bias_mode, acc, s_a, s_w, bias, out, round_between,
                                                            statistics):
    assume(not (round_between and order == "product_first"))
    model = EpilogueModel(order, bias_mode, round_between, statistics)
    bias_t = None if bias is None else torch.tensor([bias], dtype=torch.bfloat16)
    bias_v = None if bias_t is None else bias_t.float().item()
    got = apply_epilogue(model, torch.tensor([[acc]]), torch.tensor([s_a], dtype=torch.float32),
                         torch.tensor([s_w], dtype=torch.float32), bias_t, out)
    want = reference_epilogue(model, acc, torch.tensor(s_a).float().item(), torch.tensor(s_w).float().item(),
                              bias_v, out)
    got_v = as_fraction(got)
    if isinstance(want, float) and math.isnan(want):
        assert math.isnan(got_v)
    else:
        assert got_v == want


fp32_any = st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=-2.0**60, max_value=2.0**60)


@settings(max_examples=500, deadline=None)
@given(fp32_any, fp32_any, fp32_any)
def test_fma_f32_rounds_once(x, y, z):
    got = fma_f32(torch.tensor([x]), torch.tensor([y]), torch.tensor([z]))
    assert as_fraction(got) == round_nearest_even(Fraction(x) * Fraction(y) + Fraction(z), FP32)


def test_fma_f32_is_exact_where_fp64_double_rounding_would_be_wrong():
    # a*b = 1 + 2^-24 - 2^-47 exactly; adding z = 2^-47 + 2^-70 puts the fp64 sum on the fp32 midpoint
    # 1 + 2^-24 with a positive residual 2^-70, so the correct fp32 result is 1 + 2^-23 (round up),
    # while rounding the fp64 sum (ties to even) gives 1.0.
    a = torch.tensor([1 + 2**-23], dtype=torch.float32)
    b = torch.tensor([1 - 2**-24], dtype=torch.float32)  # (1+2^-23)(1-2^-24) = 1 + 2^-24 - 2^-47
    z = torch.tensor([2**-47 + 2**-70], dtype=torch.float32)
    exact = Fraction(a.item()) * Fraction(b.item()) + Fraction(z.item())
    assert exact > 1 + Fraction(1, 2**24)  # just above the midpoint
    naive = (a.double() * b.double() + z.double()).float()
    assert naive.item() == 1.0  # fp64 sum lands on the midpoint, ties-to-even goes down: wrong
    assert fma_f32(a, b, z).item() == 1 + 2**-23


@pytest.mark.parametrize("acc, fp32_value", [
    (2**24 - 1, 2**24 - 1), (2**24, 2**24), (2**24 + 1, 2**24), (2**24 + 2, 2**24 + 2),
    (-(2**24 - 1), -(2**24 - 1)), (-(2**24), -(2**24)), (-(2**24 + 1), -(2**24)), (-(2**24 + 2), -(2**24 + 2)),
])
def test_accumulators_enter_fp32_exactly_up_to_2_pow_24_and_round_beyond(acc, fp32_value):
    one = torch.ones(1)
    y = apply_epilogue(EpilogueModel("a_then_w"), torch.tensor([[acc]]), one, one, None, torch.float32)
    assert y.item() == fp32_value


@settings(max_examples=300, deadline=None)
@given(st.integers(-(2**24), 2**24), st.floats(min_value=2.0**-66, max_value=2.0**16, width=32), st.integers(-30, 10),
       st.sampled_from([torch.bfloat16, torch.float16]))
def test_pow2_weight_scales_make_every_epilogue_order_bitwise_equal(acc, s_a, k, out):
    sa = torch.tensor([s_a], dtype=torch.float32)
    sw = torch.tensor([2.0**k], dtype=torch.float32)
    acc_t = torch.tensor([[acc]])
    y32 = apply_epilogue(EpilogueModel("a_then_w"), acc_t, sa, sw, None, torch.float32)
    assume(torch.isfinite(y32).all() and (y32.abs() >= torch.finfo(torch.float32).tiny).all() or acc == 0)
    outs = [apply_epilogue(EpilogueModel(o), acc_t, sa, sw, None, out) for o in ("w_then_a", "a_then_w", "product_first")]
    assert bitwise_equal(outs[0], outs[1]) and bitwise_equal(outs[1], outs[2])


def test_subnormal_outputs_break_pow2_commutation():
    sa = torch.full((64,), 1.3 * 2**-126, dtype=torch.float32)  # a normal scale just above the subnormal range
    sw = torch.tensor([2.0**-5])
    acc = torch.arange(1, 65).reshape(64, 1)
    wa = apply_epilogue(EpilogueModel("w_then_a"), acc, sa, sw, None, torch.float32)
    aw = apply_epilogue(EpilogueModel("a_then_w"), acc, sa, sw, None, torch.float32)
    differs = wa != aw
    assert differs.any()
    assert (wa[differs].abs() < torch.finfo(torch.float32).tiny).all()  # only in the subnormal range


def test_overflow_breaks_pow2_commutation():
    sa = torch.tensor([2.0**120], dtype=torch.float32)
    sw = torch.tensor([2.0**-10])
    acc = torch.tensor([[2**10]])
    assert math.isinf(apply_epilogue(EpilogueModel("a_then_w"), acc, sa, sw, None, torch.float32).item())
    assert apply_epilogue(EpilogueModel("w_then_a"), acc, sa, sw, None, torch.float32).item() == 2.0**120


def test_int32_bounds_follow_the_product_bound():
    a = torch.tensor([[-128, 1]], dtype=torch.int8)
    w = torch.tensor([[127, 1]], dtype=torch.int8)
    assert product_bound(a, w) == 16256
    assert product_bound(a, -w.clamp(max=127) - 1) == 16384  # both contain -128
    assert predict(a, w).k_limit == 132104
    assert predict(a, torch.tensor([[-128, 1]], dtype=torch.int8)).k_limit == 131071


def test_prediction_marks_accumulators_above_2_pow_24_eligible_to_diverge():
    K = 1100
    a = torch.full((1, K), 127, dtype=torch.int8)
    w = torch.full((1, K), 127, dtype=torch.int8)  # 127*127*1100 = 17,741,900 > 2^24
    p = predict(a, w)
    assert not p.fp32_lossless and p.prediction == "eligible-to-diverge" and p.headroom_bits < 0
    p = predict(a[:, :1000], w[:, :1000])  # 16,129,000 ≤ 2^24
    assert p.fp32_lossless and p.prediction == "bitwise-safe" and p.headroom_bits > 0


def test_is_pow2_accepts_only_exact_powers():
    assert is_pow2(torch.tensor([1.0, 0.5, 2.0**-140, 3.0, 0.0, -2.0])).tolist() == [True, True, True, False, False, False]


FLT_MAX = float(torch.finfo(torch.float32).max)


@pytest.mark.parametrize("sign", [1, -1])
def test_fma_f32_returns_flt_max_just_below_the_overflow_tie(sign):
    """Guards issue 16: x·y = 2¹²⁸ − 2¹⁰³ is exactly halfway between FLT_MAX and the overflow
    threshold; z = −2⁻¹⁰⁰ puts the exact value below it, so RN32 gives FLT_MAX, not +inf (the fp64
    sum rounds to the tie and its fp32 cast overflowed)."""
    x, y, z = sign * 18631 * 2.0**50, 1801 * 2.0**53, -sign * 2.0**-100
    exact = Fraction(x) * Fraction(y) + Fraction(z)
    assert Fraction(x) * Fraction(y) == sign * (Fraction(2) ** 128 - Fraction(2) ** 103)
    assert round_nearest_even(exact, FP32) == sign * Fraction(FLT_MAX)
    got = fma_f32(torch.tensor([x]), torch.tensor([y]), torch.tensor([z]))
    assert got.item() == sign * FLT_MAX


@pytest.mark.parametrize("z", [0.0, 2.0**-100])
def test_fma_f32_overflows_at_and_above_the_tie(z):
    """At the tie itself (ties to even: FLT_MAX's significand is odd) and above it, RN32 overflows."""
    x, y = 18631 * 2.0**50, 1801 * 2.0**53
    assert round_nearest_even(Fraction(x) * Fraction(y) + Fraction(z), FP32) == math.inf
    assert fma_f32(torch.tensor([x]), torch.tensor([y]), torch.tensor([z])).item() == math.inf


fp32_full = st.floats(width=32, allow_nan=False, allow_infinity=False)
near_overflow = st.builds(lambda m, e: m * 2.0**e, st.integers(2**23, 2**24 - 1), st.integers(40, 81))


@settings(max_examples=1500, deadline=None)
@given(st.one_of(fp32_full, near_overflow), st.one_of(fp32_full, near_overflow), fp32_full)
def test_fma_f32_equals_exact_rational_rounding_over_the_whole_fp32_range(x, y, z):
    """Against fractions.Fraction and integer rounding (tests/exact_reference.py), including
    products near and past the overflow boundary and subnormal results."""
    x, y = float(torch.tensor(x, dtype=torch.float32)), float(torch.tensor(y, dtype=torch.float32))
    got = fma_f32(torch.tensor([x]), torch.tensor([y]), torch.tensor([z]))
    want = round_nearest_even(Fraction(x) * Fraction(y) + Fraction(z), FP32)
    assert as_fraction(got) == want


@settings(max_examples=1500, deadline=None)
@given(st.integers(2**23, 2**24 - 1), st.integers(2**23, 2**24 - 1), st.integers(-160, 127), st.booleans(),
       st.sampled_from([1, -1]))
def test_fma_f32_is_exact_for_products_straddling_the_overflow_threshold(mx, my, ez, negative_z, sign):
    """x·y in [2¹²⁷, 2¹²⁹): products on both sides of the overflow threshold 2¹²⁸ − 2¹⁰³, with z of
    either sign and any size from 2⁻¹⁶⁰ (below fp32's subnormals: 0 as an fp32 operand) to 2¹²⁷."""
    x, y = sign * mx * 2.0**71, my * 2.0**10  # both exact in fp32 (24-bit significands)
    z = float(np.float32((-1 if negative_z else 1) * 2.0**ez))
    got = fma_f32(torch.tensor([x]), torch.tensor([y]), torch.tensor([z]))
    assert as_fraction(got) == round_nearest_even(Fraction(x) * Fraction(y) + Fraction(z), FP32)


# 2²⁵ − 1 = 31 · 601 · 1801: every split into two fp32 significands gives a product exactly on the tie.
TIE_FACTORS = [(31, 601 * 1801), (601, 31 * 1801), (1801, 31 * 601)]


@pytest.mark.parametrize("a,b", TIE_FACTORS)
@pytest.mark.parametrize("z,expected", [(-(2.0**-149), FLT_MAX), (-1.0, FLT_MAX), (0.0, math.inf),
                                        (2.0**-149, math.inf)])
def test_every_product_exactly_on_the_overflow_tie_rounds_by_the_sign_of_z(a, b, z, expected):
    ea = 64 - a.bit_length()
    x, y = a * 2.0**ea, b * 2.0**(103 - ea)  # x·y = (2²⁵ − 1)·2¹⁰³ = 2¹²⁸ − 2¹⁰³
    assert Fraction(x) * Fraction(y) == Fraction(2) ** 128 - Fraction(2) ** 103
    want = round_nearest_even(Fraction(x) * Fraction(y) + Fraction(z), FP32)
    assert want == (Fraction(expected) if expected != math.inf else math.inf)
    assert fma_f32(torch.tensor([x]), torch.tensor([y]), torch.tensor([z])).item() == expected


def test_round_between_is_the_intermediate_rounding_of_the_first_product():
    """acc·s_a = 1 + 2⁻⁸ exactly (fp32), a bf16 tie that rounds to even, 1; ·s_w = 3 then gives 3, where the
    unrounded product 3 + 3·2⁻⁸ rounds to bf16 3.015625."""
    acc, s_a, s_w = torch.tensor([[257]]), torch.tensor([2.0**-8]), torch.tensor([3.0])
    plain = apply_epilogue(EpilogueModel("a_then_w"), acc, s_a, s_w, None, torch.bfloat16)
    rounded = apply_epilogue(EpilogueModel("a_then_w", round_between=True), acc, s_a, s_w, None, torch.bfloat16)
    assert plain.item() == 3.015625 and rounded.item() == 3.0


def test_round_between_changes_nothing_when_the_first_product_fits_the_output_dtype():
    acc, s_a, s_w = torch.tensor([[96]]), torch.tensor([0.5]), torch.tensor([0.375])
    for order in ("w_then_a", "a_then_w"):
        plain = apply_epilogue(EpilogueModel(order), acc, s_a, s_w, None, torch.bfloat16)
        rounded = apply_epilogue(EpilogueModel(order, round_between=True), acc, s_a, s_w, None, torch.bfloat16)
        assert bitwise_equal(plain, rounded)


def test_round_between_names_parse_back_and_product_first_refuses_it():
    from alibi.errors import InputError

    model = EpilogueModel("a_then_w", "add_before_cast", True)
    assert model.name == "a_then_w+add_before_cast+round_between"
    assert EpilogueModel.parse(model.name) == model
    assert EpilogueModel.parse("w_then_a+round_between") == EpilogueModel("w_then_a", "fma", True)
    with pytest.raises(InputError, match="product_first"):
        EpilogueModel("product_first", round_between=True)
