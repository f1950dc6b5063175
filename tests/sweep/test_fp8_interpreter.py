"""The depth sweep on fp8: `triton-fp8` (the real kernel code, under the Triton interpreter without
CUDA) against the emulated `fp8-sequential` reference, at small shapes (the interpreter is slow).

Neither kernel's fp32 summation order is the other's, so their outputs may differ; what the sweep
must get right is which elements differ (checked against the kernels run directly on the same
operands) and the exact reference each is measured against (checked with the classical bound on
floating-point summation, which holds for any order).
"""

from __future__ import annotations

import pytest
import torch

from alibi.exact.numerics import bitwise_equal_mask
from alibi.sweep.arms import resolve_pair
from alibi.sweep.compare import exact_product, scaled
from alibi.sweep.depth import DepthPlan, operand_schedule, run_depth_sweep

CPU = torch.device("cpu")
FP32_UNIT_ROUNDOFF = 2.0**-24
BF16_UNIT_ROUNDOFF = 2.0**-8
REFERENCE = "fp8-sequential:a_then_w+add_after_cast"  # the epilogue triton-fp8 declares


@pytest.fixture(scope="module")
def fp8_arms():
    from alibi.kernels.registry import get_kernel

    ok, reason = get_kernel("triton-fp8").available()
    if not ok:
        pytest.skip(reason)
    return resolve_pair("triton-fp8", REFERENCE, "fp8_e4m3", tensorwise_ok=True)


@pytest.mark.parametrize("scales, Ks, M, N", [("tensor", (256, 4096), 64, 128), ("row", (64, 512), 16, 32)])
def test_fp8_sweep_counts_the_elements_where_the_kernels_differ(fp8_arms, scales, Ks, M, N):
    plan = DepthPlan("triton-fp8", REFERENCE, "fp8_e4m3", Ks=Ks, M=M, N=N, seeds=2, nested_prefix=True,
                     fp8_scales=scales).validate()
    sweep = run_depth_sweep(plan, fp8_arms, CPU)
    assert sweep.reference.startswith("cpu: torch float64 matmul") and sweep.fp8_scales == scales
    arm_a, arm_b = fp8_arms
    records = iter(sweep.records)
    total = 0
    for seed in sweep.seeds:
        for K, ops in operand_schedule(plan, seed, CPU):
            r = next(records)
            direct = int((~bitwise_equal_mask(arm_a.run(ops), arm_b.run(ops))).sum())
            assert (r.seed, r.K, r.n) == (seed, K, M * N) and r.n_differing == direct
            total += direct
    if scales == "tensor":
        assert total > 0  # at K = 4096 the two fp32 summation orders do round differently here


def test_both_fp8_arms_are_within_the_summation_error_bound_of_the_sweeps_reference(fp8_arms):
    """|out − ref| ≤ u·|ref| + (1 + u)·γ_K·Σ|a·w| with γ_K = K·u₃₂/(1 − K·u₃₂): any fp32 summation order
    of K exact products, then one bf16 rounding (u = 2⁻⁸); per-tensor scales 1 add no rounding."""
    plan = DepthPlan("triton-fp8", REFERENCE, "fp8_e4m3", Ks=(512, 2048), M=16, N=32, seeds=1,
                     nested_prefix=True).validate()
    for K, ops in operand_schedule(plan, 0, CPU):
        acc, _ = exact_product(ops, CPU)
        ref = scaled(acc, ops)
        magnitude = ops.a_q.double().abs() @ ops.w_q.double().abs().T
        gamma = K * FP32_UNIT_ROUNDOFF / (1 - K * FP32_UNIT_ROUNDOFF)
        bound = BF16_UNIT_ROUNDOFF * ref.abs() + (1 + BF16_UNIT_ROUNDOFF) * gamma * magnitude
        for arm in fp8_arms:
            out = arm.run(ops).double()
            assert bool(((out - ref).abs() <= bound).all()), arm.kernel.name
