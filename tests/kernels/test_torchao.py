"""`torchao-int8`: TorchAO 0.18's own W8A8 linear, handed exactly alibi's operands, held to its declared model."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchao", reason="the torchao extra is not installed (pip install 'integer-alibi[torchao]')")

from alibi.controls.identify import identify  # noqa: E402
from alibi.errors import InputError  # noqa: E402
from alibi.exact.emulator import TORCHAO_INT8, EpilogueModel, run_model  # noqa: E402
from alibi.exact.numerics import bitwise_equal, bitwise_equal_mask  # noqa: E402
from alibi.kernels.registry import get_kernel  # noqa: E402
from alibi.tiles.synthetic import synthetic_tiles  # noqa: E402


@pytest.fixture(scope="module")
def kernel():
    k = get_kernel("torchao-int8")
    ok, reason = k.available()
    assert ok, reason
    return k


@pytest.fixture(scope="module")
def probe():
    return synthetic_tiles("epilogue-probe-bias")


def test_torchao_receives_exactly_alibis_operands(kernel, monkeypatch):
    """TorchAO's int_scaled_matmul is intercepted inside TorchAO's linear: it gets a_q, w_qᵀ and s_a bit for bit,
    and the weight scales the linear multiplies by are s_w."""
    import importlib

    # `import a.quantize_.b as m` would resolve `quantize_` to TorchAO's function of that name
    int8_tensor = importlib.import_module("torchao.quantization.quantize_.workflows.int8.int8_tensor")

    tile = synthetic_tiles("smollm2-135m-bias")[0]
    seen = {}
    original = int8_tensor.int_scaled_matmul

    def recording(a, b, scales1):
        seen.update(a=a.clone(), b=b.clone(), scales=scales1.clone())
        return original(a, b, scales1)

    monkeypatch.setattr(int8_tensor, "int_scaled_matmul", recording)
    _, weight = kernel.quantized_operands(tile.a_q, tile.s_a, tile.w_q, tile.s_w, tile.out_dtype)
    kernel.run(tile)
    assert torch.equal(seen["a"].view(torch.uint8), tile.a_q.view(torch.uint8))
    assert torch.equal(seen["b"].view(torch.uint8), tile.w_q.t().view(torch.uint8))
    assert bitwise_equal(seen["scales"], tile.s_a.reshape(-1, 1))
    assert bitwise_equal(weight.scale.flatten(), tile.s_w) and torch.equal(weight.qdata, tile.w_q)


def test_torchao_int8_is_not_the_same_program_without_its_intermediate_rounding(kernel, probe):
    """Its bits are its declared model's (tests/kernels/test_kernel_contract.py); the intermediate rounding in that
    model is not a detail: without it the same program gives other bits on every tile here."""
    tiles = probe + synthetic_tiles("smollm2-135m-bias")[:2]
    for tile in tiles:
        out = kernel.run(tile).out
        plain = run_model(EpilogueModel("a_then_w", "add_before_cast"), tile)
        assert int((~bitwise_equal_mask(out, plain)).sum()) > 0, tile.name


def test_identify_names_torchao_int8s_declared_model_as_the_only_match(kernel, probe):
    found = identify(kernel, probe)
    assert [c.model for c in found if c.matches] == [TORCHAO_INT8.name]


def test_operands_torchao_cannot_take_exactly_are_refused_naming_the_element(kernel):
    """a_q·s_a below bf16's normal range: TorchAO would requantize another activation, so the adapter refuses."""
    tile = synthetic_tiles("tiny")[0]
    tiny = tile.replace(s_a=torch.full_like(tile.s_a, 2.0**-140))
    with pytest.raises(InputError, match=r"cannot be handed these operands exactly: .*a_q\[0,"):
        kernel.run(tiny)


def test_normal_scaled_activations_are_handed_over_without_refusal(kernel):
    tile = synthetic_tiles("tiny")[1]
    assert kernel.run(tile).out.shape == (tile.M, tile.N)


def test_evidence_names_torchaos_version_and_the_digests_of_the_code_that_ran(kernel):
    tile = synthetic_tiles("tiny")[0]
    ev = kernel.run(tile).evidence
    assert ev["torchao"]["version"] == "0.18.0"
    assert "torchao.quantization.quantize_.workflows.int8.int8_tensor" in ev["torchao"]["sources_sha256"]
    assert len(ev["build_digest"]["sha256"]) == 64
    assert ev["last_run"]["matmul"].startswith("torch._int_mm")


def test_torchao_int_scaled_mm_says_why_it_cannot_run_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    ok, reason = get_kernel("torchao-int-scaled-mm").available()
    assert not ok and "CUDA" in reason
