"""FP8 (e4m3) kernels: `cutlass-fp8` and the two `torch._scaled_mm` paths, each with a declared epilogue.

An FP8 GEMM is the contrast case of science.md §2: every e4m3 product is exact (two 4-bit
significands give at most 8 bits; e4m3's exponent range fits fp32's), but the fp32 accumulator
rounds at every addition in an order set by the instruction path. So a kernel's output can only be
held to its epilogue model applied to *its own* accumulator, and the accumulator itself is compared
with an exact reference as a measurement, not a pass/fail fact. (A float64 GEMM of the dequantized
values is exact for K ≤ 65536: every product is a multiple of 2⁻¹⁸ of magnitude ≤ 448² < 2¹⁸, so
sums stay on a grid of 2⁻¹⁸ below 2³⁴ — 52 bits — which float64 holds exactly.)

Kernels (operands float8_e4m3fn `A [M,K]`, `W [N,K]`; scales fp32 `s_a` [M] or [1], `s_w` [N] or [1]):

* `cutlass-fp8` — CUTLASS 3 on sm90 (sm_90a), vLLM's FP8 "fast accumulation" schedules and the
  very same epilogue tree as the int8 `cutlass` kernel: `w_then_a+fma`. Its fp32 accumulator is
  exposed by a kernel with the same mainloop configuration (same summation order). Per-tensor
  scales are broadcast to vectors before the call (the same value in every lane: exact). Unlike
  vLLM, it never swaps A and B for small M, so the scale order does not flip with M.
* `cublaslt-fp8` — `torch._scaled_mm` with row-wise scales (`scale_a [M,1]`, `scale_b [1,N]`);
  a per-tensor scale is broadcast to a vector. Declared epilogue: `w_then_a+add_before_cast`.
* `cublaslt-fp8-tensorwise` — `torch._scaled_mm` with one scale per operand (cuBLASLt's
  `D = scale_a·scale_b·acc` scaling); both scales must be [1]. Declared epilogue:
  `product_first+add_before_cast`.

The bias never goes into `torch._scaled_mm`. Measured on an H200 (torch 2.11, CUDA 13): row-wise
without a bias runs cuBLASLt, which scales by s_w first, but passing a bias switches torch to
another kernel that scales by s_a first — one name, two epilogues. So with a bias these kernels
ask `torch._scaled_mm` for the fp32 result (the same scaled value, before any cast) and add the
bias in a separate fp32 torch op before the cast: one scale order per kernel, the bias in its own
rounding (`add_before_cast`). The declared models are verified bit for bit on probe operands that
tell every model apart (tests/kernels/test_fp8_gpu.py).

Neither `torch._scaled_mm` path exposes its accumulator (a call with fp32 output may pick another
cuBLASLt algorithm, i.e. another summation order), so `accumulator()` returns None for them; their
declared epilogues are verified on operands whose every partial sum is exact (small integers), where
the accumulator is known without asking the kernel.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from alibi.errors import InputError
from alibi.exact.emulator import EpilogueModel
from alibi.exact.fp8_mma import FAST_ACCUM, PROMOTE_128
from alibi.kernels import nvcc
from alibi.kernels.base import Kernel
from alibi.kernels.cutlass import (
    CutlassKernel,
    CutlassLibrary,
    check_operands,
    device_arch,
    scale_vector,
    toolchain_reason,
)

FP8 = torch.float8_e4m3fn
FP8_SM90_SOURCES = ("sm90_fp8_api.cu", "sm90_fp8_bf16.cu", "sm90_fp8_f16.cu", "sm90_fp8_acc.cu")

CUTLASS_FP8_EPILOGUE = EpilogueModel("w_then_a", "fma")
# Where cuBLASLt's schedule was read by probe (analysis/results/h100/fp8/983cf50 and 19098f8): the library version
# (cublasLtGetVersion), and the shapes (M, N, K) at which it promoted every 128 k. Another version may choose
# otherwise: the kernel's evidence names both versions, and `alibi identify cublaslt-fp8 --shape MxNxK` reads it.
CUBLASLT_MEASURED = {"cublaslt_version": 130100, "gpu": "NVIDIA H100 80GB HBM3", "schedule": "promote-128",
                     "shapes": [[256, 576, 576], [256, 192, 576], [256, 1536, 576], [256, 576, 1536], [32, 576, 1536],
                                [1, 576, 1536], [16, 256, 8192], [64, 128, 16384], [128, 1024, 4096],
                                [32, 576, 576], [32, 192, 576], [32, 1536, 576], [16, 1536, 576], [64, 128, 4096]],
                     "result": "analysis/results/h100/fp8/983cf50 (these 14 shapes); analysis/results/h100/fp8/19098f8 "
                               "(9 of them again, and cublaslt-fp8-tensorwise at the same 9)"}


def cublaslt_version() -> int | None:
    """The loaded cuBLASLt's version number (`cublasLtGetVersion`, e.g. 130100 for 13.1.0), None when none loads."""
    for lib in ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"):
        try:
            return int(ctypes.CDLL(lib).cublasLtGetVersion())
        except OSError:
            continue
    return None


# torch._scaled_mm's declared epilogues (see the module docstring; verified on the GPU by
# tests/kernels/test_fp8_gpu.py on operands that tell the models apart).
ROWWISE_EPILOGUE = EpilogueModel("w_then_a", "add_before_cast")
TENSORWISE_EPILOGUE = EpilogueModel("product_first", "add_before_cast")


def fp8_library() -> nvcc.Library:
    return nvcc.Library("alibi_cutlass_fp8_sm90", FP8_SM90_SOURCES, (nvcc.gencode_for("sm_90a"),))


class CutlassFp8Kernel(CutlassKernel):
    """`cutlass-fp8`: CUTLASS 3 e4m3 GEMM (fp32 fast accumulation), epilogue `w_then_a+fma`."""

    replayable = True  # every launch a function of the operands (alibi.conform.launches)

    name = "cutlass-fp8"
    formats = ("fp8_e4m3",)
    operand_dtype = torch.float8_e4m3fn
    epilogue = CUTLASS_FP8_EPILOGUE
    accumulation = FAST_ACCUM  # KernelTmaWarpSpecialized*FP8FastAccum: one wgmma chain over K, never promoted
    description = ("CUTLASS 3 fp8 e4m3 scaled-mm on sm90 (fp32 fast accumulation, vLLM's schedules), "
                   "epilogue w_then_a with the bias in one FMA")

    def __init__(self) -> None:
        super().__init__()
        self._library: CutlassLibrary | None = None

    def available(self) -> tuple[bool, str]:
        if not torch.cuda.is_available():
            return False, ("no CUDA GPU here (torch.cuda.is_available() is False); "
                           "'alibi kernels build cutlass-fp8 --arch sm_90a' still compiles it")
        if device_arch() != "sm_90":
            return False, (f"the CUTLASS fp8 kernel is built for sm_90a (H100/H200) only; this GPU is "
                           f"{device_arch()}")
        problem = toolchain_reason()
        if problem:
            return False, problem
        return True, (f"CUTLASS {nvcc.cutlass_version()} sm90 fp8 path on {torch.cuda.get_device_name()}, "
                      "built with nvcc at first use")

    def build(self, arch: str) -> Path:
        if arch not in ("sm_90", "sm_90a"):
            raise InputError(f"the CUTLASS fp8 kernel targets sm_90a only, not {arch}")
        return nvcc.build(fp8_library())

    def library(self) -> CutlassLibrary:
        """The loaded library (availability is checked once, when it is first loaded)."""
        if self._library is None:
            self.require_available()
            self._library = CutlassLibrary(fp8_library(), "fp8")
        return self._library


class ScaledMmFp8Kernel(Kernel):
    """`torch._scaled_mm` on e4m3 operands; `tensorwise` selects one scale per operand."""

    formats = ("fp8_e4m3",)
    device = "cuda"
    tensorwise = False
    use_fast_accum = False  # torch's default: cuBLASLt promotes the accumulator to full fp32
    # cuBLASLt documents neither its promotion interval nor its split-K choice: measured per shape by `alibi identify`
    # on an H100 (CUBLASLT_MEASURED): promotion every 128 k at every shape measured, no split-K.
    accumulation = PROMOTE_128

    def __init__(self) -> None:
        self.last_run: dict[str, Any] = {}

    def available(self) -> tuple[bool, str]:
        if not torch.cuda.is_available():
            return False, "no CUDA GPU here (torch.cuda.is_available() is False)"
        if not hasattr(torch, "_scaled_mm"):
            return False, f"torch {torch.__version__} has no torch._scaled_mm; install torch>=2.4"
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) < (8, 9):
            return False, f"fp8 GEMMs need compute capability 8.9 or newer; this GPU is sm_{major}{minor}"
        mode = "tensor-wise" if self.tensorwise else "row-wise"
        return True, f"torch._scaled_mm ({mode} scales, CUDA {torch.version.cuda}) on {torch.cuda.get_device_name()}"

    def _scales(self, s_a: torch.Tensor, s_w: torch.Tensor, M: int, N: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.tensorwise:
            if s_a.numel() != 1 or s_w.numel() != 1:
                raise InputError(f"kernel {self.name!r} takes one scale per operand (s_a and s_w of shape [1]); "
                                 f"got {list(s_a.shape)} and {list(s_w.shape)} — use 'cublaslt-fp8' for row-wise scales")
            return s_a.reshape(()).float(), s_w.reshape(()).float()
        return (scale_vector(s_a, M, "s_a").reshape(M, 1).contiguous(),
                scale_vector(s_w, N, "s_w").reshape(1, N).contiguous())

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        check_operands(self.name, a_q, w_q, FP8)
        if out_dtype not in (torch.bfloat16, torch.float16):
            raise InputError(f"kernel {self.name!r}: out_dtype must be bfloat16 or float16, got {out_dtype}")
        M, K = a_q.shape
        N = w_q.shape[0]
        scale_a, scale_b = self._scales(s_a, s_w, M, N)
        # torch._scaled_mm needs K and N multiples of 16: zero K columns and zero weight rows
        # (scale 1, bias 0) whose output columns are dropped — exact, as for the CUTLASS kernels.
        pad_k, pad_n = -K % 16, -N % 16
        a, w = a_q.contiguous(), w_q.contiguous()
        if pad_k:
            a = F.pad(a.view(torch.uint8), (0, pad_k)).view(FP8)  # the zero byte is +0.0 in e4m3
        if pad_k or pad_n:
            w = F.pad(w.view(torch.uint8), (0, pad_k, 0, pad_n)).view(FP8)
        if pad_n and not self.tensorwise:
            scale_b = F.pad(scale_b, (0, pad_n), value=1.0)
        # Without a bias: the kernel's own cast. With one: its fp32 result, then a separate
        # fp32 add and a round-to-nearest-even cast (see the module docstring for why).
        out = torch._scaled_mm(a, w.t(), scale_a=scale_a, scale_b=scale_b,
                               out_dtype=out_dtype if bias is None else torch.float32,
                               use_fast_accum=self.use_fast_accum)
        out = out[:, :N] if pad_n else out
        if bias is not None:
            out = (out + bias.to(torch.float32).reshape(1, N)).to(out_dtype)
        self.last_run = {"op": "scaled_mm", "scaling": "tensorwise" if self.tensorwise else "rowwise",
                         "pad_k": pad_k, "pad_n": pad_n, "bias": "separate fp32 add" if bias is not None else None}
        return out

    def evidence(self) -> dict[str, Any]:
        ev = super().evidence()
        ev.update(backend="torch._scaled_mm", use_fast_accum=self.use_fast_accum, last_run=dict(self.last_run),
                  cublaslt_version=cublaslt_version(), schedule_measured=CUBLASLT_MEASURED)
        return ev


class CublasLtFp8Kernel(ScaledMmFp8Kernel):
    """`cublaslt-fp8`: torch._scaled_mm with row-wise scales."""

    replayable = True  # every launch a function of the operands (alibi.conform.launches)

    name = "cublaslt-fp8"
    epilogue = ROWWISE_EPILOGUE
    description = "torch._scaled_mm e4m3, row-wise scales (scale_a [M,1], scale_b [1,N]), fp32 accumulation"


class CublasLtFp8TensorwiseKernel(ScaledMmFp8Kernel):
    """`cublaslt-fp8-tensorwise`: torch._scaled_mm with one scale per operand (cuBLASLt scaling)."""

    replayable = True  # every launch a function of the operands (alibi.conform.launches)

    name = "cublaslt-fp8-tensorwise"
    tensorwise = True
    epilogue = TENSORWISE_EPILOGUE
    description = "torch._scaled_mm e4m3 via cuBLASLt, per-tensor scales, fp32 accumulation"
