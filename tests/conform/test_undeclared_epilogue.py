"""A kernel that declares no epilogue model is not certified: the epilogue-model check is inapplicable with
that reason (never a pass), the verdict is inconclusive, `--strict` fails, and no report claims anything
about the model it follows (issue 25, item 4)."""

from __future__ import annotations

import json

import torch
from faulty_kernels import Reference, divergent_tile

from alibi.cli import main
from alibi.conform import checks
from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator
from alibi.kernels.registry import register


class Undeclared(Reference):
    """Computes the a_then_w epilogue exactly, but declares nothing: its epilogue is "none of the known"."""

    name = "undeclared"
    epilogue = None

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        return apply_epilogue(EpilogueModel("a_then_w"), exact_accumulator(a_q, w_q), s_a, s_w, bias, out_dtype)


def _conform(tmp_path, *extra):
    register("test-undeclared", Undeclared)
    return main(["conform", "--kernel-a", "test-undeclared", "--kernel-b", "emulator:a_then_w", "--synthetic", "tiny",
                 "--out", str(tmp_path / "r"), "--quiet", *extra])


def test_an_undeclared_epilogue_kernel_cannot_pass_under_strict(tmp_path, capsys):
    assert _conform(tmp_path, "--strict") == 1
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    assert doc["verdict"] == "inconclusive"
    model = next(c for c in doc["checks"] if c["check"] == "epilogue-model")
    assert model["status"] == "inapplicable"
    because = " ".join(doc["inconclusive_because"])
    assert "arm a (`undeclared`) declares no epilogue model" in because and "alibi identify" in because
    out = capsys.readouterr().out
    assert "verdict: INCONCLUSIVE" in out and "(None)" not in out


def test_an_undeclared_epilogue_kernel_is_inconclusive_not_pass_without_strict(tmp_path):
    assert _conform(tmp_path) == 0
    assert json.loads((tmp_path / "r" / "report.json").read_text())["verdict"] == "inconclusive"


def test_the_report_of_an_undeclared_kernel_makes_no_claim_about_its_model(tmp_path):
    _conform(tmp_path)
    md = (tmp_path / "r" / "report.md").read_text()
    assert "equals its declared epilogue model" not in md
    assert "`None`" not in md and "(None)" not in md
    assert "declares no epilogue model" in md and "alibi identify" in md
    junit = (tmp_path / "r" / "junit.xml").read_text()
    assert "declares no epilogue model: run `alibi identify`" in junit


def _arms(tile, deviate_b: bool):
    from alibi.exact.emulator import EpilogueModel, run_model

    out = run_model(EpilogueModel("a_then_w"), tile)
    got_b = out.clone()
    if deviate_b:
        got_b.view(torch.int16)[0, 0] ^= 1
    return {"a": (None, out, None), "b": ("a_then_w", got_b, out)}


def test_a_declared_arm_that_deviates_still_fires_beside_an_undeclared_one():
    v = checks.epilogue_model(_arms(divergent_tile(seed=0), deviate_b=True))
    assert v.status == "fired" and "arm b deviates" in v.detail


def test_an_undeclared_arm_makes_the_epilogue_model_check_inapplicable_with_its_reason():
    v = checks.epilogue_model(_arms(divergent_tile(seed=0), deviate_b=False), {"a": "mine", "b": "emulator:a_then_w"})
    assert v.status == "inapplicable"
    assert v.detail.startswith("arm a (`mine`) declares no epilogue model") and v.evidence["undeclared"] == ["a"]
