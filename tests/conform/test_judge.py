"""Units judged in one batch keep their own evidence (issue 36, item 6).

`alibi.conform.judge` stacks the units of one shape into one batch — both regimes of every tile — and measures
each check on the whole batch; the pow2 identity is measured on the power-of-two units only and spread back to
their places in the batch. Here each tile's kernel output differs from the other arm's in one planted element at
a place that differs from tile to tile: every pow2 unit must fire with its own first mismatch, the one planted in
it, not another unit's.
"""

from __future__ import annotations

import torch

from alibi.conform.pipeline import Pair, batches, run_conformance, source_from_tiles
from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator
from alibi.exact.numerics import bits
from alibi.kernels.base import Kernel
from alibi.kernels.registry import get_kernel
from alibi.tiles.tile import Tile

M, K, N = 8, 64, 32
PLANTED = [(1, 3), (5, 0), (2, 17)]  # tile k's planted element (row, column), one per tile


class OneElementOff(Kernel):
    """`a_then_w` exactly, but one element a bit-pattern step up: at row |a_q[0, 0]| mod M, column |w_q[0, 0]| mod N
    (the tiles below put their planted place there)."""

    name, formats, device = "one-element-off", ("int8",), "cpu"
    epilogue = EpilogueModel("a_then_w")

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        out = apply_epilogue(self.epilogue, exact_accumulator(a_q, w_q), s_a, s_w, bias, out_dtype)
        r, c = int(a_q[0, 0].abs()) % M, int(w_q[0, 0].abs()) % N
        out[r, c] = (bits(out[r, c:c + 1]) + 1).view(out.dtype)[0]
        return out


def tiles() -> list[Tile]:
    gen = torch.Generator().manual_seed(5)
    made = []
    for k, (r, c) in enumerate(PLANTED):
        a_q = torch.randint(-100, 101, (M, K), generator=gen, dtype=torch.int8)
        w_q = torch.randint(-100, 101, (N, K), generator=gen, dtype=torch.int8)
        a_q[0, 0], w_q[0, 0] = M * 3 + r, N + c  # |a_q[0,0]| mod M = r, |w_q[0,0]| mod N = c
        s_a = (torch.rand(M, generator=gen) + 0.5) * 2.0**-6
        s_w = (torch.rand(N, generator=gen) + 0.5) * 2.0**-7
        made.append(Tile(f"tile-{k}", a_q, s_a, w_q, s_w, None, torch.bfloat16, {}).validate())
    return made


def test_pow2_identity_fires_in_each_unit_of_one_batch_with_that_units_own_first_mismatch():
    source = source_from_tiles(tiles())
    assert len(batches([(i, t, ["real", "pow2"]) for i, t in enumerate(source.tiles)])) == 1  # one batch of 6 units
    report = run_conformance(Pair(OneElementOff(), get_kernel("emulator:a_then_w"), "test"), source,
                             invariance=False, created_at=None)
    pow2 = {u.tile: u for u in report.units("pow2")}
    assert len(pow2) == len(PLANTED) >= 2
    firsts = []
    for k, (r, c) in enumerate(PLANTED):
        unit = pow2[f"tile-{k}"]
        verdict = unit.verdict("pow2-identity")
        assert verdict.fired and unit.n_differing == 1
        assert verdict.evidence["n_differing"] == 1 and verdict.evidence["first"] == [r, c]
        firsts.append(tuple(verdict.evidence["first"]))
    assert len(set(firsts)) == len(PLANTED)  # different first mismatches per unit
    for unit in report.units("real"):
        assert unit.verdict("pow2-identity").status == "inapplicable" and unit.n_differing == 1


def test_the_same_tiles_without_the_planted_element_keep_pow2_identity_silent():
    report = run_conformance(Pair(get_kernel("emulator:a_then_w"), get_kernel("emulator:w_then_a"), "test"),
                             source_from_tiles(tiles()), invariance=False, created_at=None)
    assert all(u.verdict("pow2-identity").status == "passed" for u in report.units("pow2"))
