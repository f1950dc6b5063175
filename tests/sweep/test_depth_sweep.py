"""The depth sweep on CPU kernels, where its every count can be predicted from the exact emulator."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator
from alibi.exact.numerics import bitwise_equal_mask
from alibi.sweep.arms import resolve_pair
from alibi.sweep.depth import DepthPlan, operand_schedule, run_depth_sweep

CPU = torch.device("cpu")
BF16_UNIT_ROUNDOFF = 2.0**-8  # bf16 keeps 8 significant bits: |bf16(y) − y| ≤ 2⁻⁸·|y| for normal y
FP32_EPILOGUE_SLACK = 2.0**-21  # ≥ three fp32 roundings (int→fp32, two scale products) of 2⁻²⁴ each, and their cross terms


def _sweep(kernel_a: str, kernel_b: str, **plan):
    p = DepthPlan(kernel_a, kernel_b, "int8", **plan).validate()
    return p, run_depth_sweep(p, resolve_pair(kernel_a, kernel_b, "int8", tensorwise_ok=True), CPU)


@pytest.fixture(scope="module")
def order_sweep():
    """torch-cpu (w_then_a) against the emulator's a_then_w: big enough tiles for a few differences."""
    return _sweep("torch-cpu", "emulator:a_then_w", Ks=(256, 1024, 4096), M=256, N=1024, seeds=2,
                  nested_prefix=True)


def test_same_epilogue_model_as_torch_cpu_gives_zero_differing_elements():
    """torch-cpu runs w_then_a (no bias: its add_before_cast never applies) on an exact int32
    accumulator, so the emulator of w_then_a must return the same bits at every K."""
    _, sweep = _sweep("torch-cpu", "emulator:w_then_a", Ks=(128, 512, 2048), M=64, N=256, seeds=2,
                      nested_prefix=True)
    assert [r.n_differing for r in sweep.records] == [0] * 6
    assert all(r.max_ulp == 0 and r.share_ge2ulp is None for r in sweep.records)


def test_differing_elements_are_exactly_those_the_two_scale_orders_predict(order_sweep):
    plan, sweep = order_sweep
    by_key = {(r.seed, r.K): r for r in sweep.records}
    total = 0
    for seed in sweep.seeds:
        for K, ops in operand_schedule(plan, seed, CPU):
            acc = exact_accumulator(ops.a_q, ops.w_q)
            wa = apply_epilogue(EpilogueModel("w_then_a"), acc, ops.s_a, ops.s_w)
            aw = apply_epilogue(EpilogueModel("a_then_w"), acc, ops.s_a, ops.s_w)
            predicted = int((~bitwise_equal_mask(wa, aw)).sum())
            assert by_key[(seed, K)].n_differing == predicted
            total += predicted
    assert total > 0  # these operands do exercise the comparison (a fact of the seeded draws)


def test_int8_scale_order_differences_stay_within_one_ulp(order_sweep):
    _, sweep = order_sweep
    for r in sweep.records:
        assert r.max_ulp is not None and r.max_ulp <= 1
        assert r.n_ge2ulp == 0
        assert r.n_near_zero_differing + r.n_differing_far == r.n_differing  # ref = 0 exactly never differs


def test_each_int8_arm_is_within_bf16_rounding_of_the_exact_reference(order_sweep):
    _, sweep = order_sweep
    bound = BF16_UNIT_ROUNDOFF + FP32_EPILOGUE_SLACK
    for r in sweep.records:
        for worst, mean in ((r.err_a_max_rel, r.err_a_mean_rel), (r.err_b_max_rel, r.err_b_mean_rel)):
            assert 0 < mean < worst <= bound
    assert sweep.reference.startswith("cpu: alibi.exact.emulator.exact_accumulator")
    assert sweep.reference_check.startswith("not needed")


def test_sweep_records_are_reproducible_apart_from_their_times(order_sweep):
    plan, first = order_sweep
    again = run_depth_sweep(plan, resolve_pair(plan.kernel_a, plan.kernel_b, "int8", tensorwise_ok=True), CPU)
    untimed = {"seconds_a": 0.0, "seconds_b": 0.0, "seconds_reference": 0.0}
    assert [dataclasses.replace(r, **untimed) for r in first.records] == \
           [dataclasses.replace(r, **untimed) for r in again.records]


def test_timing_accounts_for_the_kernel_seconds_of_every_record(order_sweep):
    _, sweep = order_sweep
    t = sweep.timing
    assert sum(r.seconds_a for r in sweep.records) == pytest.approx(t.kernel_a, rel=1e-9)
    assert sum(r.seconds_b for r in sweep.records) == pytest.approx(t.kernel_b, rel=1e-9)
    assert sum(r.seconds_reference for r in sweep.records) == pytest.approx(t.reference, rel=1e-9)
    assert t.share_outside_kernels == pytest.approx(1 - (t.kernel_a + t.kernel_b) / t.total)
    parts = t.operands + t.warmup + t.kernel_a + t.kernel_b + t.reference + t.reference_check + t.compare + t.other
    assert parts == pytest.approx(t.total, rel=1e-9)
    assert 0 <= t.share_outside_kernels_and_reference <= t.share_outside_kernels <= 1


def test_record_counts_and_fraction_agree(order_sweep):
    _, sweep = order_sweep
    for r in sweep.records:
        assert r.n == 256 * 1024 and r.frac_differ == r.n_differing / r.n
        assert r.near_zero_floor > 0 and r.n_near_zero >= r.n_near_zero_differing
