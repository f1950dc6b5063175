"""`sgl-int8` / `sgl-fp8`: SGLang's `sgl_kernel.int8_scaled_mm` / `fp8_scaled_mm`, where `sgl_kernel` loads.

SGLang's scaled-mm ops take vLLM's operand layout (`mat_a [M,K]` row-major, `mat_b = w.t()` column-major
`[K,N]`, `scales_a [M,1]`, `scales_b [N,1]` fp32, `out_dtype`, optional bias) and, on sm90, build vLLM's
CUTLASS epilogue tree: the declared models are vLLM CUTLASS's (`w_then_a+fma`), unverified until
`alibi identify sgl-int8` runs where the library loads.

Where it loads. `sgl_kernel` is a compiled extension that is not on PyTorch's stable ABI: each wheel
works with one torch build. Checked on 2026-12-02 from the package index's metadata: `sglang-kernel==0.4.10`
requires `torch==2.14.1` (CUDA 13); `sgl-kernel==0.3.21` is built for CUDA 12. Neither matches the
H200's torch 2.11+cu130, so these kernels are listed as unavailable there, with the import's own
error when a wheel is installed anyway. `alibi` imports `sgl_kernel` only when asked (`available()`),
never at start-up.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from typing import Any

import torch

from alibi.errors import InputError, KernelUnavailable
from alibi.exact.emulator import VLLM_CUTLASS
from alibi.kernels.base import Kernel
from alibi.kernels.vllm import bias_in_output_dtype

WHEELS = {"sglang-kernel": "0.4.10 (requires torch==2.14.1, CUDA 13)", "sgl-kernel": "0.3.21 (built for CUDA 12)"}


def installed() -> tuple[str, str] | None:
    """(distribution, version) of an installed SGLang kernel wheel, None if neither is installed."""
    for dist in WHEELS:
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


_STATE: dict[str, Any] = {}


def load() -> Any:
    """`sgl_kernel`, imported once; KernelUnavailable with the exact reason when it cannot be."""
    if "module" in _STATE:
        return _STATE["module"]
    if "refusal" in _STATE:
        raise KernelUnavailable(_STATE["refusal"])
    found = installed()
    if found is None or importlib.util.find_spec("sgl_kernel") is None:
        wheels = "; ".join(f"{d}=={v}" for d, v in WHEELS.items())
        _STATE["refusal"] = (f"sgl_kernel is not installed (torch here: {torch.__version__}); the published wheels are "
                             f"built for other torch/CUDA builds and are not on PyTorch's stable ABI: {wheels}")
        raise KernelUnavailable(_STATE["refusal"])
    try:
        module = importlib.import_module("sgl_kernel")
    except Exception as exc:  # noqa: BLE001 - foreign code: any import failure is the reason it is unavailable
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        _STATE["refusal"] = (f"{found[0]} {found[1]} is installed but sgl_kernel does not load into torch "
                             f"{torch.__version__}: {type(exc).__name__}: {first}")
        raise KernelUnavailable(_STATE["refusal"]) from None
    _STATE["module"] = module
    return module


class SglKernel(Kernel):
    """What the two share: SGLang's op found by name in `sgl_kernel`, CUDA only."""

    device = "cuda"
    bias_in_output_dtype = True  # vLLM's operand layout: the bias in the output dtype (refused where not exact)
    epilogue = VLLM_CUTLASS
    op_name = "int8_scaled_mm"
    operand_dtype: torch.dtype = torch.int8

    def available(self) -> tuple[bool, str]:
        try:
            module = load()
        except KernelUnavailable as exc:
            return False, str(exc)
        if not torch.cuda.is_available():
            return False, "no CUDA GPU here (torch.cuda.is_available() is False)"
        if not callable(getattr(module, self.op_name, None)):
            return False, f"sgl_kernel {installed()} has no {self.op_name}"
        return True, f"sgl_kernel.{self.op_name} ({installed()}) on {torch.cuda.get_device_name()}"

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        if a_q.dtype != self.operand_dtype or w_q.dtype != self.operand_dtype:
            raise InputError(f"kernel {self.name!r} takes {self.operand_dtype} operands, got {a_q.dtype} and {w_q.dtype}")
        M, N = a_q.shape[0], w_q.shape[0]
        fn = getattr(load(), self.op_name)
        # vLLM's operand layout and vLLM's rule for the bias: in the output dtype, converted only where exact.
        bias_out = bias_in_output_dtype(self.name, bias, N, out_dtype)
        return fn(a_q.contiguous(), w_q.contiguous().t(), s_a.reshape(-1, 1).to(torch.float32).contiguous(),
                  s_w.reshape(-1, 1).to(torch.float32).contiguous(), out_dtype, bias_out)

    def evidence(self) -> dict[str, Any]:
        ev = super().evidence()
        ev["sgl_kernel"] = {"installed": installed(), "refusal": _STATE.get("refusal")}
        return ev


class SglInt8Kernel(SglKernel):
    name = "sgl-int8"
    formats = ("int8",)
    description = "SGLang's sgl_kernel.int8_scaled_mm (vLLM's operand layout and sm90 epilogue tree), where it loads"


class SglFp8Kernel(SglKernel):
    name = "sgl-fp8"
    formats = ("fp8_e4m3",)
    op_name = "fp8_scaled_mm"
    operand_dtype = torch.float8_e4m3fn
    description = "SGLang's sgl_kernel.fp8_scaled_mm (vLLM's operand layout), where it loads"


__all__ = ["SglFp8Kernel", "SglInt8Kernel", "installed", "load"]
