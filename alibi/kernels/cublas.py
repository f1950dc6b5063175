"""The `cublas` kernel: cuBLASLt's int8 GEMM (`torch._int_mm`) plus a declared epilogue in torch fp32 ops.

What it computes, for int8 `A [M,K]`, `W [N,K]`, fp32 `s_a [M]`, `s_w [N]`, optional bias:

    acc = torch._int_mm(A, Wᵀ)                    cuBLASLt int8 → int32: exact, order-free
    t   = acc.float() * s_w                       RN32 (int32 → fp32 is round-to-nearest-even)
    y   = t * s_a                                 RN32
    y   = y + bias.float()                        RN32, a separate rounding (no FMA)
    out = y.to(out_dtype)                         round to nearest even

i.e. the epilogue model `w_then_a+add_before_cast` — the same program as the CPU kernel
`torch-cpu`, so the two differ only in their integer instruction path. Each line is a separate
CUDA kernel launched by PyTorch: nothing fuses them (no torch.compile here), so no FMA contraction
can happen between the multiply and the bias add, and PyTorch's CUDA build keeps IEEE fp32
(subnormals included: it is not compiled with fast-math).

`torch._int_mm` constraints on CUDA, handled here exactly:
* M > 16 (cuBLASLt's int8 path): for M ≤ 16 the activation rows are zero-padded to M = 17 and the
  extra output rows dropped — each output row depends on its own activation row only.
* K and N multiples of 8: zero-padded (a zero product adds 0 to an integer sum; padded output
  columns are dropped).
The evidence of each run records the padding.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from alibi.errors import InputError
from alibi.kernels.base import TORCH_EPILOGUE, Kernel, torch_epilogue
from alibi.kernels.cutlass import check_operands, scale_vector

MIN_M = 17   # torch._int_mm on CUDA requires M > 16
MULTIPLE = 8  # ... and K, N multiples of 8


def int_mm_padded(a_q: torch.Tensor, w_q: torch.Tensor) -> tuple[torch.Tensor, dict[str, int]]:
    """The exact int32 accumulator A·Wᵀ via torch._int_mm, padding as the module docstring says."""
    M, K = a_q.shape
    N = w_q.shape[0]
    pad_m, pad_k, pad_n = max(0, MIN_M - M), -K % MULTIPLE, -N % MULTIPLE
    a = F.pad(a_q, (0, pad_k, 0, pad_m)) if (pad_m or pad_k) else a_q.contiguous()
    w = F.pad(w_q, (0, pad_k, 0, pad_n)) if (pad_k or pad_n) else w_q.contiguous()
    # w.t() is the column-major [K,N] operand cuBLASLt's int8 kernels want ("TN" layout).
    acc = torch._int_mm(a, w.t())
    if pad_m or pad_n:
        acc = acc[:M, :N]
    return acc, {"pad_m": pad_m, "pad_k": pad_k, "pad_n": pad_n}


class CublasInt8Kernel(Kernel):
    """`cublas`: torch._int_mm (cuBLASLt) + the `w_then_a+add_before_cast` epilogue in separate fp32 torch ops."""

    replayable = True  # every launch a function of the operands (alibi.conform.launches)

    name = "cublas"
    formats = ("int8",)
    device = "cuda"
    epilogue = TORCH_EPILOGUE
    description = "cuBLASLt int8 GEMM (torch._int_mm) + w_then_a epilogue in fp32 torch ops, bias added before the cast"

    def __init__(self) -> None:
        self.last_run: dict[str, Any] = {}

    def available(self) -> tuple[bool, str]:
        if not torch.cuda.is_available():
            return False, "no CUDA GPU here (torch.cuda.is_available() is False)"
        if not hasattr(torch, "_int_mm"):
            return False, f"torch {torch.__version__} has no torch._int_mm; install torch>=2.2"
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) < (7, 5):
            return False, f"cuBLASLt int8 needs compute capability 7.5 or newer; this GPU is sm_{major}{minor}"
        return True, (f"torch._int_mm (cuBLASLt, CUDA {torch.version.cuda}) on {torch.cuda.get_device_name()}, "
                      "epilogue in torch fp32 ops")

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor | None:
        check_operands(self.name, a_q, w_q, torch.int8)
        acc, padding = int_mm_padded(a_q, w_q)
        self.last_run = {"op": "accumulate", **padding}
        return acc

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        check_operands(self.name, a_q, w_q, torch.int8)
        if out_dtype not in (torch.bfloat16, torch.float16):
            raise InputError(f"kernel {self.name!r}: out_dtype must be bfloat16 or float16, got {out_dtype}")
        M, N = a_q.shape[0], w_q.shape[0]
        acc, padding = int_mm_padded(a_q, w_q)
        self.last_run = {"op": "scaled_mm", **padding}
        return torch_epilogue(acc, scale_vector(s_a, M, "s_a"), scale_vector(s_w, N, "s_w"), bias, out_dtype)

    def evidence(self) -> dict[str, Any]:
        ev = super().evidence()
        ev.update(backend="cuBLASLt via torch._int_mm", last_run=dict(self.last_run))
        return ev
