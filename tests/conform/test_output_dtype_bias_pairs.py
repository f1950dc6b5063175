"""A kernel that takes its bias only in the output dtype (vLLM's) runs on the default tiles (issue 36 regression).

The default tiles carry declaration probes with an fp32 bias, which vLLM's kernels refuse (they declare a bias in
the output dtype only, `Kernel.bias_in_output_dtype`). For a pair with such an arm the default source leaves those
probes out (`alibi.conform.exercised.within_declarations`) instead of refusing the pair, and the accounting says
so: the fp32 bias is not part of that declaration, so it is not "unexercised". vLLM's CUTLASS and Triton kernels
need CUDA; these tests use a double with their declarations (name, epilogue model, output-dtype bias) that runs the
emulator of its declared model and refuses a bias of another dtype, as they do.
"""

from __future__ import annotations

import json

import pytest
import torch

from alibi.cli import main
from alibi.conform.exercised import unexercised
from alibi.conform.pipeline import Pair, run_conformance, source_from_preset, source_from_tiles
from alibi.errors import InputError
from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator
from alibi.kernels.base import Kernel
from alibi.kernels.registry import _EXTRA, get_kernel

VLLM = ("vllm-cutlass", "vllm-triton")


class OutputDtypeBiasDouble(Kernel):
    """Declares what the vLLM kernel `of` declares; computes `actual` (default: that declared model) from the
    exact accumulator; refuses a bias that is not in the output dtype."""

    formats, device = ("int8",), "cpu"
    bias_in_output_dtype = True

    def __init__(self, of: str, actual: EpilogueModel | None = None):
        real = get_kernel(of)  # the class only: vLLM's kernels are unavailable on a CPU
        assert real.bias_in_output_dtype
        self.name, self.epilogue = f"double-{of}", real.epilogue
        self.actual = actual or real.epilogue

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        if bias is not None and bias.dtype != out_dtype:
            raise InputError(f"kernel {self.name!r} takes the bias in the output dtype ({out_dtype}), got {bias.dtype}")
        return apply_epilogue(self.actual, exact_accumulator(a_q, w_q), s_a, s_w, bias, out_dtype)


@pytest.fixture(scope="module")
def default_source():
    return source_from_preset("default")


def fp32_bias_probes(source) -> list[str]:
    return [t.name for t in source.tiles if t.bias is not None and t.bias.dtype == torch.float32]


@pytest.fixture
def doubles(monkeypatch):
    for of in VLLM:
        monkeypatch.setitem(_EXTRA, f"double-{of}", lambda of=of: OutputDtypeBiasDouble(of))


@pytest.mark.parametrize("of", VLLM)
def test_a_pair_with_an_output_dtype_bias_kernel_passes_the_default_conform_without_the_fp32_bias_probes(
        default_source, of):
    probes = fp32_bias_probes(default_source)
    assert len(probes) == 4  # bf16 and fp16 outputs x decode and prefill M
    report = run_conformance(Pair(OutputDtypeBiasDouble(of), get_kernel("torch-cpu"), "test"), default_source,
                             created_at=None, invariance=False)
    assert report.verdict == "pass" and report.inconclusive_because == ()
    assert not {u.tile for u in report.tiles} & set(probes)
    assert report.source["left_out"]["tiles"] == probes and f"double-{of}" in report.source["left_out"]["because"]
    accounting = report.source["exercised"]
    assert accounting["arms"]["a"]["bias"] == "output dtype only"
    assert accounting["arms"]["b"]["bias"] == "float32 or output dtype"
    assert unexercised(accounting) == []  # every attribute of both declarations shown on the output-dtype probes


@pytest.mark.parametrize("of", VLLM)
def test_an_output_dtype_bias_kernel_that_departs_from_its_bias_mode_still_fails_the_default_conform(default_source,
                                                                                                   of):
    declared = get_kernel(of).epilogue
    actual = EpilogueModel(declared.order, "add_before_cast")
    liar = OutputDtypeBiasDouble(of, actual)
    report = run_conformance(Pair(liar, get_kernel("torch-cpu"), "test"), default_source, created_at=None,
                             invariance=False)
    assert report.verdict == "fail" and report.check("epilogue-model").fired


def test_a_pair_of_kernels_that_take_an_fp32_bias_keeps_every_probe(default_source):
    from alibi.conform.exercised import within_declarations

    pair = Pair(get_kernel("torch-cpu"), get_kernel("emulator:a_then_w"), "test")
    assert within_declarations(default_source, (pair.a, pair.b)) is default_source
    narrowed = within_declarations(default_source, (OutputDtypeBiasDouble("vllm-cutlass"),))
    assert within_declarations(narrowed, (OutputDtypeBiasDouble("vllm-cutlass"),)) is narrowed  # idempotent


def test_tiles_the_user_gave_are_run_as_given_and_an_fp32_bias_is_refused_in_one_line(default_source):
    """Only a source that claims every attribute is narrowed: the user's own fp32-bias tiles are not dropped."""
    given = source_from_tiles([t for t in default_source.tiles if t.name in fp32_bias_probes(default_source)])
    with pytest.raises(InputError, match="takes the bias in the output dtype"):
        run_conformance(Pair(OutputDtypeBiasDouble("vllm-cutlass"), get_kernel("torch-cpu"), "test"), given,
                        created_at=None, invariance=False)


def test_the_matrix_on_the_default_tiles_runs_output_dtype_bias_kernels_and_leaves_only_their_fp32_probes_out(
        doubles, default_source, tmp_path, capsys):
    out = tmp_path / "m"
    assert main(["matrix", "--kernels", "double-vllm-cutlass,double-vllm-triton,torch-cpu,emulator:a_then_w",
                 "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "pairs with double-vllm-cutlass: 4 tiles left out" in printed
    assert "pairs with torch-cpu" not in printed
    matrix = json.loads((out / "matrix.json").read_text(encoding="utf-8"))
    probes = set(fp32_bias_probes(default_source))
    for cell in matrix["cells"]:
        assert cell["status"] in ("bitwise", "explained") and cell["verdict"] == "pass"  # not inconclusive
        tiles = {u["tile"] for u in cell["units"]}
        if cell["kernel_a"].startswith("double-") or cell["kernel_b"].startswith("double-"):
            assert not tiles & probes
        else:
            assert probes <= tiles
    assert all(v["status"] == "passed" for k in matrix["kernels"] for v in k["self_checks"])


def test_predict_pair_on_the_default_tiles_leaves_out_only_the_probes_an_arm_never_takes(doubles, default_source,
                                                                                        tmp_path, capsys):
    probes = fp32_bias_probes(default_source)
    assert main(["predict-pair", "double-vllm-cutlass", "double-vllm-triton", "--out", str(tmp_path / "p.json")]) == 1
    assert "left out: 4 tiles" in capsys.readouterr().out
    doc = json.loads((tmp_path / "p.json").read_text(encoding="utf-8"))
    assert doc["source"]["left_out"]["tiles"] == probes
    assert not {u["tile"] for u in doc["units"]} & set(probes)
    assert main(["predict-pair", "torch-cpu", "double-vllm-triton", "--out", str(tmp_path / "q.json")]) == 1
    assert json.loads((tmp_path / "q.json").read_text(encoding="utf-8"))["source"]["left_out"]["tiles"] == probes
    assert main(["predict-pair", "torch-cpu", "w_then_a+fma", "--out", str(tmp_path / "r.json")]) == 1
    doc = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    assert "left_out" not in doc["source"] and set(probes) <= {u["tile"] for u in doc["units"]}
