"""`bnb-int8`: bitsandbytes 0.50.2's int8_scaled_mm on absmax statistics, held to its declared model."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("bitsandbytes", reason="the bnb extra is not installed (pip install 'integer-alibi[bnb]')")

from alibi.conform.pipeline import apply_regime  # noqa: E402
from alibi.controls.identify import identify  # noqa: E402
from alibi.errors import InputError  # noqa: E402
from alibi.exact.emulator import (  # noqa: E402
    EpilogueModel,
    apply_epilogue,
    exact_accumulator,
    run_model,
)
from alibi.exact.numerics import bits, bitwise_equal, bitwise_equal_mask  # noqa: E402
from alibi.kernels.bnb import (  # noqa: E402
    BNB_CPU,
    BNB_CUDA,
    cuda_flushed_epilogue,
    statistics,
    with_exact_statistics,
)
from alibi.kernels.registry import get_kernel  # noqa: E402
from alibi.tiles.exposing import subnormal_outputs_tile  # noqa: E402
from alibi.tiles.synthetic import synthetic_tiles  # noqa: E402


@pytest.fixture(scope="module")
def kernel():
    k = get_kernel("bnb-int8")
    ok, reason = k.available()
    assert ok, reason
    return k


@pytest.fixture(scope="module")
def probe():
    return [with_exact_statistics(t) for t in synthetic_tiles("epilogue-probe-bias")]


def test_statistics_are_127_times_the_scales_exactly_and_inexact_ones_are_refused():
    exact = torch.tensor([0.5, 3.0, 2.0**-20 * 1.25], dtype=torch.float32)
    assert torch.equal(statistics(exact, "s_a", "bnb-int8").double(), exact.double() * 127)
    with pytest.raises(InputError, match=r"127·s_w\[1\] = 127·0\.1.* is not an fp32 number"):
        statistics(torch.tensor([0.5, 0.1], dtype=torch.float32), "s_w", "bnb-int8")


def test_rounded_scales_have_at_most_17_significant_bits_and_are_accepted():
    tile = with_exact_statistics(synthetic_tiles("tiny")[0])
    statistics(tile.s_a, "s_a", "bnb-int8")
    statistics(tile.s_w, "s_w", "bnb-int8")


def test_bnb_receives_the_statistics_alibi_derives(kernel):
    """The kernel's output is bitsandbytes' op called directly on a_q, w_q and 127·s: nothing else is handed over."""
    tile = with_exact_statistics(synthetic_tiles("smollm2-135m-bias")[0])
    direct = torch.ops.bitsandbytes.int8_scaled_mm.default(tile.a_q, tile.w_q, tile.s_a * 127, tile.s_w * 127,
                                                           bias=tile.bias, dtype=tile.out_dtype)
    assert bitwise_equal(kernel.run(tile).out, direct)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_bnb_int8_equals_its_declared_statistics_model_under_power_of_two_scales(kernel, probe, out_dtype):
    """Real scales rounded to 17 bits are the kernel contract's (tests/kernels/test_kernel_contract.py); here the
    pow2 regime's weight scales 2ᵏ (statistics 127·2ᵏ, exact too)."""
    tiles = probe + [with_exact_statistics(t) for t in synthetic_tiles("smollm2-135m-bias")[:2]]
    for tile in tiles:
        t = apply_regime(tile.replace(out_dtype=out_dtype), "pow2")
        assert bitwise_equal(kernel.run(t).out, run_model(kernel.epilogue, t)), tile.name


def test_identify_names_bnb_int8s_declared_model_as_the_only_match(kernel, probe):
    found = identify(kernel, probe)
    assert [c.model for c in found if c.matches] == [kernel.epilogue.name]


def test_real_scales_that_do_not_convert_exactly_are_refused_naming_the_fix(kernel):
    with pytest.raises(InputError, match="at most 17 significant bits"):
        kernel.run(synthetic_tiles("tiny")[0])


def test_the_cpu_and_cuda_backends_declare_different_constants_and_the_difference_shows(probe):
    """bitsandbytes' CPU backend multiplies by 6.200124e-05, its CUDA kernel by 6.200012e-05 (≈ 1/127²): on the
    same operands the two models give different fp16 outputs, beyond any choice of scale order."""
    assert BNB_CPU.statistics != BNB_CUDA.statistics
    tile = probe[0].replace(out_dtype=torch.float16, bias=None)
    same_order = EpilogueModel(BNB_CPU.order, BNB_CPU.bias, statistics=BNB_CUDA.statistics)
    assert int((~bitwise_equal_mask(run_model(BNB_CPU, tile), run_model(same_order, tile))).sum()) > 0


def test_the_cuda_kernels_flushed_arithmetic_differs_from_its_model_only_where_an_fp32_intermediate_is_subnormal():
    """`cuda_flushed_epilogue` (what the H100 gave on the subnormal-outputs tile) equals the declared CUDA model on
    tiles whose intermediates are normal, and on the subnormal-outputs tile differs in exactly the one element
    whose product of about 2⁻¹³⁰ the model rounds to −0 and the flushing kernel to +0."""
    def differing(tile):
        t = with_exact_statistics(tile.replace(out_dtype=torch.float16))
        acc = exact_accumulator(t.a_q, t.w_q)
        model = apply_epilogue(BNB_CUDA, acc, t.s_a, t.s_w, None, torch.float16)
        flushed = cuda_flushed_epilogue(BNB_CUDA, acc, t.s_a, t.s_w, torch.float16)
        return (bits(model) != bits(flushed)).nonzero().tolist(), model, flushed

    for tile in synthetic_tiles("smollm2-135m", seed=1, M=16):
        assert differing(tile)[0] == []
    where, model, flushed = differing(subnormal_outputs_tile())
    assert where == [[22, 21]]
    assert torch.signbit(model[22, 21]) and not torch.signbit(flushed[22, 21]) and float(model[22, 21]) == 0.0
