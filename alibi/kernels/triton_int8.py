"""The `triton` kernel: a Triton scaled GEMM with vLLM's Triton epilogue, the same bits on GPU and CPU.

What it computes, for int8 `A [M,K]`, int8 `W [N,K]`, fp32 scales `s_a [M]` (or `[1]`) and
`s_w [N]` (or `[1]`), an optional bias `[N]` and an output dtype `out` (bfloat16 or float16):

    acc = Σ_k A[m,k]·W[n,k]                       int32, tiled `tl.dot(..., out_dtype=tl.int32)`
    y   = RN32(s_w[n] · RN32(s_a[m] · float(acc)))  activation scale first (vLLM Triton order)
    c   = out(y)                                    round to nearest even
    c   = out(RN32(float(c) + float(bias[n])))      with a bias: added *after* the cast, as vLLM does

which is `alibi.exact.emulator.apply_epilogue(VLLM_TRITON, acc, ...)` = `a_then_w + add_after_cast`. The
int32 accumulator is exact (science.md §2.1: integer addition is associative and the int8 MMA
accumulates without rounding), so the block sizes, which depend on M as in vLLM, cannot change a
single output bit; only the per-element epilogue could, and it has no M-dependent arithmetic. The
same kernel with fp8 e4m3 operands accumulates in fp32 instead (see `triton_fp8.py`).

Same bits under the interpreter and on the GPU. Without CUDA this module runs its kernels under the
Triton interpreter (`TRITON_INTERPRET=1`, numpy on the CPU). Every step above is IEEE
round-to-nearest-even on both back ends (int32→fp32 conversion and fp32 multiply/add: numpy on
the CPU, `cvt.rn` / `mul.rn` / `add.rn` in PTX; no product feeds an addition, so no FMA
contraction can occur) except three conversions, handled as follows:

* fp32 → bfloat16: the interpreter *truncates* (`triton.runtime.interpreter._convert_float`
  drops the low bits, also when asked for `rtne`), the GPU rounds to nearest even. The kernel
  therefore never uses `.to(tl.bfloat16)`: it rounds with integer bit arithmetic,
  `(u + 0x7FFF + ((u >> 16) & 1)) >> 16` on the fp32 bit pattern `u`, which both back ends
  execute identically, and stores the 16-bit pattern; the host views it as bfloat16.
* fp32 → float16: the interpreter converts with numpy's `astype`, which rounds to nearest even,
  like the GPU's `cvt.rn.f16.f32`, so the native cast is kept (the tests compare it with torch on
  random patterns, ties, subnormals and overflow, on whichever back end runs them).
* the bias bfloat16 → fp32: the interpreter's bit-level converter gets bfloat16 subnormals wrong
  (triton 3.9), so the host widens the bias to fp32 before the launch. That widening is exact for
  bfloat16, float16 and float32 biases, so it changes no value. Inside the kernel the output is
  widened back to fp32 for the bias add by a 16-bit shift, exact on both back ends.

NaN patterns are not part of the claim: an output NaN (only reachable with a non-finite bias) is
kept quiet with its sign, whereas torch's CPU cast and the GPU's `cvt` each use their own NaN.

The interpreter choice is fixed when this module is imported: `triton.jit` decides at decoration
time whether a function is interpreted. Without CUDA the module sets `TRITON_INTERPRET=1` before
importing triton, so in such a process every Triton kernel decorated afterwards is interpreted
too (there is nothing else it could run on); with CUDA the environment is left as it is.
Triton's own jit functions (`tl.cdiv`, `tl.zeros`, ...) are decorated when triton is first
imported; if some other module imported triton before the variable was set, they stay compiled
and cannot be called from an interpreted kernel. The kernels here therefore use only builtins
(`tl.full`, integer `//`), and work however the process imported triton.

`mutant:truncate-cast:triton` is the same kernel with every fp32 → output conversion rounding
toward zero (for bfloat16, what a plain `.to(tl.bfloat16)` computes under the interpreter). It declares
`a_then_w + add_after_cast` all the same, so the epilogue-model conformance check must catch it: its outputs
differ from the model by one ulp on some elements (without a bias, never by more).

`triton:w_then_a+fma` is the same main loop with vLLM's CUTLASS epilogue (`w_then_a + fma`), a separate
kernel `w_then_a_fma_scaled_mm_kernel` selected by `launch(..., epilogue=W_THEN_A_FMA)`: t = RN32(s_w ·
float(acc)), then RN32(s_a · t + bias) with one rounding (`fused_multiply_add_f32`, exact in fp64 with
round-to-odd, because the interpreter's `tl.fma` rounds twice), or RN32(s_a · t) without a bias; then the
same output cast.

Native fault variants (positive controls, `alibi.kernels.mutants`) are constexpr switches of a second
kernel, `faulty_scaled_mm_kernel`, so `scaled_mm_kernel` itself stays exactly as described above:

* `FP32_ACC`: an fp32 accumulator. Each `FAULT_PART_K` = 128 elements of K form one exact int32
  partial (`tl.dot` over ≤ 1024 int8 products cannot round), which is converted to fp32 and added
  into an fp32 running sum: RN32 at every addition, in K order. Both back ends execute that
  identically (int32 → fp32 conversion and fp32 addition are round-to-nearest-even on both).
* `SPLIT_K` > 1: split-K with fp32 partial sums: K is cut into `SPLIT_K` contiguous ranges of
  ceil(K / SPLIT_K) elements, each reduced exactly in int32, converted to fp32 and summed in fp32
  in range order. (One program walks its ranges in turn, so the fp32 reduction order is fixed; a
  real split-K launch reduces its partials in the same way but in whatever order they arrive.)
* `SCALE_BF16`: the weight scale rounded to bfloat16 (nearest even, by the same integer bit
  arithmetic as the output cast) before it is applied.
"""

import contextlib
import functools
import os
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede triton.jit below; see the module docstring

try:
    import triton
    import triton.language as tl

    TRITON_IMPORT_ERROR: str | None = None
except ImportError as exc:  # no wheel for this platform: the module still imports, available() says why
    from types import SimpleNamespace

    TRITON_IMPORT_ERROR = f"triton is not importable ({exc}); install it with pip install 'triton>=3.3'"
    triton = SimpleNamespace(jit=lambda fn: fn, __version__=None)  # kernels below are then never launched
    tl = SimpleNamespace(constexpr=object)

from alibi.errors import InputError
from alibi.exact.emulator import VLLM_TRITON, EpilogueModel
from alibi.kernels.base import Kernel

# --- block sizes --------------------------------------------------------------------------------

@dataclass(frozen=True)
class BlockConfig:
    """One launch's tiling: the block shape, grouped program order, and (GPU only) warps and stages."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 1            # programs along M that share a column of W tiles (L2 reuse)
    num_warps: int | None = None  # None: Triton's default
    num_stages: int | None = None


# vLLM's tuned tiles for Hopper (vllm/model_executor/layers/quantization/compressed_tensors/
# triton_scaled_mm.py, `_NVIDIA_TUNED_TILES[(9, 0)]`), keyed by (M bucket, N < 8192).
_HOPPER_TILES: dict[tuple[int, bool], BlockConfig] = {
    (32, True): BlockConfig(64, 64, 256, 8, 4, 5),
    (32, False): BlockConfig(64, 64, 128, 8, 4, 5),
    (64, True): BlockConfig(64, 64, 256, 8, 4, 5),
    (64, False): BlockConfig(64, 64, 128, 8, 4, 5),
    (128, True): BlockConfig(64, 128, 256, 8, 8, 4),
    (128, False): BlockConfig(128, 128, 128, 8, 8, 5),
    (256, True): BlockConfig(64, 64, 128, 8, 4, 4),
    (256, False): BlockConfig(128, 64, 128, 8, 4, 4),
    (512, True): BlockConfig(64, 128, 128, 8, 8, 3),
    (512, False): BlockConfig(128, 128, 128, 8, 8, 3),
    (1024, True): BlockConfig(128, 128, 128, 8, 8, 3),
    (1024, False): BlockConfig(128, 128, 128, 8, 8, 3),
}


def block_config(M: int, N: int, capability: tuple[int, int] | None) -> BlockConfig:
    """The tiling for an M×N output, chosen by M as vLLM does (small M → small BLOCK_M).

    On sm90 vLLM's tuned Hopper table; elsewhere (other GPUs, the interpreter) vLLM's default
    heuristic, with BLOCK_M = 16 for M ≤ 16 so that decode-sized calls do not compute 64 masked
    rows (under the interpreter that waste is real time). `capability` is None for the interpreter.
    """
    if capability == (9, 0):
        m_bucket = min(max(32, triton.next_power_of_2(M)), 1024)
        return _HOPPER_TILES[(m_bucket, N < 8192)]
    if M <= 16:
        return BlockConfig(16, 64, 256)
    if M <= 64:
        return BlockConfig(64, 64 if N < 8192 or M > 32 else 128, 256)
    if M <= 128:
        return BlockConfig(64, 128, 128)
    return BlockConfig(128, 128, 128)


# K elements per int32 partial of the FP32_ACC fault variant (one fp32 addition per partial).
FAULT_PART_K: tl.constexpr = tl.constexpr(128) if TRITON_IMPORT_ERROR is None else 128


# --- the epilogue's rounding steps (shared with triton_fp8.py) ----------------------------------

@triton.jit
def round_to_output_bits(y, OUT_BF16: tl.constexpr, TRUNCATE: tl.constexpr):
    """fp32 `y` → int16 bit pattern of the output dtype, nearest-even (toward zero if TRUNCATE)."""
    if OUT_BF16:
        u = y.to(tl.uint32, bitcast=True)
        if TRUNCATE:
            r = u >> 16
        else:
            # Adds just under half an ulp, plus one when the kept lsb is odd (ties to even); a carry
            # out of the mantissa bumps the exponent, and the largest finite values round to inf.
            r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        is_nan = (u & 0x7FFFFFFF) > 0x7F800000
        r = tl.where(is_nan, (u >> 16) | 0x0040, r)  # quiet, sign and top payload kept
        return r.to(tl.uint16).to(tl.int16, bitcast=True)
    else:
        h = y.to(tl.float16)  # RNE on the GPU and under the interpreter (numpy astype)
        bits = h.to(tl.int16, bitcast=True)
        if TRUNCATE:
            # Round toward zero = round to nearest, then step one ulp back toward zero when that
            # went away from zero; fp16 is sign-magnitude, so the step is `bits - 1` for either
            # sign, and an overflow to inf steps back to the largest finite value, as RTZ requires.
            away = tl.abs(h.to(tl.float32)) > tl.abs(y)
            bits = tl.where(away, bits - 1, bits).to(tl.int16)
        return bits


@triton.jit
def output_bits_to_fp32(bits, OUT_BF16: tl.constexpr):
    """The exact fp32 value of an int16 output bit pattern (bf16 widened by a shift: exact everywhere)."""
    if OUT_BF16:
        return (bits.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        return bits.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def bf16_rounded_fp32(x):
    """The fp32 value of `x` rounded to bfloat16, nearest even (finite positive scales: no NaN case)."""
    u = x.to(tl.uint32, bitcast=True)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).to(tl.float32, bitcast=True)


@triton.jit
def program_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's output tile: row, column and K offsets (int64) and the row and column masks.

    Grouped program order (vLLM's): GROUP_M row blocks walk a column of W tiles together. Offsets are
    int64 because M·K and N·K of real layers overflow int32 element offsets. `(x + b - 1) // b`, not
    `tl.cdiv`: see "triton's own jit functions" in the module docstring.
    """
    pid = tl.program_id(axis=0)
    num_pid_m = (M + BLOCK_M - 1) // BLOCK_M
    num_pid_n = (N + BLOCK_N - 1) // BLOCK_N
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K).to(tl.int64)
    return offs_m, offs_n, offs_k, offs_m < M, offs_n < N


@triton.jit
def exact_main_loop(a_ptr, w_ptr, offs_m, offs_n, offs_k, mask_m, mask_n, K,
                    stride_am, stride_ak, stride_wn, stride_wk,
                    ACC_DTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Σ_k A[m, k]·W[n, k] over the whole of K in one `ACC_DTYPE` accumulator (int32 for int8: exact).

    Masked-off elements load as 0 and add nothing: the K tail and the M/N edges are exact. (`0.0`,
    not `0`: Triton casts a float to int8 or fp8, but has no int → fp8 cast.)
    """
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak   # [BLOCK_M, BLOCK_K]
    w_ptrs = w_ptr + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn   # [BLOCK_K, BLOCK_N] = Wᵀ tile
    acc = tl.full((BLOCK_M, BLOCK_N), 0, dtype=ACC_DTYPE)
    for k in range((K + BLOCK_K - 1) // BLOCK_K):
        mask_k = offs_k < K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(a, w, acc, out_dtype=ACC_DTYPE)
        a_ptrs += BLOCK_K * stride_ak
        w_ptrs += BLOCK_K * stride_wk
    return acc


@triton.jit
def int32_partials_summed_in_fp32(a_ptr, w_ptr, offs_m, offs_n, offs_k, mask_m, mask_n, K, part_k,
                                  stride_am, stride_ak, stride_wn, stride_wk,
                                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Σ over consecutive K ranges of `part_k` elements of RN32(exact int32 partial), summed in fp32 in order.

    Fault variants only (FP32_ACC, SPLIT_K): a partial of ≤ 131,071 products is exact in int32; its
    conversion and every fp32 addition round to nearest even on both back ends.
    """
    accf = tl.full((BLOCK_M, BLOCK_N), 0.0, dtype=tl.float32)
    for p in range((K + part_k - 1) // part_k):
        k0 = p * part_k
        part = tl.full((BLOCK_M, BLOCK_N), 0, dtype=tl.int32)
        for kb in range((part_k + BLOCK_K - 1) // BLOCK_K):
            kk = k0 + kb * BLOCK_K + offs_k
            mask_k = (kk < k0 + part_k) & (kk < K)
            a = tl.load(a_ptr + offs_m[:, None] * stride_am + kk[None, :] * stride_ak,
                        mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            w = tl.load(w_ptr + kk[:, None] * stride_wk + offs_n[None, :] * stride_wn,
                        mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            part = tl.dot(a, w, part, out_dtype=tl.int32)
        accf += part.to(tl.float32)
    return accf


# --- the kernel ---------------------------------------------------------------------------------

@triton.jit
def scaled_mm_kernel(
    a_ptr, w_ptr,                # operands: A [M,K], W [N,K], both int8 (or both fp8 e4m3)
    s_a_ptr, s_w_ptr, bias_ptr,  # fp32 scales; fp32 bias (widened on the host), unused without HAS_BIAS
    out_ptr,                     # int16 view of the [M,N] output, or int32/fp32 [M,N] when STORE_ACC
    M, N, K,
    stride_am, stride_ak, stride_wn, stride_wk, stride_om, stride_on,
    stride_sa, stride_sw,        # 0 for a per-tensor ([1]) scale, else the scale's element stride
    ACC_DTYPE: tl.constexpr,     # tl.int32 for int8 operands, tl.float32 for fp8
    HAS_BIAS: tl.constexpr,
    OUT_BF16: tl.constexpr,      # bfloat16 output (else float16)
    TRUNCATE: tl.constexpr,      # the faulty mutant: round toward zero in every output conversion
    STORE_ACC: tl.constexpr,     # store the raw accumulator and skip the epilogue
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    offs_m, offs_n, offs_k, mask_m, mask_n = program_tile(M, N, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)

    acc = exact_main_loop(a_ptr, w_ptr, offs_m, offs_n, offs_k, mask_m, mask_n, K,
                          stride_am, stride_ak, stride_wn, stride_wk, ACC_DTYPE, BLOCK_M, BLOCK_N, BLOCK_K)

    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    out_mask = mask_m[:, None] & mask_n[None, :]
    if STORE_ACC:
        tl.store(out_ptrs, acc, mask=out_mask)
    else:
        s_a = tl.load(s_a_ptr + offs_m * stride_sa, mask=mask_m, other=1.0)
        s_w = tl.load(s_w_ptr + offs_n * stride_sw, mask=mask_n, other=1.0)
        y = s_a[:, None] * acc.to(tl.float32)   # RN32(s_a · float(acc)): activation scale first
        y = s_w[None, :] * y                    # RN32(s_w · ·)
        c = round_to_output_bits(y, OUT_BF16, TRUNCATE)
        if HAS_BIAS:
            bias = tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0)
            c = round_to_output_bits(output_bits_to_fp32(c, OUT_BF16) + bias[None, :], OUT_BF16, TRUNCATE)
        tl.store(out_ptrs, c, mask=out_mask)


@triton.jit
def faulty_scaled_mm_kernel(
    a_ptr, w_ptr,                # operands: A [M,K], W [N,K], both int8 (or both fp8 e4m3)
    s_a_ptr, s_w_ptr, bias_ptr,  # fp32 scales; fp32 bias (widened on the host), unused without HAS_BIAS
    out_ptr,                     # int16 view of the [M,N] output, or int32/fp32 [M,N] when STORE_ACC
    M, N, K,
    stride_am, stride_ak, stride_wn, stride_wk, stride_om, stride_on,
    stride_sa, stride_sw,        # 0 for a per-tensor ([1]) scale, else the scale's element stride
    ACC_DTYPE: tl.constexpr,     # tl.int32 for int8 operands, tl.float32 for fp8
    HAS_BIAS: tl.constexpr,
    OUT_BF16: tl.constexpr,      # bfloat16 output (else float16)
    TRUNCATE: tl.constexpr,      # the faulty mutant: round toward zero in every output conversion
    STORE_ACC: tl.constexpr,     # store the raw accumulator and skip the epilogue
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    FP32_ACC: tl.constexpr,    # fp32 accumulator (see the module docstring)
    SPLIT_K: tl.constexpr,     # split-K with fp32 partial sums when > 1
    SCALE_BF16: tl.constexpr,  # the weight scale rounded to bfloat16
):
    """`scaled_mm_kernel` with the native fault switches (positive controls; int8 operands only).

    A separate kernel, so that the correct one stays exactly as it is (its signature is pinned by a
    compile test); with every switch off this computes what `scaled_mm_kernel` computes.
    """
    offs_m, offs_n, offs_k, mask_m, mask_n = program_tile(M, N, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)

    if FP32_ACC or SPLIT_K > 1:
        if FP32_ACC:
            part_k = FAULT_PART_K
        else:
            part_k = (K + SPLIT_K - 1) // SPLIT_K
        accf = int32_partials_summed_in_fp32(a_ptr, w_ptr, offs_m, offs_n, offs_k, mask_m, mask_n, K, part_k,
                                             stride_am, stride_ak, stride_wn, stride_wk, BLOCK_M, BLOCK_N, BLOCK_K)
        acc = accf.to(tl.int32)  # exposed accumulator: integer-valued fp32 below 2^31, converted exactly
    else:
        acc = exact_main_loop(a_ptr, w_ptr, offs_m, offs_n, offs_k, mask_m, mask_n, K,
                              stride_am, stride_ak, stride_wn, stride_wk, ACC_DTYPE, BLOCK_M, BLOCK_N, BLOCK_K)

    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    out_mask = mask_m[:, None] & mask_n[None, :]
    if STORE_ACC:
        tl.store(out_ptrs, acc, mask=out_mask)
    else:
        s_a = tl.load(s_a_ptr + offs_m * stride_sa, mask=mask_m, other=1.0)
        s_w = tl.load(s_w_ptr + offs_n * stride_sw, mask=mask_n, other=1.0)
        if SCALE_BF16:
            s_w = bf16_rounded_fp32(s_w)
        if FP32_ACC or SPLIT_K > 1:
            y = s_a[:, None] * accf
        else:
            y = s_a[:, None] * acc.to(tl.float32)   # RN32(s_a · float(acc)): activation scale first
        y = s_w[None, :] * y                    # RN32(s_w · ·)
        c = round_to_output_bits(y, OUT_BF16, TRUNCATE)
        if HAS_BIAS:
            bias = tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0)
            c = round_to_output_bits(output_bits_to_fp32(c, OUT_BF16) + bias[None, :], OUT_BF16, TRUNCATE)
        tl.store(out_ptrs, c, mask=out_mask)


# --- the selectable epilogue: vLLM's CUTLASS order, `w_then_a + fma` -----------------------------

@triton.jit
def fused_multiply_add_f32(x, y, z):
    """RN32(x·y + z) with one rounding, for fp32 `x`, `y`, `z`, identically on the GPU and the interpreter.

    Not `tl.fma`: the interpreter evaluates it as numpy `x * y + z` in fp32, two roundings (triton
    3.7, `interpreter.create_fma`), so it is no FMA there. Instead, in fp64: `p = x·y` is exact
    (24 + 24 ≤ 53 significant bits); `s = RN64(p + z)` and its error `e` (TwoSum, exact) give the
    exact sum `s + e`; when `e ≠ 0` and `s` has an even last bit, `s` steps one fp64 ulp toward `e`,
    which is `s` rounded to odd. Rounding to odd in 53 bits, then to nearest even in fp32's 24
    (fewer for subnormals), equals one rounding to nearest even (Boldo & Melquiond 2008: needs
    53 ≥ 24 + 2), and the final fp64 → fp32 conversion is RNE on both back ends (numpy `astype`,
    `cvt.rn.f32.f64`). fp64 cannot overflow or go subnormal here, so no step is lost; a
    contraction of `p` into an fp64 FMA by the GPU compiler changes nothing because `p` is exact.
    Inf/NaN inputs skip the correction (their `e` is NaN) and keep IEEE's inf/NaN result.
    """
    xd = x.to(tl.float64)
    yd = y.to(tl.float64)
    zd = z.to(tl.float64)
    p = xd * yd
    s = p + zd
    bv = s - p
    err = (p - (s - bv)) + (zd - bv)
    sb = s.to(tl.int64, bitcast=True)
    eb = err.to(tl.int64, bitcast=True)
    exp_mask = 0x7FF0000000000000
    finite = ((sb & exp_mask) != exp_mask) & ((eb & exp_mask) != exp_mask)
    sticky = (err != 0.0) & finite & ((sb & 1) == 0)
    beyond = (sb < 0) == (eb < 0)  # the exact sum lies farther from zero than s
    sb = tl.where(sticky, tl.where(beyond, sb + 1, sb - 1), sb)
    return sb.to(tl.float64, bitcast=True).to(tl.float32)


@triton.jit
def w_then_a_fma_scaled_mm_kernel(
    a_ptr, w_ptr, s_a_ptr, s_w_ptr, bias_ptr, out_ptr,
    M, N, K,
    stride_am, stride_ak, stride_wn, stride_wk, stride_om, stride_on,
    stride_sa, stride_sw,
    ACC_DTYPE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    OUT_BF16: tl.constexpr,
    TRUNCATE: tl.constexpr,
    STORE_ACC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """`scaled_mm_kernel` (same arguments, same tiling and int32 main loop) with vLLM's CUTLASS epilogue.

    t = RN32(s_w · float(acc)); y = RN32(s_a · t + bias) in one rounding with a bias, else
    RN32(s_a · t); then the same nearest-even output cast. A separate kernel so that the `triton`
    kernel's code is untouched.
    """
    offs_m, offs_n, offs_k, mask_m, mask_n = program_tile(M, N, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)

    acc = exact_main_loop(a_ptr, w_ptr, offs_m, offs_n, offs_k, mask_m, mask_n, K,
                          stride_am, stride_ak, stride_wn, stride_wk, ACC_DTYPE, BLOCK_M, BLOCK_N, BLOCK_K)

    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    out_mask = mask_m[:, None] & mask_n[None, :]
    if STORE_ACC:
        tl.store(out_ptrs, acc, mask=out_mask)
    else:
        s_a = tl.load(s_a_ptr + offs_m * stride_sa, mask=mask_m, other=1.0)
        s_w = tl.load(s_w_ptr + offs_n * stride_sw, mask=mask_n, other=1.0)
        t = s_w[None, :] * acc.to(tl.float32)   # RN32(s_w · float(acc)): weight scale first
        if HAS_BIAS:
            bias = tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0)
            y = fused_multiply_add_f32(s_a[:, None], t, bias[None, :])  # one rounding (broadcast in fp64)
        else:
            y = s_a[:, None] * t                 # RN32(s_a · t)
        tl.store(out_ptrs, round_to_output_bits(y, OUT_BF16, TRUNCATE), mask=out_mask)


# --- the launcher -------------------------------------------------------------------------------

# The epilogues `launch` can select, each with its kernel (same arguments, same main loop).
W_THEN_A_FMA = EpilogueModel("w_then_a", "fma")
EPILOGUE_KERNELS = {VLLM_TRITON: scaled_mm_kernel, W_THEN_A_FMA: w_then_a_fma_scaled_mm_kernel}


def interpreted() -> bool:
    """True when this process runs the kernel under the Triton interpreter (decided at import)."""
    return type(scaled_mm_kernel).__name__ == "InterpretedFunction"


def _capability(device: torch.device) -> tuple[int, int] | None:
    return None if interpreted() else _device_capability(device.index if device.index is not None
                                                         else torch.cuda.current_device())


@functools.cache
def _device_capability(index: int) -> tuple[int, int]:
    """A GPU's compute capability, asked once per device (it is asked before every launch)."""
    return tuple(torch.cuda.get_device_capability(index))


def _scale_stride(scale: torch.Tensor, rows: int, label: str) -> int:
    if scale.dtype != torch.float32 or scale.dim() != 1 or scale.numel() not in (1, rows):
        raise InputError(f"{label} must be a float32 vector of length {rows} or 1, "
                         f"got {scale.dtype} of shape {list(scale.shape)}")
    return 0 if scale.numel() == 1 else scale.stride(0)


def launch(a_q: torch.Tensor, s_a: torch.Tensor | None, w_q: torch.Tensor, s_w: torch.Tensor | None,
           bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16, *,
           truncate: bool = False, store_acc: bool = False, fp32_acc: bool = False, split_k: int = 1,
           scale_bf16: bool = False, epilogue: EpilogueModel = VLLM_TRITON) -> tuple[torch.Tensor, BlockConfig]:
    """Run `scaled_mm_kernel` on A [M,K] and W [N,K] (int8, or fp8 e4m3); returns (result, tiling).

    The result is the `out_dtype` [M,N] output, or with `store_acc` the raw accumulator (int32 for
    int8 operands, fp32 for fp8), for which the scales, bias and out_dtype are ignored.
    `fp32_acc`, `split_k` > 1 and `scale_bf16` select the native fault variants (int8 operands only).
    `epilogue` selects the epilogue: `a_then_w+add_after_cast` (vLLM's Triton, `scaled_mm_kernel`,
    the default) or `w_then_a+fma` (vLLM's CUTLASS, `w_then_a_fma_scaled_mm_kernel`; int8 only).
    """
    if epilogue not in EPILOGUE_KERNELS:
        raise InputError(f"the triton kernel has no epilogue {epilogue.name!r}; choose one of "
                         f"{', '.join(m.name for m in EPILOGUE_KERNELS)}")
    if a_q.dim() != 2 or w_q.dim() != 2 or a_q.shape[1] != w_q.shape[1]:
        raise InputError(f"operands must be A [M,K] and W [N,K]; got {list(a_q.shape)} and {list(w_q.shape)}")
    if a_q.dtype != w_q.dtype or a_q.dtype not in (torch.int8, torch.float8_e4m3fn):
        raise InputError(f"operands must both be int8 or both float8_e4m3fn; got {a_q.dtype} and {w_q.dtype}")
    if out_dtype not in (torch.bfloat16, torch.float16):
        raise InputError(f"out_dtype must be bfloat16 or float16, got {out_dtype}")
    M, K = a_q.shape
    N = w_q.shape[0]
    is_int8 = a_q.dtype == torch.int8
    if (fp32_acc or split_k != 1 or scale_bf16) and (not is_int8 or split_k < 1 or (fp32_acc and split_k != 1)):
        raise InputError(f"fault variants need int8 operands and one of fp32_acc or split_k ≥ 2; got "
                         f"{a_q.dtype}, fp32_acc={fp32_acc}, split_k={split_k}")
    if epilogue != VLLM_TRITON and (not is_int8 or truncate or fp32_acc or split_k != 1 or scale_bf16):
        raise InputError(f"epilogue {epilogue.name} is for int8 operands without fault switches; got {a_q.dtype}")
    device = a_q.device
    cfg = block_config(M, N, _capability(device))
    if store_acc:
        out = torch.empty((M, N), dtype=torch.int32 if is_int8 else torch.float32, device=device)
        store = out
        s_a = s_w = bias = None
    else:
        out = torch.empty((M, N), dtype=out_dtype, device=device)
        store = out.view(torch.int16)  # the kernel writes bit patterns (see round_to_output_bits)
    stride_sa = _scale_stride(s_a, M, "s_a") if s_a is not None else 0
    stride_sw = _scale_stride(s_w, N, "s_w") if s_w is not None else 0
    if bias is not None:
        if tuple(bias.shape) != (N,):
            raise InputError(f"bias must have shape [{N}], got {list(bias.shape)}")
        bias = bias.to(torch.float32).contiguous()  # exact widening; see the module docstring
    placeholder = store  # a valid pointer for arguments the constexpr switches leave unread
    # Any fault switch selects `faulty_scaled_mm_kernel`; without one the correct kernel launches as before.
    faults = {**({"FP32_ACC": True} if fp32_acc else {}), **({"SPLIT_K": split_k} if split_k != 1 else {}),
              **({"SCALE_BF16": True} if scale_bf16 else {})}
    grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n),)
    launch_opts = {k: v for k, v in (("num_warps", cfg.num_warps), ("num_stages", cfg.num_stages)) if v}
    # Under the interpreter numpy warns when a multiply or cast overflows to inf; inf is the IEEE
    # result the GPU gives silently, so those warnings are muted for the launch.
    quiet = np.errstate(over="ignore", invalid="ignore") if interpreted() else contextlib.nullcontext()
    kernel = faulty_scaled_mm_kernel if faults else EPILOGUE_KERNELS[epilogue]
    if faults:
        faults = {"FP32_ACC": False, "SPLIT_K": 1, "SCALE_BF16": False, **faults}
    with quiet:
        kernel[grid](
            a_q, w_q,
            s_a if s_a is not None else placeholder, s_w if s_w is not None else placeholder,
            bias if bias is not None else placeholder,
            store, M, N, K,
            a_q.stride(0), a_q.stride(1), w_q.stride(0), w_q.stride(1), store.stride(0), store.stride(1),
            stride_sa, stride_sw,
            ACC_DTYPE=tl.int32 if is_int8 else tl.float32,
            HAS_BIAS=bias is not None, OUT_BF16=out_dtype == torch.bfloat16,
            TRUNCATE=truncate, STORE_ACC=store_acc,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
            **faults, **launch_opts,
        )
    return out, cfg


# --- the kernels the registry hands out ---------------------------------------------------------

class TritonScaledMmKernel(Kernel):
    """`scaled_mm_kernel` behind the Kernel interface; native on CUDA, else under the interpreter."""

    operand_dtype: torch.dtype = torch.int8
    epilogue = VLLM_TRITON
    truncate = False  # the mutant's switch

    def __init__(self) -> None:
        self.device = "cpu" if TRITON_IMPORT_ERROR or interpreted() else "cuda"
        self.last_config: BlockConfig | None = None

    def backend(self) -> str:
        return "interpreter" if interpreted() else "native"

    def available(self) -> tuple[bool, str]:
        if TRITON_IMPORT_ERROR:
            return False, TRITON_IMPORT_ERROR
        if interpreted():
            return True, (f"Triton interpreter (TRITON_INTERPRET=1) on the CPU, triton {triton.__version__}: "
                          "the real kernel code, slowly (keep shapes small)")
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) < (7, 5):
            return False, f"int8 tl.dot needs compute capability 7.5 or newer; this GPU is sm_{major}{minor}"
        return True, f"native Triton {triton.__version__} on {torch.cuda.get_device_name()} (sm_{major}{minor})"

    def _check_operands(self, a_q: torch.Tensor, w_q: torch.Tensor) -> None:
        if a_q.dtype != self.operand_dtype or w_q.dtype != self.operand_dtype:
            raise InputError(f"kernel {self.name!r} takes {self.operand_dtype} operands, "
                             f"got {a_q.dtype} and {w_q.dtype}")

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        self._check_operands(a_q, w_q)
        out, self.last_config = launch(a_q, s_a, w_q, s_w, bias, out_dtype, truncate=self.truncate)
        return out

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor | None:
        """The kernel's own accumulator, from a launch that stores it instead of running the epilogue."""
        self._check_operands(a_q, w_q)
        acc, _ = launch(a_q, None, w_q, None, store_acc=True)
        return acc

    def evidence(self) -> dict[str, Any]:
        ev = super().evidence()
        ev.update(backend=self.backend(), triton=triton.__version__,
                  block_config=asdict(self.last_config) if self.last_config else None)
        return ev


class TritonInt8Kernel(TritonScaledMmKernel):
    """`triton`: int8 operands, exact int32 accumulator, vLLM's Triton epilogue."""

    replayable = True  # every launch a function of the operands (alibi.conform.launches)

    name = "triton"
    formats = ("int8",)
    description = "Triton int8 scaled-mm (int32 tl.dot, vLLM Triton epilogue: a_then_w, bias after the cast)"


class TritonInt8WThenAFmaKernel(TritonInt8Kernel):
    """`triton:w_then_a+fma`: the `triton` kernel with vLLM's CUTLASS epilogue, for bitwise agreement with it.

    Same tiling and exact int32 accumulator; the epilogue is `w_then_a_fma_scaled_mm_kernel`'s
    (weight scale first, bias fused into the activation-scale multiply with one rounding).
    """

    replayable = True  # every launch a function of the operands (alibi.conform.launches)

    name = "triton:w_then_a+fma"
    epilogue = W_THEN_A_FMA
    description = ("Triton int8 scaled-mm with vLLM's CUTLASS epilogue (int32 tl.dot, w_then_a, "
                   "bias by an exact fused multiply-add)")

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        self._check_operands(a_q, w_q)
        out, self.last_config = launch(a_q, s_a, w_q, s_w, bias, out_dtype, epilogue=self.epilogue)
        return out


class TruncatingTritonKernel(TritonInt8Kernel):
    """`mutant:truncate-cast:triton`: a positive control that rounds toward zero but claims a_then_w."""

    name = "mutant:truncate-cast:triton"
    description = "deliberately faulty: the triton kernel with a round-toward-zero output cast (positive control)"
    truncate = True
