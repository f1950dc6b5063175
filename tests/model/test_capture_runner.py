"""The W8A8 runner and operand capture: the kernel sees vLLM's operands, capture records exactly them."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from alibi.exact.emulator import EpilogueModel
from alibi.exact.quant import quantize_per_token, quantize_weight_per_channel
from alibi.io import atomic
from alibi.kernels.cpu import EmulatorKernel, TorchCpuKernel
from alibi.kernels.registry import register
from alibi.model.checkpoint import write_checkpoint
from alibi.model.compressed_tensors import quantize_dense
from alibi.model.runner import W8A8Linear

from .builders import TINY_LLAMA, tiny_dense_tensors

needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="needs transformers (pip install 'integer-alibi[model]')")


class SpyKernel(TorchCpuKernel):
    """torch-cpu that keeps a copy of every operand set it is handed."""

    name = "test:spy"

    def __init__(self):
        self.seen: list[tuple[torch.Tensor, ...]] = []

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        self.seen.append((a_q.clone(), s_a.clone(), w_q.clone(), s_w.clone()))
        return super().scaled_mm(a_q, s_a, w_q, s_w, bias, out_dtype)


def test_w8a8_linear_quantizes_per_token_and_calls_the_kernel_with_those_operands():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 32, generator=g)
    w_q, s_w = quantize_weight_per_channel(w, scale_dtype=torch.bfloat16)
    spy = SpyKernel()
    lin = W8A8Linear("l", w_q, s_w, None, spy)
    x = torch.randn(2, 5, 32, generator=g).to(torch.bfloat16)
    y = lin(x)
    a_q, s_a = quantize_per_token(x.reshape(-1, 32))
    (seen_a, seen_sa, seen_w, seen_sw), = spy.seen
    assert torch.equal(seen_a, a_q) and torch.equal(seen_sa, s_a)
    assert torch.equal(seen_w, w_q) and torch.equal(seen_sw, s_w)
    expected = TorchCpuKernel().scaled_mm(a_q, s_a, w_q, s_w).reshape(2, 5, 48)
    assert y.dtype == torch.bfloat16 and torch.equal(y.view(torch.int16), expected.view(torch.int16))


def test_the_emulator_kernel_gives_its_epilogue_model_inside_the_linear():
    g = torch.Generator().manual_seed(1)
    w_q, s_w = quantize_weight_per_channel(torch.randn(16, 64, generator=g), scale_dtype=torch.bfloat16)
    x = torch.randn(7, 64, generator=g).to(torch.bfloat16)
    for order in ("w_then_a", "a_then_w"):
        k = EmulatorKernel(EpilogueModel(order))
        a_q, s_a = quantize_per_token(x)
        assert torch.equal(W8A8Linear("l", w_q, s_w, None, k)(x), k.scaled_mm(a_q, s_a, w_q, s_w))


@pytest.fixture
def tiny_w8a8(tmp_path):
    ckpt = quantize_dense(TINY_LLAMA, tiny_dense_tensors(seed=5))
    with atomic.staged_dir(tmp_path / "w8a8") as stage:
        write_checkpoint(stage, ckpt.config, ckpt.tensors())
    with atomic.staged_dir(tmp_path / "bf16") as stage:
        write_checkpoint(stage, TINY_LLAMA, tiny_dense_tensors(seed=5))
    return tmp_path


@needs_transformers
def test_captured_tiles_equal_the_operands_the_kernel_saw(tiny_w8a8):
    from alibi.model.capture import OperandRecorder
    from alibi.model.runner import load_model

    spy = SpyKernel()
    lm = load_model(tiny_w8a8 / "w8a8", spy)
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (1, 24), generator=torch.Generator().manual_seed(2))
    with OperandRecorder(lm) as rec:
        lm.logits(ids)
    tiles = rec.tiles({"run": "test"})
    assert len(tiles) == len(spy.seen) == 14
    assert [t.name for t in tiles][:2] == ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj"]
    for tile, (a_q, s_a, w_q, s_w) in zip(tiles, spy.seen):
        assert tile.M == 24 and tile.meta["run"] == "test"
        for got, want in ((tile.a_q, a_q), (tile.s_a, s_a), (tile.w_q, w_q), (tile.s_w, s_w)):
            assert got.dtype == want.dtype and torch.equal(got, want)


@needs_transformers
def test_capture_does_not_change_the_logits(tiny_w8a8):
    from alibi.model.capture import OperandRecorder
    from alibi.model.runner import load_model

    lm = load_model(tiny_w8a8 / "w8a8", "torch-cpu")
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (1, 32), generator=torch.Generator().manual_seed(3))
    plain = lm.logits(ids)
    with OperandRecorder(lm):
        captured = lm.logits(ids)
    assert torch.equal(plain.view(torch.int32), captured.view(torch.int32))
    assert all(not lin.observers for lin in lm.linears())


@needs_transformers
def test_a_kernel_and_the_emulator_of_its_declared_epilogue_give_identical_logits(tiny_w8a8):
    from alibi.model.runner import load_model

    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (1, 16), generator=torch.Generator().manual_seed(4))
    from alibi.kernels.registry import get_kernel

    order = get_kernel("torch-cpu").epilogue.order  # the emulator running torch-cpu's declared epilogue
    a = load_model(tiny_w8a8 / "w8a8", f"emulator:{order}")
    b = load_model(tiny_w8a8 / "w8a8", "torch-cpu")
    assert {type(lin.kernel) for lin in a.linears()} == {EmulatorKernel}
    assert torch.equal(a.logits(ids), b.logits(ids))


@needs_transformers
def test_dense_and_quantized_checkpoints_demand_the_right_kernel_argument(tiny_w8a8):
    from alibi.errors import InputError
    from alibi.model.runner import load_model

    with pytest.raises(InputError, match="choose the kernel"):
        load_model(tiny_w8a8 / "w8a8")
    with pytest.raises(InputError, match="dense checkpoint"):
        load_model(tiny_w8a8 / "bf16", "torch-cpu")
    dense = load_model(tiny_w8a8 / "bf16")
    assert not dense.quantized and next(dense.linears(), None) is None


@needs_transformers
def test_greedy_decoding_runs_decode_gemms_with_one_row(tiny_w8a8):
    from alibi.model.capture import OperandRecorder
    from alibi.model.runner import load_model

    lm = load_model(tiny_w8a8 / "w8a8", "torch-cpu")
    with OperandRecorder(lm) as rec:
        out = lm.greedy(torch.arange(10), 3)
    assert out.shape == (3,)
    q_calls = [c for c in rec.calls if c.layer == "model.layers.0.self_attn.q_proj"]
    assert [c.a_q.shape[0] for c in q_calls] == [10, 1, 1]


def test_registering_a_spy_kernel_by_name_reaches_the_runner():
    register("test:spy", SpyKernel)
    from alibi.model.runner import resolve_kernel

    assert isinstance(resolve_kernel("test:spy"), SpyKernel)


@needs_transformers
def test_a_qwen3_w8a8_checkpoint_runs_with_its_qk_norms_and_untied_head(tmp_path):
    from alibi.model.runner import load_model

    from .builders import TINY_QWEN3, tiny_qwen3_tensors

    dense = tiny_qwen3_tensors(seed=9)
    ckpt = quantize_dense(TINY_QWEN3, dense)
    with atomic.staged_dir(tmp_path / "q") as stage:
        write_checkpoint(stage, ckpt.config, ckpt.tensors())
    lm = load_model(tmp_path / "q", "torch-cpu")
    assert type(lm.model).__name__ == "Qwen3ForCausalLM" and len(list(lm.linears())) == 14
    assert torch.equal(lm.model.lm_head.weight, dense["lm_head.weight"])
    assert torch.equal(lm.model.model.layers[1].self_attn.k_norm.weight, dense["model.layers.1.self_attn.k_norm.weight"])
    logits = lm.logits(torch.arange(12).reshape(1, -1))
    assert logits.shape == (1, 12, TINY_QWEN3["vocab_size"]) and bool(torch.isfinite(logits).all())


@needs_transformers
def test_the_overhead_benchmark_reports_positive_timings_and_ratios(tiny_w8a8):
    from alibi.model.capture import capture_overhead
    from alibi.model.runner import load_model

    lm = load_model(tiny_w8a8 / "w8a8", "torch-cpu")
    result = capture_overhead(lm, torch.arange(16).reshape(1, -1), repeats=2)
    assert result.tokens == 16 and result.repeats == 2
    assert min(result.plain_s, result.capture_s, result.capture_tiles_s, result.ratio, result.cpu_ratio) > 0
