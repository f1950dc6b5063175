"""The `triton` kernel is the `a_then_w + add_after_cast` model, bit for bit, on any back end.

Without CUDA these tests run the real kernel code under the Triton interpreter (shapes stay small:
the interpreter is slow); with CUDA the same tests run it natively. Both back ends are held to the
same CPU model, so passing on both means the interpreter and the GPU give the same bits. The model
and the exact accumulator on the shared grid (M = 1 and 67, ragged N and K, every bias and output dtype)
are tests/kernels/test_kernel_contract.py's; here: pow2, subnormal and overflowing outputs, extreme
accumulators, M invariance, the rounding itself, the mutant. Tests marked `gpu` repeat the claims at
production shapes (M up to 4096, K up to 32768).
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from alibi.exact.emulator import VLLM_TRITON, apply_epilogue, exact_accumulator
from alibi.exact.numerics import bits, bitwise_equal, max_ulp_distance, ulp_distance
from alibi.kernels.registry import get_kernel
from alibi.kernels.triton_int8 import (
    block_config,
    interpreted,
    output_bits_to_fp32,
    round_to_output_bits,
)
from alibi.tiles.tile import Tile

OUT_DTYPES = [torch.bfloat16, torch.float16]


def _operands(M: int, K: int, N: int, seed: int, scales: str = "real", device: str = "cpu",
              out_dtype: torch.dtype = torch.bfloat16):
    """int8 operands over the full range (−128 included) and fp32 scales of a chosen regime.

    real: per-token/per-channel magnitudes of a quantized layer (outputs of order 1);
    pow2: power-of-two weight scales; subnormal: outputs shrunk into `out_dtype`'s subnormal range
    (for bfloat16 that is fp32's, so the fp32 products are subnormal too); overflow: outputs beyond
    the range of either dtype (inf).
    """
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-128, 128, (M, K), dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=g)
    s_a = torch.rand(M, generator=g) * 0.15 + 4e-3
    s_w = torch.rand(N, generator=g) * 1e-2 + 1e-4
    if scales == "pow2":
        s_w = torch.exp2(torch.randint(-14, -6, (N,), generator=g).float())
    elif scales == "subnormal":
        shrink = 1e-20 if out_dtype == torch.bfloat16 else 1e-3  # applied to both scales: 1e-40 or 1e-6
        s_a, s_w = s_a * shrink, s_w * shrink
    elif scales == "overflow":
        s_a, s_w = s_a * 1e19, s_w * 1e20  # outputs of order 1e39 > fp32 and bf16 max
    return tuple(t.to(device) for t in (a, s_a, w, s_w))


def _bias(N: int, dtype: torch.dtype | None, seed: int, device: str = "cpu") -> torch.Tensor | None:
    if dtype is None:
        return None
    g = torch.Generator().manual_seed(seed + 1)
    return (torch.randn(N, generator=g) * 4).to(dtype).to(device)


def _model(a, s_a, w, s_w, bias, out_dtype):
    return apply_epilogue(VLLM_TRITON, exact_accumulator(a, w), s_a, s_w, bias, out_dtype)


@pytest.fixture(scope="module")
def triton_kernel():
    kernel = get_kernel("triton")
    ok, reason = kernel.available()
    assert ok, reason
    return kernel


@pytest.fixture(scope="module")
def mutant():
    return get_kernel("mutant:truncate-cast:triton")


def _run(kernel, a, s_a, w, s_w, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    dev = kernel.torch_device()
    bias = None if bias is None else bias.to(dev)
    return kernel.scaled_mm(a.to(dev), s_a.to(dev), w.to(dev), s_w.to(dev), bias, out_dtype).cpu()


# --- availability and evidence ------------------------------------------------------------------

def test_triton_kernel_says_which_backend_runs_it(triton_kernel):
    _, reason = triton_kernel.available()
    ev = triton_kernel.evidence()
    assert ev["triton"] == triton.__version__
    if torch.cuda.is_available():
        assert (ev["backend"], triton_kernel.device) == ("native", "cuda")
    else:
        assert interpreted()
        assert (ev["backend"], triton_kernel.device) == ("interpreter", "cpu")
        assert "Triton interpreter (TRITON_INTERPRET=1)" in reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="only a process without CUDA uses the interpreter")
def test_kernel_works_under_the_interpreter_even_when_triton_was_imported_before_it():
    """`import triton` before the kernel module leaves triton's own jit library compiled, not interpreted;
    the kernel uses none of it, so it must still run (and give the model's bits)."""
    code = """if True:
        import triton, torch
        from alibi.exact.emulator import VLLM_TRITON, apply_epilogue, exact_accumulator
        from alibi.kernels.registry import get_kernel
        a = torch.randint(-128, 128, (3, 40), dtype=torch.int8); w = torch.randint(-128, 128, (5, 40), dtype=torch.int8)
        s_a, s_w = torch.rand(3) + 0.5, torch.rand(5) * 1e-3
        out = get_kernel("triton").scaled_mm(a, s_a, w, s_w)
        assert torch.equal(out.view(torch.int16),
                           apply_epilogue(VLLM_TRITON, exact_accumulator(a, w), s_a, s_w).view(torch.int16))
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr[-2000:]


def test_without_triton_the_kernels_import_and_say_why_they_are_unavailable():
    code = """if True:
        import sys
        sys.modules["triton"] = None  # makes `import triton` raise ImportError
        from alibi.kernels.registry import get_kernel
        for name in ("triton", "triton-fp8", "mutant:truncate-cast:triton"):
            ok, reason = get_kernel(name).available()
            assert not ok and "triton is not importable" in reason, (name, reason)
    """
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr[-2000:]


def test_kernel_compiles_for_sm90_with_tensor_cores_and_no_fma_or_flush_to_zero(tmp_path):
    """Compile only (no GPU needed): int8 and fp8, bf16 and fp16 output, with a bias, at a Hopper tiling.

    The PTX must use wgmma, contain no `fma.` (nothing may be contracted: the model rounds every
    product and sum separately) and no `.ftz` (subnormal outputs must survive)."""
    code = """if True:
        import re
        import torch
        torch.cuda.is_available = lambda: True  # keep the module from choosing the interpreter
        import triton
        import triton.language as tl
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from alibi.kernels.triton_int8 import scaled_mm_kernel
        ints = ("M", "N", "K", "stride_am", "stride_ak", "stride_wn", "stride_wk", "stride_om", "stride_on",
                "stride_sa", "stride_sw")
        for operand, acc in (("i8", tl.int32), ("fp8e4nv", tl.float32)):
            for out_bf16 in (True, False):
                constexprs = dict(ACC_DTYPE=acc, HAS_BIAS=True, OUT_BF16=out_bf16, TRUNCATE=False, STORE_ACC=False,
                                  BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8)
                signature = {"a_ptr": "*" + operand, "w_ptr": "*" + operand, "s_a_ptr": "*fp32", "s_w_ptr": "*fp32",
                             "bias_ptr": "*fp32", "out_ptr": "*i16", **{p: "i32" for p in ints},
                             **{k: "constexpr" for k in constexprs}}
                ptx = triton.compile(ASTSource(fn=scaled_mm_kernel, signature=signature, constexprs=constexprs),
                                     target=GPUTarget("cuda", 90, 32),
                                     options={"num_warps": 8, "num_stages": 3}).asm["ptx"]
                assert "wgmma.mma_async" in ptx, (operand, out_bf16, "no wgmma")
                assert not re.search(r"\\bfma\\.", ptx), (operand, out_bf16, "an fma")
                assert ".ftz" not in ptx, (operand, out_bf16, "flush-to-zero")
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # really compile, whatever an earlier run cached
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                            check=False)
    assert result.returncode == 0, result.stderr[-3000:]


def test_a_run_records_the_block_config_it_used_and_the_declared_model_in_its_evidence(triton_kernel):
    """Its output and accumulator on a run are tests/kernels/test_kernel_contract.py's."""
    a, s_a, w, s_w = _operands(5, 70, 9, seed=3)
    tile = Tile(name="t", a_q=a, s_a=s_a, w_q=w, s_w=s_w, bias=_bias(9, torch.bfloat16, 3))
    result = triton_kernel.run(tile, accumulator=True)
    assert result.acc.dtype == torch.int32
    assert result.evidence["block_config"]["block_m"] == block_config(5, 9, None if interpreted() else
                                                                      torch.cuda.get_device_capability()).block_m
    assert result.evidence["epilogue_model"] == "a_then_w+add_after_cast"


def test_triton_refuses_fp8_operands_and_mismatched_k(triton_kernel):
    from alibi.errors import InputError

    a, s_a, w, s_w = _operands(2, 32, 3, seed=0)
    with pytest.raises(InputError, match="int8"):
        triton_kernel.scaled_mm(a.float().to(torch.float8_e4m3fn), s_a, w.float().to(torch.float8_e4m3fn), s_w)
    with pytest.raises(InputError, match=r"\[M,K\]"):
        triton_kernel.scaled_mm(a, s_a, w[:, :16], s_w)


def test_small_m_gets_a_small_block_m_as_in_vllm():
    assert block_config(1, 576, None).block_m == 16
    assert block_config(4096, 576, None).block_m == 128
    # vLLM's Hopper table: its smallest M bucket is 32 (BLOCK_M 64), the largest 1024 (BLOCK_M 128).
    assert block_config(1, 4096, (9, 0)).block_m == 64
    assert block_config(4096, 4096, (9, 0)) == block_config(1024, 4096, (9, 0))
    assert block_config(4096, 4096, (9, 0)).block_m == 128


# --- the output is the declared model (at M = 1, 67 and ragged shapes: tests/kernels/test_kernel_contract.py) ---

@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("scales", ["pow2", "subnormal", "overflow"])
def test_triton_matches_the_model_on_pow2_subnormal_and_overflowing_outputs(triton_kernel, scales, out_dtype):
    a, s_a, w, s_w = _operands(20, 96, 40, seed=7, scales=scales, out_dtype=out_dtype)
    plain = _model(a, s_a, w, s_w, None, out_dtype)
    if scales == "subnormal":
        assert bool(((plain != 0) & (plain.abs() < torch.finfo(out_dtype).tiny)).any())
    if scales == "overflow":
        assert bool(torch.isinf(plain).any())
    for bias in (None, _bias(40, torch.bfloat16, seed=7)):
        out = _run(triton_kernel, a, s_a, w, s_w, bias, out_dtype)
        assert bitwise_equal(out, _model(a, s_a, w, s_w, bias, out_dtype))


# --- the accumulator ------------------------------------------------------------------------------

def test_exposed_accumulator_is_exact_for_all_minus_128_operands_at_k_32768(triton_kernel):
    """Every product is +16384, the largest an int8 pair can make: acc = 2²⁹ exactly, far beyond 2²⁴."""
    M, K, N = 3, 32768, 5
    a = torch.full((M, K), -128, dtype=torch.int8)
    w = torch.full((N, K), -128, dtype=torch.int8)
    dev = triton_kernel.torch_device()
    acc = triton_kernel.accumulator(a.to(dev), w.to(dev)).cpu()
    assert torch.equal(acc.long(), exact_accumulator(a, w))
    assert int(acc[0, 0]) == 16384 * K == 2**29


# --- M invariance ---------------------------------------------------------------------------------

@pytest.mark.parametrize("bias_dtype", [None, torch.bfloat16], ids=["nobias", "bias"])
def test_rows_are_identical_at_m_1_4_16_and_inside_a_larger_m(triton_kernel, bias_dtype):
    """The int32 accumulator is exact and the epilogue elementwise, so the M-dependent tiling is invisible."""
    M, K, N = 200, 160, 33
    a, s_a, w, s_w = _operands(M, K, N, seed=5)
    bias = _bias(N, bias_dtype, seed=5)
    full = _run(triton_kernel, a, s_a, w, s_w, bias)
    configs = {triton_kernel.last_config}
    for rows in (slice(0, 1), slice(137, 138), slice(50, 54), slice(180, 196), slice(199, 200)):
        part = _run(triton_kernel, a[rows], s_a[rows], w, s_w, bias)
        configs.add(triton_kernel.last_config)
        assert bitwise_equal(part, full[rows]), f"rows {rows} differ between M={M} and M={part.shape[0]}"
    assert len(configs) > 1, "the test must compare different tilings"


# --- the positive control -------------------------------------------------------------------------

def test_mutant_declares_the_same_epilogue_model_as_triton(triton_kernel, mutant):
    assert mutant.epilogue == triton_kernel.epilogue == VLLM_TRITON


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=["bf16", "fp16"])
def test_truncating_mutant_differs_from_the_model_by_exactly_one_ulp_on_some_elements_never_more(
        mutant, out_dtype):
    a, s_a, w, s_w = _operands(37, 300, 50, seed=9)
    out = _run(mutant, a, s_a, w, s_w, None, out_dtype)
    ref = _model(a, s_a, w, s_w, None, out_dtype)
    d = ulp_distance(out, ref)
    assert int((d > 0).sum()) > 0.2 * d.numel()  # about half the elements round away from zero
    assert max_ulp_distance(out, ref) == 1
    assert bool((out.float().abs() <= ref.float().abs()).all()), "truncation never increases a magnitude"


# --- the explicit rounding itself ------------------------------------------------------------------

@triton.jit
def _round_probe(x_ptr, nearest_ptr, toward_zero_ptr, n, OUT_BF16: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(nearest_ptr + offs, round_to_output_bits(x, OUT_BF16, False), mask=mask)
    tl.store(toward_zero_ptr + offs, round_to_output_bits(x, OUT_BF16, True), mask=mask)


@triton.jit
def _widen_probe(bits_ptr, out_ptr, n, OUT_BF16: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, output_bits_to_fp32(tl.load(bits_ptr + offs, mask=mask), OUT_BF16), mask=mask)


def _hard_fp32_values() -> torch.Tensor:
    """Random fp32 bit patterns plus exact ties, subnormals, the overflow edge and signed zeros."""
    g = torch.Generator().manual_seed(0)
    rand = torch.randint(0, 2**32, (1 << 16,), dtype=torch.int64, generator=g).to(torch.int32).view(torch.float32)
    ties_bf16 = (torch.randint(0, 2**16, (4096,), generator=g, dtype=torch.int64) << 16 | 0x8000).to(torch.int32)
    ties_fp16 = torch.arange(1, 4096, dtype=torch.float64) * 2.0**-11 + 2.0**-12  # halfway between fp16 values
    edges = torch.tensor([0.0, -0.0, 65504.0, 65519.99, 65520.0, -65520.0, 2.0**-24, 1.5 * 2.0**-25, 2.0**-26,
                          3.3895e38, 3.4028235e38, -3.4028235e38, 1e-45, -1e-45, 2.0**-126])
    x = torch.cat([rand, ties_bf16.view(torch.float32), ties_fp16.float(), -ties_fp16.float(),
                   torch.ldexp(ties_fp16.float(), torch.tensor(-14)), edges.float()])
    return x[torch.isfinite(x)]


def _toward_zero(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Reference round-toward-zero: the nearest value, stepped back toward zero if it moved away."""
    r = x.to(dtype)
    away = r.float().abs() > x.abs()
    return torch.where(away, torch.nextafter(r, torch.zeros_like(r)), r)


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=["bf16", "fp16"])
def test_kernel_rounding_is_nearest_even_and_the_mutant_rounds_toward_zero_on_hard_values(out_dtype):
    """Against torch's CPU casts (nearest-even): ties, subnormals, overflow to inf, signed zeros."""
    dev = "cpu" if interpreted() else "cuda"
    x = _hard_fp32_values()
    nearest = torch.empty(x.numel(), dtype=torch.int16, device=dev)
    toward_zero = torch.empty_like(nearest)
    with np.errstate(over="ignore"):  # the interpreter's numpy cast warns on overflow to inf (intended here)
        _round_probe[(triton.cdiv(x.numel(), 4096),)](x.to(dev), nearest, toward_zero, x.numel(),
                                                      OUT_BF16=out_dtype == torch.bfloat16, BLOCK=4096)
    assert torch.equal(nearest.cpu(), bits(x.to(out_dtype)))
    assert torch.equal(toward_zero.cpu(), bits(_toward_zero(x, out_dtype)))


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=["bf16", "fp16"])
def test_output_values_widen_to_fp32_exactly_for_every_16_bit_pattern(out_dtype):
    """The bias is added to the widened output: every finite pattern, subnormals included, must widen exactly."""
    dev = "cpu" if interpreted() else "cuda"
    patterns = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    out = torch.empty(patterns.numel(), dtype=torch.float32, device=dev)
    _widen_probe[(16,)](patterns.to(dev), out, patterns.numel(), OUT_BF16=out_dtype == torch.bfloat16, BLOCK=4096)
    ref = patterns.view(out_dtype).float()
    finite = torch.isfinite(ref)
    assert torch.equal(bits(out.cpu()[finite]), bits(ref[finite]))


# --- on the GPU, at production shapes -------------------------------------------------------------

GPU_SHAPES = [(1, 4096, 4096), (16, 4096, 4097), (512, 4096, 4096), (4096, 4096, 4096), (1, 32768, 2048),
              (16, 32768, 1000), (512, 8192, 11008), (4096, 32768, 576), (77, 1536, 576), (300, 576, 1536)]


def _gpu_exact_accumulator(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Exact for the reason `exact_accumulator` is (integers below 2⁵³ in fp64), but computed on the GPU."""
    return (a.double() @ w.double().T).to(torch.int64).cpu()


@pytest.mark.gpu
@pytest.mark.parametrize("M,K,N", GPU_SHAPES)
def test_gpu_output_and_accumulator_equal_the_model_and_the_exact_reference(triton_kernel, mutant, M, K, N):
    a, s_a, w, s_w = _operands(M, K, N, seed=M + K + N, device="cuda")
    exact = _gpu_exact_accumulator(a, w)
    assert torch.equal(triton_kernel.accumulator(a, w).cpu().long(), exact)
    for out_dtype in OUT_DTYPES:
        for bias in (None, _bias(N, torch.bfloat16, seed=N, device="cuda")):
            out = triton_kernel.scaled_mm(a, s_a, w, s_w, bias, out_dtype).cpu()
            ref = apply_epilogue(VLLM_TRITON, exact, s_a, s_w, bias, out_dtype)
            n_diff = int((bits(out) != bits(ref)).sum())
            assert bitwise_equal(out, ref), f"{out_dtype}, bias={bias is not None}: {n_diff} elements differ"
        truncated = mutant.scaled_mm(a, s_a, w, s_w, None, out_dtype).cpu()
        plain = apply_epilogue(VLLM_TRITON, exact, s_a, s_w, None, out_dtype)
        assert max_ulp_distance(truncated, plain) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("scales", ["pow2", "subnormal", "overflow"])
def test_gpu_matches_the_model_on_pow2_subnormal_and_overflowing_outputs(triton_kernel, scales):
    """Subnormal outputs would expose a flush-to-zero multiply on the GPU."""
    for out_dtype in OUT_DTYPES:
        a, s_a, w, s_w = _operands(512, 4096, 1024, seed=1, scales=scales, device="cuda", out_dtype=out_dtype)
        exact = _gpu_exact_accumulator(a, w)
        out = triton_kernel.scaled_mm(a, s_a, w, s_w, None, out_dtype).cpu()
        assert bitwise_equal(out, apply_epilogue(VLLM_TRITON, exact, s_a, s_w, None, out_dtype))


@pytest.mark.gpu
def test_gpu_accumulator_is_exact_for_all_minus_128_operands_at_k_32768(triton_kernel):
    for M in (1, 16, 512):
        a = torch.full((M, 32768), -128, dtype=torch.int8, device="cuda")
        w = torch.full((4097, 32768), -128, dtype=torch.int8, device="cuda")
        acc = triton_kernel.accumulator(a, w)
        assert bool((acc == 2**29).all())


@pytest.mark.gpu
def test_gpu_rows_are_identical_at_m_1_4_16_64_512_and_inside_m_4096(triton_kernel):
    a, s_a, w, s_w = _operands(4096, 4096, 4096, seed=2, device="cuda")
    bias = _bias(4096, torch.bfloat16, seed=2, device="cuda")
    for b in (None, bias):
        full = triton_kernel.scaled_mm(a, s_a, w, s_w, b)
        configs = {triton_kernel.last_config}
        for start, m in ((0, 1), (4095, 1), (1000, 4), (2048, 16), (17, 64), (3000, 512)):
            rows = slice(start, start + m)
            part = triton_kernel.scaled_mm(a[rows], s_a[rows], w, s_w, b)
            configs.add(triton_kernel.last_config)
            assert bitwise_equal(part.cpu(), full[rows].cpu()), f"rows {start}..{start + m} at M={m}"
        assert len(configs) > 1
