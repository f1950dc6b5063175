"""The rows sweep: its tiling arithmetic, its counts (predicted by the emulator), and its statistics."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import binomtest

from alibi.errors import InputError
from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator
from alibi.exact.numerics import bitwise_equal_mask
from alibi.sweep.arms import resolve_pair
from alibi.sweep.operands import OperandSpec, draw
from alibi.sweep.rows import RowsPlan, run_rows_sweep

CPU = torch.device("cpu")


def _run(kernel_b: str, **kw):
    plan = RowsPlan("torch-cpu", kernel_b, **kw).validate()
    return plan, run_rows_sweep(plan, resolve_pair("torch-cpu", kernel_b, "int8", tensorwise_ok=True), CPU)


@pytest.fixture(scope="module")
def order_rows():
    return _run("emulator:a_then_w", Ms=(1, 16), K=64, N=2048, elements=500_000, rows_per_block=128, seed=1)


def test_each_m_point_covers_the_requested_elements_with_whole_tiles(order_rows):
    plan, sweep = order_rows
    for p in sweep.points:
        R = plan.block_rows(p.M)
        assert p.elements >= 500_000 and p.elements - R * plan.N < 500_000  # no block more than needed
        assert p.tiles * p.M * plan.N == p.elements and p.blocks == math.ceil(500_000 / (R * plan.N))
        assert len(p.block_events) == p.blocks and sum(p.block_events) == p.rate.events


def test_rows_counts_are_exactly_the_scale_order_differences_of_the_drawn_blocks(order_rows):
    """The count at M does not depend on how the block is cut into tiles (exact accumulators, per-element
    epilogues), so it must equal the count on each whole block computed by the emulator."""
    plan, sweep = order_rows
    total = 0
    for p in sweep.points:
        spec = OperandSpec("int8", plan.block_rows(p.M), plan.N)
        for b, events in enumerate(p.block_events):
            ops = draw(spec, plan.K, (plan.seed, p.M, b), CPU)
            acc = exact_accumulator(ops.a_q, ops.w_q)
            wa = apply_epilogue(EpilogueModel("w_then_a"), acc, ops.s_a, ops.s_w)
            aw = apply_epilogue(EpilogueModel("a_then_w"), acc, ops.s_a, ops.s_w)
            assert events == int((~bitwise_equal_mask(wa, aw)).sum())
            total += events
    assert total > 0


def test_rows_rates_carry_the_exact_binomial_interval(order_rows):
    _, sweep = order_rows
    for p in sweep.points:
        ci = binomtest(p.rate.events, p.elements).proportion_ci(confidence_level=0.95, method="exact")
        assert (p.rate.low, p.rate.high) == (ci.low, ci.high)
        assert p.max_ulp == (1 if p.rate.events else 0) and p.n_ge2ulp == 0
    assert sweep.homogeneity.status == "ok" and sweep.trend.covariate == "M"
    assert sweep.trend.x_min == 1 and sweep.trend.x_max == 16


def test_no_differences_give_statuses_and_a_finite_upper_bound():
    _, sweep = _run("emulator:w_then_a", Ms=(1, 4), K=32, N=256, elements=20_000, rows_per_block=32)
    assert [p.rate.events for p in sweep.points] == [0, 0]
    assert all(0 < p.rate.high < 1e-3 for p in sweep.points)
    assert sweep.homogeneity.status == "no-events" and sweep.trend.status == "no-events"
    assert sweep.ratio.status == "no-events" and sweep.ratio.max_ratio is None


@pytest.mark.parametrize("change, message", [
    ({"Ms": (0, 4)}, "--M must list positive integers"),
    ({"Ms": (4, 4)}, "an M appears twice"),
    ({"elements": 0}, "--elements must be a positive number"),
    ({"N": 0}, "--N must be a positive integer"),
    ({"K": 200_000}, "exceeds the int32 bound"),
    ({"confidence": 1.0}, "--confidence"),
])
def test_rows_plan_refuses_bad_parameters(change, message):
    with pytest.raises(InputError, match=message):
        RowsPlan("torch-cpu", "emulator:a_then_w", **change).validate()
