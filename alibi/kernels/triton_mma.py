"""The fp8 MMA instrument: raw tensor-core chains `C + Σ a·b` on crafted operands, for `alibi probe fp8-mma`.

What it computes: for fp8 `A [M, K]`, `B [N, K]` (e4m3 or e5m2, the two may differ) and an fp32 `C [M, N]`,

    acc[m, n] = C[m, n];  for each BLOCK_K = 32 slice of K in order:  acc = tl.dot(a_slice, b_sliceᵀ, acc)

and stores `acc` (fp32). One `tl.dot` on a 32-wide K slice is one MMA step of k = 32, so the stored value is the
hardware's chain of steps, started from `C`. `instruction="wgmma"` launches 64-row blocks on 4 warps, which Triton
compiles to sm_90's `wgmma` (the instruction CUTLASS's sm90 FP8 mainloops issue); `instruction="mma"` launches
16-row blocks on one warp, which it compiles to `mma.sync` (`ptx_instructions` reads the compiled PTX, so a
result never claims an instruction it did not run).

GPU only: the Triton interpreter computes fp8 dots in numpy float32, which says nothing about a tensor core.
"""

from __future__ import annotations

import re

import torch

from alibi.errors import InputError, KernelUnavailable
from alibi.kernels.triton_int8 import TRITON_IMPORT_ERROR, interpreted, tl, triton

INSTRUCTIONS = {"wgmma": (64, 4), "mma": (16, 1)}  # BLOCK_M and warps that select each on sm_90
BLOCK_N = 16
STEP_K = 32


@triton.jit
def mma_chain_kernel(a_ptr, b_ptr, c_ptr, out_ptr, M, N, K,
                     stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    acc = tl.load(c_ptrs, mask=mask_m[:, None] & mask_n[None, :], other=0.0)
    for k0 in range(0, K, BLOCK_K):  # K is a multiple of BLOCK_K: no masked K tail
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + (k0 + offs_k)[None, :] * stride_ak,
                    mask=mask_m[:, None], other=0.0)
        b = tl.load(b_ptr + (k0 + offs_k)[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=mask_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], acc, mask=mask_m[:, None] & mask_n[None, :])


def require_gpu() -> None:
    if TRITON_IMPORT_ERROR:
        raise KernelUnavailable(TRITON_IMPORT_ERROR)
    if interpreted() or not torch.cuda.is_available():
        raise KernelUnavailable("the fp8 MMA probe measures a tensor core: it needs a CUDA GPU (sm_89 or newer); "
                                "the Triton interpreter computes fp8 dots in numpy float32")


def mma_chain(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, instruction: str = "wgmma") -> tuple[torch.Tensor, str]:
    """`c + a·bᵀ` chained over K in steps of 32 on the tensor core (module docstring); returns (fp32 [M, N], the
    compiled PTX's MMA instructions, e.g. `wgmma.mma_async...e4m3.e4m3`)."""
    require_gpu()
    if instruction not in INSTRUCTIONS:
        raise InputError(f"instruction {instruction!r}: choose one of {', '.join(INSTRUCTIONS)}")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1] or a.shape[1] % STEP_K:
        raise InputError(f"mma_chain: A [M,K] and B [N,K] with K a multiple of {STEP_K}; got {list(a.shape)}, "
                         f"{list(b.shape)}")
    M, K = a.shape
    N = b.shape[0]
    if tuple(c.shape) != (M, N) or c.dtype != torch.float32:
        raise InputError(f"mma_chain: C must be float32 [{M}, {N}], got {c.dtype}{list(c.shape)}")
    block_m, warps = INSTRUCTIONS[instruction]
    dev = torch.device("cuda")
    a, b, c = a.to(dev).contiguous(), b.to(dev).contiguous(), c.to(dev).contiguous()
    out = torch.empty((M, N), dtype=torch.float32, device=dev)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, BLOCK_N))
    compiled = mma_chain_kernel[grid](a, b, c, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                      c.stride(0), c.stride(1), BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=STEP_K,
                                      num_warps=warps, num_stages=1)
    torch.cuda.synchronize()
    return out, ptx_instructions(compiled.asm.get("ptx", ""))


def ptx_instructions(ptx: str) -> str:
    """The distinct MMA instructions of a PTX listing, joined by ', ' (empty when none)."""
    found = sorted(set(re.findall(r"\b((?:wgmma\.mma_async|mma\.sync)[.\w]*)", ptx)))
    return ", ".join(found)


__all__ = ["INSTRUCTIONS", "mma_chain", "ptx_instructions", "require_gpu"]
