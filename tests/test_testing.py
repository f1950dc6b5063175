"""`alibi.testing.assert_interchangeable`, the API kernel authors call from their own pytest suites."""

from __future__ import annotations

import pytest
import torch
from faulty_kernels import OneUlpUp, Reference

from alibi.conform.results import Report
from alibi.testing import NotInterchangeable, assert_interchangeable


def test_interchangeable_kernels_return_the_report_for_further_assertions():
    """The label of a preset source now names its seed: issue 12 builds every source record in one place
    (`alibi.conform.pipeline.source_from_preset`), the one `alibi conform --synthetic` already used."""
    report = assert_interchangeable("emulator:w_then_a", "emulator:a_then_w", "epilogue-probe")
    assert isinstance(report, Report)
    assert report.verdict == "pass" and report.source["label"] == "synthetic preset epilogue-probe (seed 0)"
    assert report.units("pow2") and all(u.bitwise_equal for u in report.units("pow2"))
    # The report is this run's: its real-scale counts are those of the two models applied directly.
    assert [u.n_differing for u in report.units("real")] == _differing_by_models("epilogue-probe", seed=0)
    assert sum(u.n_differing for u in report.units("real")) > 0  # the probe makes the orders disagree


def _differing_by_models(preset: str, seed: int) -> list[int]:
    """Per tile, the elements where w_then_a+fma and a_then_w+fma disagree, computed without the pipeline."""
    from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator
    from alibi.exact.numerics import bitwise_equal_mask
    from alibi.tiles.synthetic import synthetic_tiles

    counts = []
    for t in synthetic_tiles(preset, seed=seed):
        acc = exact_accumulator(t.a_q, t.w_q)
        a, b = (apply_epilogue(EpilogueModel(o), acc, t.s_a, t.s_w, t.bias, t.out_dtype) for o in ("w_then_a", "a_then_w"))
        counts.append(int((~bitwise_equal_mask(a, b)).sum()))
    return counts


def test_a_faulty_kernel_raises_an_assertion_error_with_one_line_per_fired_check():
    with pytest.raises(NotInterchangeable) as info:
        assert_interchangeable(OneUlpUp(), Reference(), "tiny")
    assert isinstance(info.value, AssertionError)
    lines = str(info.value).splitlines()
    assert lines[0] == "one-ulp-up and ref are not interchangeable on synthetic preset tiny (seed 0):"
    assert isinstance(info.value.report, Report)
    fired = sorted(c.check for c in info.value.report.checks if c.fired)
    assert fired and sorted(line.split()[0] for line in lines[1:]) == fired
    assert {"pow2-identity", "epilogue-model"} <= set(fired)


def test_strict_mode_also_fails_on_required_checks_that_could_not_be_applied():
    class Undeclared(Reference):
        """Reference's arithmetic, but no declared epilogue model."""

        name, epilogue = "undeclared", None

        def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
            return Reference().scaled_mm(a_q, s_a, w_q, s_w, bias, out_dtype)

    other = Undeclared()
    other.name = "undeclared-too"
    assert assert_interchangeable(Undeclared(), other, "tiny").verdict == "inconclusive"
    with pytest.raises(NotInterchangeable, match="inconclusive: epilogue-model"):
        assert_interchangeable(Undeclared(), other, "tiny", strict=True)


def test_tiles_may_be_given_as_a_folder_or_in_code(tmp_path):
    from alibi.tiles.synthetic import synthetic_tiles
    from alibi.tiles.tile import save_tile

    tiles = synthetic_tiles("tiny", seed=4)
    before = [t.a_q.clone() for t in tiles]
    for t in tiles:
        save_tile(t, tmp_path / f"{t.name}.safetensors")
    from_folder = assert_interchangeable("emulator:w_then_a", "emulator:a_then_w", tmp_path, regimes=["real"])
    in_code = assert_interchangeable("emulator:w_then_a", "emulator:a_then_w", tiles, regimes=["real"])
    assert [u.n_differing for u in from_folder.tiles] == [u.n_differing for u in in_code.tiles] \
        == _differing_by_models("tiny", seed=4)
    assert [u.tile for u in from_folder.tiles] == sorted(t.name for t in tiles)  # read from the folder, by file name
    assert from_folder.source["kind"] == in_code.source["kind"] == "tiles"
    assert from_folder.source["path"] == str(tmp_path) and "path" not in in_code.source
    assert all(torch.equal(t.a_q, b) for t, b in zip(tiles, before, strict=True))  # the caller's tiles are unchanged


def test_an_unknown_preset_name_lists_the_presets_and_the_closest_one(tmp_path, monkeypatch):
    from alibi.errors import InputError
    from alibi.tiles.synthetic import PRESETS

    monkeypatch.chdir(tmp_path)  # no folder called qwen3 here
    with pytest.raises(InputError) as exc:
        assert_interchangeable("torch-cpu", "emulator:w_then_a", "qwen3")
    message = str(exc.value)
    assert "neither a synthetic preset nor a folder of tiles (did you mean 'qwen3-1.7b'?)" in message
    assert all(name in message for name in PRESETS)
