"""`alibi identify` on block-scaled kernels (alibi/controls/fp8_block_schedule.py), with the block emulators as
stand-in kernels: a kernel that runs what it declares exits 0, one whose declared promotion or interval is not what
it runs exits 1."""

from __future__ import annotations

import torch

from alibi.cli import main
from alibi.controls.fp8_block_schedule import identify_block_schedule, random_block_tile
from alibi.exact.fp8_block_mma import accumulate_blocks, parse_block_schedule
from alibi.kernels import registry
from alibi.kernels.cpu import BlockFp8EmulatorKernel

SMALL = "--shape", "4x136x384"


class Misdeclared(BlockFp8EmulatorKernel):
    """Runs `block128:fma(sa*sw,p,acc)` but declares `block128:acc+(p*sa)*sw` (a wrong association)."""

    def __init__(self) -> None:
        super().__init__(parse_block_schedule("block128:acc+(p*sa)*sw"), "add_before_cast")
        self.name = "test-misdeclared-block"
        self.runs = parse_block_schedule("block128:fma(sa*sw,p,acc)")

    def accumulator(self, a_q, w_q, s_a=None, s_w=None):
        return accumulate_blocks(self.runs, a_q, s_a, w_q, s_w, self.layout)


def test_an_emulator_declaring_what_it_runs_is_identified_and_exits_0(capsys):
    assert main(["identify", "emulator-fp8-block:block128:fma(sa*sw,p,acc):add_before_cast", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "matches block128:fma(sa*sw,p,acc) (declared MATCH)" in out and "MATCH (every output bit" in out


def test_a_wrong_declared_association_is_caught_by_the_probe_and_exits_1(capsys):
    registry.register("test-misdeclared-block", Misdeclared)
    try:
        assert main(["identify", "test-misdeclared-block", *SMALL]) == 1
    finally:
        registry._EXTRA.pop("test-misdeclared-block", None)
    out = capsys.readouterr().out
    assert "matches block128:fma(sa*sw,p,acc) (declared NO MATCH)" in out


def test_a_promotion_interval_off_by_one_block_is_caught_on_the_random_tile_and_exits_1(capsys):
    name = "mutant:promotion-interval:emulator-fp8-block:block128:fma(sa*sw,p,acc):add_before_cast"
    assert main(["identify", name, *SMALL]) == 1
    assert "NO MATCH" in capsys.readouterr().out


def test_a_kernel_that_declares_no_schedule_exits_1_and_still_names_what_matches():
    kernel = BlockFp8EmulatorKernel(parse_block_schedule("block128:rescale"), "add_before_cast")
    kernel.schedule_at = lambda M, N, K: None  # as cublaslt-fp8-block before it is read
    found = identify_block_schedule(kernel, [(2, 64, 256)])
    assert not found.ok and found.shapes[0].declared is None
    assert "block128:rescale" in found.probe.matched and "block128:rescale" in found.shapes[0].matched


def test_a_random_tile_for_block_row_scales_shares_each_groups_scale_within_every_256_rows():
    t = random_block_tile(300, 16, 256, 0, activation_rows=256)
    assert torch.equal(t.s_a[:256], t.s_a[:1].expand(256, -1)) and torch.equal(t.s_a[256:], t.s_a[256:257].expand(44, -1))
    assert t.block_layout is not None and t.fmt == "fp8_e4m3_block"
