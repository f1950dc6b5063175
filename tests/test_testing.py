"""`alibi.testing.assert_interchangeable`, the API kernel authors call from their own pytest suites."""

from __future__ import annotations

import pytest
import torch
from faulty_kernels import OneUlpUp, Reference

from alibi.results import Report
from alibi.testing import NotInterchangeable, assert_interchangeable


def test_interchangeable_kernels_return_the_report_for_further_assertions():
    """The label of a preset source now names its seed: issue 12 builds every source record in one place
    (`alibi.conform.source_from_preset`), the one `alibi conform --synthetic` already used."""
    report = assert_interchangeable("emulator:w_then_a", "emulator:a_then_w", "tiny")
    assert isinstance(report, Report)
    assert report.verdict == "pass" and report.source["label"] == "synthetic preset tiny (seed 0)"
    assert report.units("pow2") and all(u.bitwise_equal for u in report.units("pow2"))


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
    from alibi.synthetic import synthetic_tiles
    from alibi.tile import save_tile

    tiles = synthetic_tiles("tiny", seed=4)
    before = [t.a_q.clone() for t in tiles]
    for t in tiles:
        save_tile(t, tmp_path / f"{t.name}.safetensors")
    from_folder = assert_interchangeable("emulator:w_then_a", "emulator:a_then_w", tmp_path, regimes=["real"])
    in_code = assert_interchangeable("emulator:w_then_a", "emulator:a_then_w", tiles, regimes=["real"])
    assert [u.n_differing for u in from_folder.tiles] == [u.n_differing for u in in_code.tiles]
    assert from_folder.source["kind"] == in_code.source["kind"] == "tiles"
    assert all(torch.equal(t.a_q, b) for t, b in zip(tiles, before, strict=True))  # the caller's tiles are unchanged
