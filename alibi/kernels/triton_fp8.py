"""The `triton-fp8` kernel: the `triton` kernel's code on fp8 e4m3 operands, accumulating in fp32.

What it computes, for float8_e4m3fn `A [M,K]` and `W [N,K]`, fp32 scales `s_a` ([M] per row or
[1] per tensor) and `s_w` ([N] per channel or [1]), an optional bias and bfloat16/float16 output:

    acc = Σ_k A[m,k]·W[n,k]                       fp32, tiled `tl.dot(..., out_dtype=tl.float32)`
    y   = RN32(s_w[n] · RN32(s_a[m] · acc))         then the same epilogue as `triton`:
    c   = out(y), and with a bias out(RN32(float(c) + float(bias[n])))   (a_then_w + add_after_cast)

It is `alibi.kernels.triton_int8.scaled_mm_kernel` itself, launched with `ACC_DTYPE=tl.float32`
(vLLM's Triton scaled-mm likewise serves int8 and fp8 from one kernel), so the epilogue — and its
explicit round-to-nearest-even, identical under the interpreter and on the GPU — is shared.

Unlike the int8 accumulator, this one rounds: every e4m3 product is exact (two 4-bit significands
make at most 8 bits, and e4m3's exponent range fits fp32's), but each addition into the fp32
accumulator may round, in an order set by the instruction path. The kernel therefore equals its
epilogue model applied to *its own* accumulator (exposed by `accumulator()`), not to the exact sum
`a.double() @ w.double().T`; how far its accumulator is from the exact one is a measurement. Where
the accumulation happens:

* sm90 (H100/H200): Triton's default for fp8 `tl.dot` there is `max_num_imprecise_acc = 2**30`,
  i.e. the tensor core's reduced-precision fp8 accumulation is never promoted to a full fp32 add
  inside the K loop — the "fast accumulation" vLLM's Triton path also gets. Elsewhere Triton
  asks for no imprecise accumulation (`max_num_imprecise_acc = 0`).
* the interpreter: each BLOCK_K slice is a numpy float32 matmul (the e4m3 values widened exactly
  to float16 first), added to the running fp32 accumulator. Its bits differ from the GPU's;
  fp8 results are not claimed to agree across back ends.

fp8 `tl.dot` needs compute capability 8.9 or newer on the GPU; under the interpreter `available()`
runs one small product once and reports whether this triton version's interpreter handles fp8.
"""

from functools import cache
from typing import Any

import torch

from alibi.exact.fp8_mma import FAST_ACCUM, AccumulationSchedule
from alibi.kernels.triton_int8 import (
    TRITON_IMPORT_ERROR,
    TritonScaledMmKernel,
    interpreted,
    launch,
    triton,
)


@cache
def _interpreter_fp8_probe() -> str | None:
    """None if an fp8 tl.dot under the interpreter returns the exact product of a small case, else why not.

    The case (K = 40, |values| ≤ 8 with few significant bits) has every partial sum exact in fp32, so
    any correct fp32 accumulation must reproduce the fp64 product exactly.
    """
    g = torch.Generator().manual_seed(0)
    a = (torch.randint(-16, 17, (20, 40), generator=g) / 2).to(torch.float8_e4m3fn)
    w = (torch.randint(-16, 17, (24, 40), generator=g) / 2).to(torch.float8_e4m3fn)
    try:
        acc, _ = launch(a, None, w, None, store_acc=True)
    except Exception as exc:  # noqa: BLE001 - any failure means "does not work here"; the reason is reported
        return f"{type(exc).__name__}: {exc}"
    exact = (a.double() @ w.double().T).float()
    if not torch.equal(acc, exact):
        return "an fp8 product that is exact in fp32 came out wrong"
    return None


class TritonFp8Kernel(TritonScaledMmKernel):
    """`triton-fp8`: fp8 e4m3 operands, fp32 tl.dot accumulation, vLLM's Triton epilogue."""

    replayable = True  # every launch a function of the operands (alibi.conform.launches)

    name = "triton-fp8"
    formats = ("fp8_e4m3",)
    operand_dtype = torch.float8_e4m3fn
    description = ("Triton fp8 e4m3 scaled-mm (fp32 tl.dot accumulation, per-tensor or per-row/channel "
                   "scales, vLLM Triton epilogue: a_then_w, bias after the cast)")

    def available(self) -> tuple[bool, str]:
        if TRITON_IMPORT_ERROR:
            return False, TRITON_IMPORT_ERROR
        if interpreted():
            problem = _interpreter_fp8_probe()
            if problem:
                return False, (f"no CUDA device, and fp8 tl.dot does not work under the Triton interpreter "
                               f"(TRITON_INTERPRET=1) of triton {triton.__version__}: {problem}")
            return True, (f"Triton interpreter (TRITON_INTERPRET=1) on the CPU, triton {triton.__version__}: "
                          "fp8 accumulated in numpy fp32; bits differ from any GPU's")
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) < (8, 9):
            return False, f"fp8 e4m3 tl.dot needs compute capability 8.9 or newer; this GPU is sm_{major}{minor}"
        return True, f"native Triton {triton.__version__} on {torch.cuda.get_device_name()} (sm_{major}{minor})"

    def schedule_at(self, M: int, N: int, K: int) -> AccumulationSchedule | None:
        """sm90: one `wgmma` chain over K (`acc = tl.dot(a, w, acc)`, `max_num_imprecise_acc = 2**30`: never
        promoted). Elsewhere none is declared: the interpreter sums each BLOCK_K slice with numpy's float32 matmul
        (whose order is the host BLAS's), and other GPUs run other instructions."""
        if interpreted() or torch.cuda.get_device_capability() != (9, 0):
            return None
        return FAST_ACCUM

    def evidence(self) -> dict[str, Any]:
        ev = super().evidence()
        if interpreted():
            ev["fp8_accumulation"] = "interpreter: numpy float32 matmul per BLOCK_K slice, then fp32 add"
        elif torch.cuda.get_device_capability() == (9, 0):
            ev["fp8_accumulation"] = "sm90 tensor-core fp8 accumulation, max_num_imprecise_acc=2**30 (Triton default)"
        else:
            ev["fp8_accumulation"] = "max_num_imprecise_acc=0 (Triton default off sm90)"
        return ev
