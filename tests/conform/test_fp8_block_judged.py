"""Block-scaled fp8 pairs are judged from each arm's declared block schedule (docs/fp8-block.md), on the CPU: the
block emulators of two schedules differ exactly where the model says, with the cause named; identical schedules
are bitwise; the block mutants are caught; block tiles are validated on their own layout."""

from __future__ import annotations

import json

import pytest
import torch

from alibi.cli import main
from alibi.conform.matrix import Matrix, PairStatus, run_matrix
from alibi.conform.pipeline import Pair, run_conformance, source_from_tiles
from alibi.controls.mutant_matrix import run_matrix as run_mutants
from alibi.errors import InputError
from alibi.exact.fp8_block import DEEPSEEK_V3, LAYOUT_KEY
from alibi.kernels.registry import get_kernel, kernel_names
from alibi.tiles.block_probe import association_probe_tile
from alibi.tiles.synthetic import synthetic_tiles
from alibi.tiles.tile import Tile

DEEPGEMM = "emulator-fp8-block:block128:fma(sa*sw,p,acc):add_before_cast"
TRITON = "emulator-fp8-block:block128:fma(p*sa,sw,acc):add_before_cast"
TRITON_UNFUSED = "emulator-fp8-block:block128:acc+(p*sa)*sw:add_before_cast"
PROBE = association_probe_tile(promotions=("fma(sa*sw,p,acc)", "fma(p*sa,sw,acc)", "acc+(p*sa)*sw"))
TINY = synthetic_tiles("tiny-fp8-block")


def order_tile() -> Tile:
    """Four k groups: 1 + 2^-8 (a bf16 tie, scales 1), then 2^-24 three times: promoted in ascending order each
    small one is lost to the tie-to-even and the output rounds to 1; in reverse they add up first and tip it."""
    a, w = torch.zeros(2, 512), torch.zeros(8, 512)
    a[:, 0] = w[:, 0] = 1.0
    a[:, 1] = w[:, 1] = 2.0**-4
    for k in (128, 256, 384):
        a[:, k] = w[:, k] = 2.0**-6
    s_a = torch.tensor([[1.0, 2.0**-12, 2.0**-12, 2.0**-12]] * 2)
    return Tile("order", a.to(torch.float8_e4m3fn), s_a, w.to(torch.float8_e4m3fn), torch.ones(1, 4), None,
                torch.bfloat16, {LAYOUT_KEY: DEEPSEEK_V3.text}).validate()


def conform(a: str, b: str, tiles, regimes=("real",)):
    return run_conformance(Pair(get_kernel(a), get_kernel(b), "test"), source_from_tiles(tiles), regimes,
                           created_at=None)


def test_identical_block_schedules_are_bitwise_and_every_check_is_silent():
    r = conform(DEEPGEMM, DEEPGEMM, TINY, ("real", "pow2"))
    assert all(u.n_differing == 0 for u in r.tiles) and not any(v.fired for v in r.checks)
    assert r.check("exact-accumulator").applicable


@pytest.mark.parametrize("b, cause", [
    (TRITON, "accumulation schedule (promotion association)"),
    (TRITON_UNFUSED, "accumulation schedule (promotion association, promotion FMA contraction)"),
])
def test_two_promotions_differ_exactly_where_predicted_and_the_cause_is_named(b, cause):
    r = conform(DEEPGEMM, b, [PROBE])
    assert r.tiles[0].n_differing > 0 and r.tiles[0].explained and r.tiles[0].cause == cause
    assert not r.check("predicted-differences").fired and not r.check("epilogue-model").fired


def test_a_promotion_interval_and_a_split_order_are_named_as_causes():
    r = conform(DEEPGEMM, "emulator-fp8-block:block64:fma(sa*sw,p,acc):add_before_cast", TINY)
    assert {u.cause for u in r.tiles if u.n_differing} == {"accumulation schedule (promotion interval)"}
    r = conform("emulator-fp8-block:block128:fma(sa*sw,p,acc):split-4:add_before_cast",
                "emulator-fp8-block:block128:fma(sa*sw,p,acc):split-4-desc:add_before_cast", [order_tile()])
    assert r.tiles[0].n_differing > 0 and r.tiles[0].cause == "accumulation schedule (split-K order)"


def test_a_nondeterministic_block_schedule_leaves_the_pair_not_judged_naming_the_shape():
    r = conform(DEEPGEMM, "emulator-fp8-block:block128:fma(sa*sw,p,acc):stream-k:add_before_cast", [order_tile()],)
    detail = r.tiles[0].verdict("predicted-differences").detail
    assert "nondeterministic reduction at M=2, N=8, K=512" in detail


def test_the_matrix_names_each_cells_cause_and_the_identical_pair_is_bitwise():
    names = [DEEPGEMM, TRITON, TRITON_UNFUSED]
    m = run_matrix(names, source_from_tiles([PROBE]), ("real",), kernels=[get_kernel(n) for n in names],
                   created_at=None)
    cell = m.cell(DEEPGEMM, TRITON)
    assert cell.status == PairStatus.EXPLAINED and cell.causes == ("accumulation schedule (promotion association)",)
    assert m.cell(TRITON, TRITON_UNFUSED).causes == ("accumulation schedule (promotion FMA contraction)",)


def test_every_block_mutant_is_caught_and_the_null_mutant_is_silent():
    base = get_kernel(DEEPGEMM)
    matrix = run_mutants(base, DEEPGEMM, TINY + [order_tile().replace(name="order")], source={"label": "test"},
                         faults=None, severities=["all"], regimes=["real"], native=False, progress=None)
    rows = {row.fault: row for row in matrix.faults}
    assert set(rows) == {"wrong-block-scale", "promotion-interval", "reordered-blocks", "null"}
    for fault in ("wrong-block-scale", "promotion-interval", "reordered-blocks"):
        assert rows[fault].observable and "epilogue-model" in rows[fault].fired, fault
    assert not rows["null"].fired and matrix.null_silent


def test_block_emulators_are_listed_and_a_row_kernel_refuses_a_block_tile():
    assert DEEPGEMM in kernel_names()
    with pytest.raises(InputError, match="fp8_e4m3_block"):
        get_kernel("emulator-fp8:fast-accum:w_then_a").run(TINY[0])
    with pytest.raises(InputError, match="s_w has shape"):
        TINY[0].replace(s_w=torch.ones(3)).validate()


def test_alibi_matrix_takes_block_emulator_names_whose_promotions_hold_commas(tmp_path):
    """`--kernels` splits at commas outside parentheses: `fma(sa*sw,p,acc)` stays one name (on the GPU the split
    at every comma refused the list as 'acc):add_after_cast' named twice)."""
    out = tmp_path / "m"
    assert main(["matrix", "--kernels", f"{DEEPGEMM},{TRITON}, {TRITON_UNFUSED}", "--synthetic", "tiny-fp8-block",
                 "--out", str(out), "--quiet"]) == 0
    kernels = {k.name for k in Matrix.from_dict(json.loads((out / "matrix.json").read_text())).kernels}
    assert kernels == {DEEPGEMM, TRITON, TRITON_UNFUSED}
