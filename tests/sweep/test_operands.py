"""Sweep operands: nested prefixes really are slices, redraws really are fresh, seeds reproduce bits."""

from __future__ import annotations

import torch

from alibi.exact.numerics import bits, is_pow2
from alibi.sweep.depth import DepthPlan, operand_schedule
from alibi.sweep.operands import (
    INT8_K_LIMIT,
    INT8_PRODUCT_BOUND,
    OperandSpec,
    draw,
    seed_for,
)

CPU = torch.device("cpu")


def _bits_equal(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.shape == y.shape and x.dtype == y.dtype and torch.equal(x.view(torch.uint8), y.view(torch.uint8))


def test_nested_prefix_operands_are_the_leading_columns_of_the_largest_k():
    for fmt, scales in (("int8", None), ("fp8_e4m3", "row")):
        plan = DepthPlan("a", "b", fmt, Ks=(16, 48, 128), M=8, N=24, nested_prefix=True, fp8_scales=scales)
        schedule = list(operand_schedule(plan, seed=3, device=CPU))
        K_max, largest = schedule[-1]
        assert [K for K, _ in schedule] == [16, 48, 128] and K_max == 128
        for K, ops in schedule:
            assert ops.K == K
            assert _bits_equal(ops.a_q, largest.a_q[:, :K]) and _bits_equal(ops.w_q, largest.w_q[:, :K])
            assert _bits_equal(ops.s_a, largest.s_a) and _bits_equal(ops.s_w, largest.s_w)


def test_without_nested_prefix_each_k_is_a_fresh_draw():
    plan = DepthPlan("a", "b", "int8", Ks=(64, 128), M=8, N=24, nested_prefix=False)
    (_, small), (_, large) = operand_schedule(plan, seed=0, device=CPU)
    assert not _bits_equal(small.a_q, large.a_q[:, :64])
    assert not _bits_equal(small.s_a, large.s_a)


def test_the_same_words_give_the_same_bits_and_other_words_other_bits():
    spec = OperandSpec("int8", 8, 16)
    one, again, other = draw(spec, 64, (1, 64), CPU), draw(spec, 64, (1, 64), CPU), draw(spec, 64, (2, 64), CPU)
    assert _bits_equal(one.a_q, again.a_q) and _bits_equal(one.s_w, again.s_w)
    assert not _bits_equal(one.a_q, other.a_q)
    assert seed_for(1, 64) != seed_for(64, 1)  # word order matters: (seed, K) never collides with (K, seed)


def test_int8_activations_never_reach_minus_128_so_products_stay_within_16256():
    """The int8 K bound (132,104) rests on this: quantize_per_token scales |x| to at most 127."""
    ops = draw(OperandSpec("int8", 64, 32), 2048, (0,), CPU)
    assert int(ops.a_q.min()) >= -127
    assert int(ops.a_q.to(torch.int32).abs().amax() * ops.w_q.to(torch.int32).abs().amax()) <= INT8_PRODUCT_BOUND
    assert INT8_PRODUCT_BOUND * INT8_K_LIMIT < 2**31 <= INT8_PRODUCT_BOUND * (INT8_K_LIMIT + 1)


def test_int8_operands_have_real_per_token_and_per_channel_scales():
    ops = draw(OperandSpec("int8", 32, 48), 256, (0,), CPU)
    assert ops.s_a.shape == (32,) and ops.s_w.shape == (48,)
    assert not bool(is_pow2(ops.s_w).all()) and not bool(is_pow2(ops.s_a).all())
    # compressed-tensors stores the weight scale in bf16: every s_w is a bf16 value widened to fp32.
    assert torch.equal(ops.s_w.to(torch.bfloat16).to(torch.float32), ops.s_w)


def test_fp8_operands_per_tensor_scale_one_or_real_row_scales():
    tensor = draw(OperandSpec("fp8_e4m3", 16, 24, "tensor"), 64, (0,), CPU)
    assert tensor.a_q.dtype == torch.float8_e4m3fn and tensor.s_a.tolist() == [1.0] and tensor.s_w.tolist() == [1.0]
    row = draw(OperandSpec("fp8_e4m3", 16, 24, "row"), 64, (0,), CPU)
    assert row.s_a.shape == (16,) and row.s_w.shape == (24,) and not bool(is_pow2(row.s_a).all())
    for q in (row.a_q, row.w_q):
        v = q.to(torch.float32)
        assert bool(torch.isfinite(v).all()) and float(v.abs().max()) <= 448.0
        # Each row's largest magnitude becomes 448·(1 + δ), |δ| ≤ 2⁻²⁴ (one fp32 rounding of the scale),
        # which e4m3 rounds to 448 exactly.
        assert bool((v.abs().amax(dim=1) == 448.0).all())


def test_prefix_of_the_full_width_is_the_same_object_and_rows_slice_the_activations():
    ops = draw(OperandSpec("int8", 8, 16), 32, (0,), CPU)
    assert ops.prefix(32) is ops
    tile = ops.rows(2, 5)
    assert _bits_equal(tile.a_q, ops.a_q[2:5]) and _bits_equal(tile.s_a, ops.s_a[2:5]) and tile.w_q is ops.w_q
    assert bits(tile.s_a).shape == (3,)
