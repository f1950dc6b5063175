"""`triton:w_then_a+fma` is vLLM's CUTLASS epilogue (`w_then_a + fma`) bit for bit; `triton` is unchanged.

Without CUDA the kernels run under the Triton interpreter (small shapes: it is slow); with CUDA the
same tests run natively, so passing on both means both back ends give the model's bits. The
bias is fused with one rounding by `fused_multiply_add_f32`, not `tl.fma`, because the interpreter's
`tl.fma` rounds twice (proved below on a constructed double-rounding case).
"""

import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from alibi.controls.identify import identify
from alibi.exact.emulator import VLLM_TRITON, EpilogueModel, exact_accumulator, fma_f32, run_model
from alibi.exact.numerics import bits, bitwise_equal
from alibi.kernels.registry import get_kernel, kernel_names
from alibi.kernels.triton_int8 import fused_multiply_add_f32, interpreted, launch
from alibi.tiles.synthetic import synthetic_tiles

W_THEN_A_FMA = EpilogueModel("w_then_a", "fma")
OUT_DTYPES = [torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def fma_kernel():
    kernel = get_kernel("triton:w_then_a+fma")
    ok, reason = kernel.available()
    assert ok, reason
    return kernel


@pytest.fixture(scope="module")
def probe_tiles():
    """The identify probes at M=16 (the interpreter's smallest BLOCK_M): scale orders and bias modes disagree."""
    return [synthetic_tiles(p, seed=0, M=16)[0] for p in ("epilogue-probe", "epilogue-probe-bias")]


def _device_tile(kernel, tile):
    dev = kernel.torch_device()
    return replace(tile, a_q=tile.a_q.to(dev), s_a=tile.s_a.to(dev), w_q=tile.w_q.to(dev), s_w=tile.s_w.to(dev),
                   bias=None if tile.bias is None else tile.bias.to(dev))


def _n_diff(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((bits(a.cpu()) != bits(b.cpu())).sum())


# --- the fused multiply-add ---------------------------------------------------------------------

@triton.jit
def _fma_probe_kernel(x_ptr, y_ptr, z_ptr, ours_ptr, tl_fma_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    z = tl.load(z_ptr + offs, mask=mask, other=0.0)
    tl.store(ours_ptr + offs, fused_multiply_add_f32(x, y, z), mask=mask)
    tl.store(tl_fma_ptr + offs, tl.fma(x, y, z), mask=mask)


def _run_fma(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dev = "cpu" if interpreted() else "cuda"
    x, y, z = (t.to(torch.float32).contiguous().to(dev) for t in (x, y, z))
    ours, theirs = torch.empty_like(x), torch.empty_like(x)
    block = triton.next_power_of_2(x.numel())
    with np.errstate(over="ignore", invalid="ignore"):
        _fma_probe_kernel[(1,)](x, y, z, ours, theirs, x.numel(), BLOCK=block)
    return ours.cpu(), theirs.cpu()


def _double_rounding_cases() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x·y = 2⁻²⁴ − 2⁻⁵⁴ plus z = 1 + 2⁻²³: the sum rounded once to fp32 gives 1 + 2⁻²³, but
    rounding x·y first (or the sum through fp64 to exactly the fp32 midpoint 1 + 3·2⁻²⁴) gives
    1 + 2⁻²² by ties-to-even. Scaled by powers of two and negated, so every sign and several
    exponents are covered."""
    x0, y0, z0 = 2.0**-12 * (1 + 2.0**-15), 2.0**-12 * (1 - 2.0**-15), 1 + 2.0**-23
    xs, ys, zs = [], [], []
    for e in (-40, -3, 0, 17, 60):
        for sign in (1.0, -1.0):
            xs.append(sign * x0 * 2.0**e)
            ys.append(y0)
            zs.append(sign * z0 * 2.0**e)
    return torch.tensor(xs), torch.tensor(ys), torch.tensor(zs)


def test_fused_multiply_add_rounds_once_on_double_rounding_cases_and_equals_the_exact_emulator():
    x, y, z = _double_rounding_cases()
    ours, _ = _run_fma(x, y, z)
    exact = fma_f32(x, y, z)
    assert torch.equal(bits(ours), bits(exact))
    assert torch.equal(exact.abs() / (2.0 ** torch.tensor([-40, -40, -3, -3, 0, 0, 17, 17, 60, 60.0])),
                       torch.full((10,), 1 + 2.0**-23))  # the case really is the once-rounded value


@pytest.mark.skipif(torch.cuda.is_available(), reason="a fact about the interpreter (the GPU's tl.fma is fused)")
def test_interpreter_tl_fma_rounds_twice_so_the_kernel_cannot_use_it():
    x, y, z = _double_rounding_cases()
    _, tl_fma = _run_fma(x, y, z)
    twice = (x * y) + z  # fp32 product, then fp32 sum: two roundings
    assert torch.equal(bits(tl_fma), bits(twice))
    assert not torch.equal(bits(tl_fma), bits(fma_f32(x, y, z)))


def test_fused_multiply_add_equals_the_exact_emulator_on_the_probe_epilogue_and_edge_values(probe_tiles):
    tile = probe_tiles[1]  # with its fp32 bias
    acc = exact_accumulator(tile.a_q, tile.w_q).to(torch.int32).to(torch.float32)
    t = tile.s_w.reshape(1, -1) * acc                       # RN32(s_w · float(acc)), as the kernel
    s_a = tile.s_a.reshape(-1, 1).expand_as(t)
    bias = tile.bias.to(torch.float32).reshape(1, -1).expand_as(t)
    g = torch.Generator().manual_seed(7)
    rx, ry = torch.randn(2, 1024, generator=g) * 10.0 ** torch.randint(-20, 20, (2, 1024), generator=g)
    rz = -(rx * ry) * (1 + torch.randn(1024, generator=g) * 2.0**-20)  # near-cancellation: many hard roundings
    fmax, tiny = torch.finfo(torch.float32).max, 2.0**-149
    ex = torch.tensor([fmax, fmax, -fmax, 1.0, tiny, tiny, float("inf"), 3.0, 0.0, -0.0, 2.0**64, 1.0])
    ey = torch.tensor([1.0, 1 + 2.0**-23, 1.0, -1.0, 0.5, tiny, 1.0, 2.0, -1.0, 1.0, 2.0**64, 0.0])
    ez = torch.tensor([fmax * 2.0**-24, 0.0, -fmax * 2.0**-24, 1.0, 0.0, -0.0, -1.0, -6.0, 0.0, -0.0, -fmax, -0.0])
    x = torch.cat([s_a.reshape(-1), rx, ex])
    y = torch.cat([t.reshape(-1), ry, ey])
    z = torch.cat([bias.reshape(-1), rz, ez])
    ours, _ = _run_fma(x, y, z)
    assert torch.equal(bits(ours), bits(fma_f32(x, y, z)))


# --- the kernel against the model (its bits on the shared grid: tests/kernels/test_kernel_contract.py) -----

def test_new_kernel_is_registered_and_declares_w_then_a_fma(fma_kernel):
    assert "triton:w_then_a+fma" in kernel_names() and "triton" in kernel_names()
    assert fma_kernel.epilogue == W_THEN_A_FMA
    assert get_kernel("triton").epilogue == VLLM_TRITON


def test_identify_names_w_then_a_fma_and_only_it_for_the_new_kernel(fma_kernel, probe_tiles):
    found = identify(fma_kernel, [_device_tile(fma_kernel, t) for t in probe_tiles])
    assert found[0].model == "w_then_a+fma" and found[0].matches
    assert [c.model for c in found if c.matches] == ["w_then_a+fma"]


def test_identify_still_names_a_then_w_add_after_cast_for_the_default_triton(probe_tiles):
    kernel = get_kernel("triton")
    found = identify(kernel, [_device_tile(kernel, t) for t in probe_tiles])
    assert [c.model for c in found if c.matches] == ["a_then_w+add_after_cast"]


@pytest.mark.parametrize("with_bias", [False, True])
def test_default_triton_is_unchanged_and_differs_from_the_new_kernel_where_the_models_differ(fma_kernel, probe_tiles,
                                                                                            with_bias):
    tile = probe_tiles[1 if with_bias else 0]
    default = get_kernel("triton")
    old = default.run(_device_tile(default, tile)).out.cpu()
    new = fma_kernel.run(_device_tile(fma_kernel, tile)).out.cpu()
    assert bitwise_equal(old, run_model(VLLM_TRITON, tile))
    models_differ = _n_diff(run_model(VLLM_TRITON, tile), run_model(W_THEN_A_FMA, tile))
    assert models_differ > 0
    assert _n_diff(old, new) == models_differ


def test_launch_refuses_an_epilogue_it_has_no_kernel_for_and_fault_switches_with_the_new_one():
    a, w = torch.ones(2, 8, dtype=torch.int8), torch.ones(3, 8, dtype=torch.int8)
    s_a, s_w = torch.ones(2), torch.ones(3)
    from alibi.errors import InputError

    with pytest.raises(InputError, match="no epilogue 'product_first\\+fma'"):
        launch(a, s_a, w, s_w, epilogue=EpilogueModel("product_first", "fma"))
    with pytest.raises(InputError, match="without fault switches"):
        launch(a, s_a, w, s_w, epilogue=W_THEN_A_FMA, truncate=True)


def test_new_kernel_compiles_for_sm90_with_tensor_cores_no_fp32_fma_and_no_flush_to_zero(tmp_path):
    """Compile only (no GPU needed): the PTX uses wgmma, contracts no fp32 product into an `fma.rn.f32`
    (its fp32 steps each round separately; fp64 FMAs are harmless, the fp64 product is exact), and
    has no `.ftz` (subnormals must survive)."""
    code = """if True:
        import re
        import torch
        torch.cuda.is_available = lambda: True  # keep the module from choosing the interpreter
        import triton
        import triton.language as tl
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from alibi.kernels.triton_int8 import w_then_a_fma_scaled_mm_kernel
        ints = ("M", "N", "K", "stride_am", "stride_ak", "stride_wn", "stride_wk", "stride_om", "stride_on",
                "stride_sa", "stride_sw")
        for out_bf16 in (True, False):
            constexprs = dict(ACC_DTYPE=tl.int32, HAS_BIAS=True, OUT_BF16=out_bf16, TRUNCATE=False, STORE_ACC=False,
                              BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8)
            signature = {"a_ptr": "*i8", "w_ptr": "*i8", "s_a_ptr": "*fp32", "s_w_ptr": "*fp32",
                         "bias_ptr": "*fp32", "out_ptr": "*i16", **{p: "i32" for p in ints},
                         **{k: "constexpr" for k in constexprs}}
            ptx = triton.compile(ASTSource(fn=w_then_a_fma_scaled_mm_kernel, signature=signature,
                                           constexprs=constexprs),
                                 target=GPUTarget("cuda", 90, 32),
                                 options={"num_warps": 8, "num_stages": 3}).asm["ptx"]
            assert "wgmma.mma_async" in ptx, (out_bf16, "no wgmma")
            assert not re.search(r"\\bfma\\.rn\\.f32", ptx), (out_bf16, "an fp32 fma")
            assert "f64" in ptx, (out_bf16, "the fp64 fused multiply-add is missing")
            assert ".ftz" not in ptx, (out_bf16, "flush-to-zero")
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                            check=False)
    assert result.returncode == 0, result.stderr[-3000:]


# --- on the GPU: the same bits as CUTLASS -------------------------------------------------------

GPU_SHAPES = [(1, 4096, 4096), (16, 576, 1536), (128, 1536, 576), (512, 4096, 11008)]


@pytest.mark.gpu
@pytest.mark.parametrize("M,K,N", GPU_SHAPES)
@pytest.mark.parametrize("bias_dtype", [None, torch.bfloat16, torch.float32])
def test_gpu_new_kernel_equals_cutlass_bit_for_bit_with_real_scales(fma_kernel, M, K, N, bias_dtype):
    cutlass = get_kernel("cutlass")
    ok, reason = cutlass.available()
    assert ok, reason
    g = torch.Generator().manual_seed(M + K + N)
    a = torch.randint(-128, 128, (M, K), dtype=torch.int8, generator=g).cuda()
    w = torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=g).cuda()
    s_a = (torch.rand(M, generator=g) * 0.15 + 4e-3).cuda()
    s_w = (torch.rand(N, generator=g) * 1e-2 + 1e-4).cuda()
    bias = None if bias_dtype is None else (torch.randn(N, generator=g) * 4).to(bias_dtype).cuda()
    for out_dtype in OUT_DTYPES:
        ours = fma_kernel.scaled_mm(a, s_a, w, s_w, bias, out_dtype).cpu()
        theirs = cutlass.scaled_mm(a, s_a, w, s_w, bias, out_dtype).cpu()
        assert bitwise_equal(ours, theirs), f"{out_dtype}: {_n_diff(ours, theirs)} elements differ"


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["epilogue-probe", "epilogue-probe-bias"])
def test_gpu_new_kernel_equals_cutlass_on_the_epilogue_probes(fma_kernel, preset):
    cutlass = get_kernel("cutlass")
    ok, reason = cutlass.available()
    assert ok, reason
    tile = synthetic_tiles(preset, seed=0)[0]
    ours = fma_kernel.run(_device_tile(fma_kernel, tile)).out.cpu()
    theirs = cutlass.run(_device_tile(cutlass, tile)).out.cpu()
    assert bitwise_equal(ours, theirs), f"{_n_diff(ours, theirs)} elements differ"
