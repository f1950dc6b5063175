"""The default tile source tests every attribute of a declaration (issue 36, item 0).

A kernel that declares one epilogue and implements another, in any single attribute (scale order, intermediate
rounding, bias mode), fails the default run — through `alibi conform`'s source and through `assert_interchangeable`
without tiles; a source that claims to exercise every attribute and falls short is inconclusive, naming it.
"""

from __future__ import annotations

from itertools import product

import pytest
import torch

from alibi.conform.exercised import REQUIRED_CONTEXTS, alternatives, exercised, unexercised
from alibi.conform.pipeline import Pair, TileSource, apply_regime, run_conformance, source_from_preset
from alibi.exact.emulator import BIAS_MODES, ORDERS, EpilogueModel, apply_epilogue, exact_accumulator
from alibi.kernels.base import Kernel
from alibi.kernels.registry import get_kernel
from alibi.testing import NotInterchangeable, assert_interchangeable
from alibi.tiles.synthetic import synthetic_tiles

MODELS = [EpilogueModel(o, b, r) for r, o, b in product((False, True), ORDERS, BIAS_MODES)
          if not (r and o == "product_first")]


class Liar(Kernel):
    """Declares `declared`, computes `actual` (the exact accumulator, then that epilogue)."""

    formats = ("int8",)
    device = "cpu"

    def __init__(self, declared: EpilogueModel, actual: EpilogueModel):
        self.epilogue, self.actual, self.name = declared, actual, f"liar:{declared.name}:{actual.name}"

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        return apply_epilogue(self.actual, exact_accumulator(a_q, w_q), s_a, s_w, bias, out_dtype)


class CastsBeforeAddingItsBias(Kernel):
    """The README's kernel, declaring `add_before_cast` but casting before it adds its bias."""

    name, formats, device = "casts-before-bias", ("int8",), "cpu"
    epilogue = EpilogueModel(order="a_then_w", bias="add_before_cast")

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        acc = a_q.to(torch.int64) @ w_q.to(torch.int64).t()
        y = ((acc.to(torch.float32) * s_a.reshape(-1, 1)) * s_w.reshape(1, -1)).to(out_dtype)
        return y if bias is None else (y.to(torch.float32) + bias.to(torch.float32)).to(out_dtype)


@pytest.fixture(scope="module")
def default_source():
    return source_from_preset("default")


def test_the_default_source_has_fp32_and_output_dtype_biases_bf16_and_fp16_outputs_and_decode_and_prefill_m():
    tiles = synthetic_tiles("default")
    kinds = {(str(t.out_dtype), None if t.bias is None else str(t.bias.dtype), t.M == 1) for t in tiles}
    for out, decode in product((torch.bfloat16, torch.float16), (True, False)):
        assert (str(out), str(torch.float32), decode) in kinds
        assert (str(out), str(out), decode) in kinds


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_every_single_attribute_departure_of_every_model_shows_on_the_default_source(default_source, model):
    emulator = Liar(model, model)
    accounting = exercised(Pair(emulator, emulator, "test"), default_source.tiles, ["real", "pow2"], apply_regime)
    assert sorted(accounting["contexts"]) == sorted(REQUIRED_CONTEXTS)
    assert unexercised(accounting) == []


def test_a_kernel_that_lies_about_its_bias_mode_fails_the_default_conform(default_source):
    report = run_conformance(Pair(CastsBeforeAddingItsBias(), get_kernel("torch-cpu"), "test"), default_source,
                             created_at=None)
    assert report.verdict == "fail"
    assert report.check("epilogue-model").fired


@pytest.mark.parametrize("actual", alternatives(EpilogueModel("a_then_w", "add_before_cast"))["bias mode"],
                         ids=lambda m: m.name)
def test_a_kernel_declaring_add_before_cast_that_fuses_or_casts_first_fails_the_default_conform(default_source,
                                                                                              actual):
    liar = Liar(EpilogueModel("a_then_w", "add_before_cast"), actual)
    report = run_conformance(Pair(liar, get_kernel("torch-cpu"), "test"), default_source, created_at=None,
                             invariance=False)
    assert report.verdict == "fail" and report.check("epilogue-model").fired


def test_assert_interchangeable_without_tiles_fails_a_kernel_that_lies_about_its_bias_mode():
    with pytest.raises(NotInterchangeable, match="epilogue-model fired"):
        assert_interchangeable(CastsBeforeAddingItsBias(), "torch-cpu")


def test_a_source_that_claims_every_attribute_but_lacks_float16_and_biases_is_inconclusive_naming_them():
    tiles = tuple(synthetic_tiles("tiny"))
    source = TileSource(tiles, {"label": "tiny, claiming", "kind": "tiles", "exercises_declarations": True},
                        {"name": "tiles", "digest": {"sha256": "0" * 64}})
    report = run_conformance(Pair(get_kernel("torch-cpu"), get_kernel("emulator:w_then_a+add_before_cast"), "test"),
                             source, created_at=None)
    assert not any(c.fired for c in report.checks)
    assert report.verdict == "inconclusive"
    why = "\n".join(report.inconclusive_because)
    assert "no tile in float16 decode" in why and "bias mode" in why and "not exercised in bfloat16 prefill" in why
    assert report.source["exercised"]["arms"]["a"]["not_shown"]["bias mode"]


def test_the_default_source_records_that_it_exercised_every_attribute_of_both_declarations(default_source):
    pair = Pair(get_kernel("torch-cpu"), get_kernel("emulator:a_then_w+add_after_cast"), "test")
    report = run_conformance(pair, default_source, created_at=None, invariance=False)
    assert report.verdict == "pass" and report.inconclusive_because == ()
    accounting = report.source["exercised"]
    assert all(not by_ctx for rec in accounting["arms"].values() for by_ctx in rec["not_shown"].values())
