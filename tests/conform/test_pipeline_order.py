"""The order in which `evaluate_batches` does its work: the next batch's operands are prepared while the device
measures a batch (the overlap), a batch's kernels run only once every earlier unit was handed over (a kernel that
ends the process loses no finished unit), and a batch whose successor cannot be prepared still hands over its
units before the error ends the run. Also the scale facts found on the host before any launch (`ScaleFacts`)."""

from __future__ import annotations

import pytest
import torch

import alibi.conform.pipeline as pipeline
from alibi.conform import checks
from alibi.conform.judge import Measurement, ScaleFacts
from alibi.conform.pipeline import Pair, apply_regime, batches, evaluate_batches, source_from_preset
from alibi.errors import InputError
from alibi.exact.numerics import is_pow2
from alibi.kernels.cpu import EmulatorKernel
from alibi.kernels.registry import get_kernel
from alibi.tiles.tile import Tile

# the tiny preset: two tiles of different shapes, so two batches
TILES = source_from_preset("tiny").tiles


def work() -> list[tuple[int, Tile, list[str]]]:
    items = [(i, t, ["real", "pow2"]) for i, t in enumerate(TILES)]
    assert len(batches(items)) == 2
    return items


class Logged(EmulatorKernel):
    """An emulator whose every launch is logged with the width of the tile it ran on."""

    def __init__(self, log: list[tuple[str, int]]):
        super().__init__(get_kernel("emulator:a_then_w").epilogue)
        self.log = log

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        self.log.append(("kernel", w_q.shape[0]))
        return super().scaled_mm(a_q, s_a, w_q, s_w, bias, out_dtype)


def logged_run(monkeypatch) -> list[tuple[str, int]]:
    log: list[tuple[str, int]] = []
    prepare, collect = pipeline.prepare_tiles, Measurement.collect

    def logged_prepare(tiles, *args, **kwargs):
        log.extend(("prepare", tile.N) for tile, _ in tiles)
        return prepare(tiles, *args, **kwargs)

    def logged_collect(self, stage):
        log.append(("collect", self.runs[0].tile.N))
        return collect(self, stage)
    monkeypatch.setattr(pipeline, "prepare_tiles", logged_prepare)
    monkeypatch.setattr(Measurement, "collect", logged_collect)
    for i, regime, unit, _ in evaluate_batches(Pair(Logged(log), get_kernel("emulator:w_then_a"), "test"), work(),
                                               torch.device("cpu"), ulp_threshold=2, invariance=True):
        log.append(("unit", unit.N))
        assert unit.tile == TILES[i].name and unit.regime == regime
    return log


def test_the_next_batch_is_prepared_before_a_batch_is_collected_and_its_kernels_wait_for_every_earlier_unit(
        monkeypatch):
    log = logged_run(monkeypatch)
    first, second = TILES[0].N, TILES[1].N
    steps = [step for step, n in log]
    # batch 1: prepared, its kernels, then batch 2 prepared before batch 1's numbers are collected and handed over
    assert log.index(("prepare", second)) < log.index(("collect", first)) < log.index(("unit", first))
    assert steps.count("unit") == 4 and log.count(("prepare", first)) == log.count(("prepare", second)) == 1
    # no kernel of batch 2 runs before both units of batch 1 were handed over
    last_unit_of_first = max(k for k, entry in enumerate(log) if entry == ("unit", first))
    assert all(k > last_unit_of_first for k, entry in enumerate(log) if entry == ("kernel", second))
    assert ("kernel", second) in log


def test_a_batch_whose_successor_cannot_be_prepared_hands_over_its_units_then_the_error_ends_the_run(monkeypatch):
    prepare = pipeline.prepare_tiles

    def refuses_the_second_tile(tiles, *args, **kwargs):
        for tile, _ in tiles:
            if tile.name == TILES[1].name:
                raise InputError(f"tile {tile.name!r}: cannot be prepared here")
        return prepare(tiles, *args, **kwargs)
    monkeypatch.setattr(pipeline, "prepare_tiles", refuses_the_second_tile)
    handed: list[tuple[str, str]] = []
    with pytest.raises(InputError, match="cannot be prepared here"):
        for _, regime, unit, _ in evaluate_batches(Pair(get_kernel("emulator:a_then_w"),
                                                        get_kernel("emulator:w_then_a"), "test"), work(),
                                                   torch.device("cpu"), ulp_threshold=2, invariance=True):
            handed.append((unit.tile, regime))
    assert handed == [(TILES[0].name, "real"), (TILES[0].name, "pow2")]


def test_scale_facts_say_whether_every_weight_scale_is_a_power_of_two_and_count_changed_and_subnormal_scales():
    t = TILES[0]
    s_w = t.s_w.clone()
    s_w[0] = 2.0**-140  # subnormal in fp32, and a power of two
    s_a = t.s_a.clone()
    s_a[:2] = 2.0**-130
    tile = t.replace(s_a=s_a, s_w=s_w)
    real, pow2 = apply_regime(tile, "real"), apply_regime(tile, "pow2")
    assert ScaleFacts.of_units([(tile, real)]) == [ScaleFacts(False, 0, 3)]
    changed = int((~is_pow2(s_w)).sum())  # rounding changes exactly the scales that are not powers of two
    assert 0 < changed < t.N
    assert ScaleFacts.of_units([(tile, pow2), (tile, real)]) == [ScaleFacts(True, changed, 3), ScaleFacts(False, 0, 3)]
    every_pow2 = tile.replace(s_w=pow2.s_w)
    assert ScaleFacts.of_units([(every_pow2, apply_regime(every_pow2, "pow2"))]) == [ScaleFacts(True, 0, 3)]


def test_masks_counted_at_once_give_each_name_its_own_per_unit_counts_and_values_keep_their_units():
    gen = torch.Generator().manual_seed(3)
    full = torch.rand((3, 5, 7), generator=gen) > 0.5
    other = torch.rand((3, 5, 7), generator=gen) > 0.2
    part = torch.rand((2, 4), generator=gen) > 0.5  # measured on units 0 and 2 only
    peak = torch.tensor([4.0, -1.0, 2.5], dtype=torch.float64)
    units = checks.numbers({"a": checks.count(full), "top": peak, "b": checks.count(other),
                            "again": checks.count(full), "p": checks.count(part)}, {"p": [0, 2]})
    expected_full, expected_other = full.reshape(3, -1).sum(1).tolist(), other.reshape(3, -1).sum(1).tolist()
    expected_part = part.sum(1).tolist()
    assert [list(u) for u in units] == [["a", "top", "b", "again", "p"], ["a", "top", "b", "again"],
                                        ["a", "top", "b", "again", "p"]]
    for i, u in enumerate(units):
        assert u["a"] == u["again"] == expected_full[i] and u["b"] == expected_other[i] and u["top"] == peak[i]
    assert [units[0]["p"], units[2]["p"]] == expected_part
