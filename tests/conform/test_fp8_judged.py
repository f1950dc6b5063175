"""fp8 pairs are judged from each arm's declared accumulation schedule and epilogue (docs/fp8.md), on the CPU.

The arms here are the fp8 emulator kernels and kernels built for the test, so every expectation follows from the
declarations: two schedules that promote at different intervals differ exactly where the model says, with that
cause; an arm without a schedule, or with a nondeterministic one, leaves the pair not judged (inconclusive, never a
pass), naming the arm and the shape; an arm that departs from its declaration is caught.
"""

from __future__ import annotations

import pytest
import torch

from alibi.conform.matrix import PairStatus, run_matrix
from alibi.conform.pipeline import Pair, run_conformance, source_from_tiles
from alibi.conform.results import ReportVerdict
from alibi.controls.fp8_schedule import random_fp8_tile
from alibi.exact.emulator import EpilogueModel, apply_epilogue
from alibi.exact.fp8_mma import AccumulationSchedule, SplitK, accumulate
from alibi.kernels.base import Kernel
from alibi.kernels.registry import get_kernel

TILES = [random_fp8_tile(4, 48, 512, seed=1), random_fp8_tile(3, 40, 300, seed=2, out_dtype=torch.float16)]


def conform(a, b, **kw):
    return run_conformance(Pair(a, b, "test"), source_from_tiles(TILES), ("real",), created_at=None, **kw)


class DeclaredFp8(Kernel):
    """An fp8 kernel that computes `schedule` but declares `declared` (None: no schedule)."""

    formats = ("fp8_e4m3",)
    epilogue = EpilogueModel("w_then_a", "fma")

    def __init__(self, name: str, schedule: AccumulationSchedule, declared: AccumulationSchedule | None):
        self.name, self.schedule, self.accumulation = name, schedule, declared

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        return apply_epilogue(self.epilogue, accumulate(self.schedule, a_q, w_q), s_a, s_w, bias, out_dtype)


FAST = AccumulationSchedule("fast-accum")
PROMOTE = AccumulationSchedule("promote-128", promotion_k=128)


def test_two_fp8_arms_that_promote_differently_differ_exactly_where_their_schedules_predict_and_say_why():
    r = conform(get_kernel("emulator-fp8:fast-accum:w_then_a"), get_kernel("emulator-fp8:promote-128:w_then_a"))
    pd = r.check("predicted-differences")
    assert pd.applicable and not pd.fired
    assert sum(u.n_differing for u in r.tiles) > 0 and all(u.explained for u in r.tiles)
    assert {u.cause for u in r.tiles if u.n_differing} == {"accumulation schedule (promotion interval)"}


def test_a_schedule_and_a_bias_mode_that_both_differ_are_named_together():
    t = TILES[0]
    biased = t.replace(bias=(0.01 * torch.randn(t.N, generator=torch.Generator().manual_seed(3))).to(torch.bfloat16))
    r = run_conformance(Pair(get_kernel("emulator-fp8:fast-accum:w_then_a"),
                             get_kernel("emulator-fp8:promote-128:w_then_a+add_after_cast"), "test"),
                        source_from_tiles([biased]), ("real",), created_at=None)
    assert r.tiles[0].cause == "accumulation schedule (promotion interval) and bias mode"
    assert not r.check("predicted-differences").fired


def test_an_fp8_arm_that_declares_no_schedule_leaves_the_pair_inconclusive_naming_the_arm():
    r = conform(get_kernel("emulator-fp8:fast-accum:w_then_a"), DeclaredFp8("undeclared", FAST, None))
    pd = r.check("predicted-differences")
    assert not pd.applicable and r.verdict == ReportVerdict.INCONCLUSIVE
    detail = r.tiles[0].verdict("predicted-differences").detail
    assert "arm b (`undeclared`) declares no fp8 accumulation schedule" in detail


def test_a_nondeterministic_schedule_is_not_judged_and_the_shape_is_named():
    nondet = AccumulationSchedule("atomics", split_k=SplitK(4, 128, "nondeterministic"))
    r = conform(get_kernel("emulator-fp8:fast-accum:w_then_a"), DeclaredFp8("atomic-split", FAST, nondet))
    detail = r.tiles[0].verdict("predicted-differences").detail
    assert "nondeterministic reduction at M=4, N=48, K=512" in detail and r.verdict == ReportVerdict.INCONCLUSIVE


def test_an_fp8_kernel_that_promotes_but_declares_fast_accumulation_fails_its_declaration():
    liar = DeclaredFp8("liar", PROMOTE, FAST)
    r = conform(get_kernel("emulator-fp8:fast-accum:w_then_a"), liar)
    assert r.check("epilogue-model").fired and r.check("predicted-differences").fired
    assert r.verdict == ReportVerdict.FAIL


@pytest.mark.parametrize("fault", ["promotion-interval", "dropped-k-chunk", "reordered-split-k"])
def test_every_fp8_mutant_is_caught_by_the_declared_schedule(fault):
    base = "emulator-fp8:fast-accum:w_then_a"
    r = conform(get_kernel(base), get_kernel(f"mutant:{fault}:{base}"))
    assert sum(u.n_differing for u in r.tiles) > 0
    assert r.check("epilogue-model").fired and r.check("exact-accumulator").fired


def test_the_fp8_null_mutant_stays_silent():
    base = "emulator-fp8:promote-128:w_then_a"
    r = conform(get_kernel(base), get_kernel(f"mutant:null:{base}"))
    assert not any(v.fired for v in r.checks)


def test_a_matrix_cell_without_a_prediction_is_not_judged_and_says_why_and_the_others_are_judged():
    kernels = [get_kernel("emulator-fp8:fast-accum:w_then_a"), get_kernel("emulator-fp8:promote-128:w_then_a"),
               DeclaredFp8("undeclared", PROMOTE, None)]
    m = run_matrix([k.name for k in kernels], source_from_tiles(TILES), ("real",), kernels=kernels, created_at=None)
    judged = m.cell("emulator-fp8:fast-accum:w_then_a", "emulator-fp8:promote-128:w_then_a")
    assert judged.status == PairStatus.EXPLAINED and judged.causes == ("accumulation schedule (promotion interval)",)
    unjudged = m.cell("emulator-fp8:fast-accum:w_then_a", "undeclared")
    assert unjudged.status == PairStatus.NOT_JUDGED and "declares no fp8 accumulation schedule" in unjudged.not_judged_because
    assert judged.not_judged_because is None
