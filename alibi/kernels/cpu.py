"""CPU kernels: the exact emulator under any epilogue model, and `torch._int_mm` on the CPU.

`torch-cpu` is a real instruction path (oneDNN/FBGEMM integer GEMM), not a reference: some CPU
int8 paths pair products through a saturating 16-bit intermediate (oneDNN documents this for
AVX2/AVX-512 without VNNI), so its accumulator is exposed and checked like any GPU kernel's.
"""

from __future__ import annotations

import torch

from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator
from alibi.exact.fp8_mma import AccumulationSchedule, accumulate
from alibi.kernels.base import TORCH_EPILOGUE, Kernel, torch_epilogue


class EmulatorKernel(Kernel):
    """The exact accumulator followed by a chosen epilogue model, on the CPU."""

    formats = ("int8",)
    device = "cpu"

    def __init__(self, epilogue: EpilogueModel):
        self.epilogue = epilogue
        # The model's name without the default bias mode: emulator:w_then_a, emulator:a_then_w+add_after_cast, ...
        self.name = "emulator:" + epilogue.name.replace("+fma", "", 1) if epilogue.bias == "fma" else \
            "emulator:" + epilogue.name
        self.description = f"exact fp64 accumulator + {epilogue.name} epilogue (reference)"

    def available(self) -> tuple[bool, str]:
        return True, "reference emulator (CPU, exact by construction)"

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return apply_epilogue(self.epilogue, exact_accumulator(a_q, w_q), s_a, s_w, bias, out_dtype)

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor | None:
        return exact_accumulator(a_q, w_q).to(torch.int32)


class Fp8EmulatorKernel(Kernel):
    """The fp8 counterpart of `emulator:<order>`: the accumulator a declared schedule prescribes (the measured
    Hopper step model, `alibi.exact.fp8_mma`), then an epilogue model. Runs on the GPU when there is one (the same
    bits as on the CPU: every operation is exact float64 arithmetic or one IEEE fp32 operation), else on the CPU."""

    formats = ("fp8_e4m3",)
    PREFIX = "emulator-fp8:"

    def __init__(self, schedule: AccumulationSchedule, epilogue: EpilogueModel):
        self.accumulation, self.epilogue = schedule, epilogue
        model = epilogue.name.replace("+fma", "", 1) if epilogue.bias == "fma" else epilogue.name
        self.name = f"{self.PREFIX}{schedule.label}:{model}"
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.description = f"fp8 step model, {schedule.describe()}; {epilogue.name} epilogue (reference)"

    def available(self) -> tuple[bool, str]:
        return True, f"reference emulator of the measured sm_90 fp8 step model (exact, on the {self.device})"

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return apply_epilogue(self.epilogue, accumulate(self.accumulation, a_q, w_q), s_a, s_w, bias, out_dtype)

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor | None:
        return accumulate(self.accumulation, a_q, w_q)


class TorchCpuKernel(Kernel):
    """`torch._int_mm` on the CPU (int32 accumulator) plus the declared epilogue, run in fp32 torch ops."""

    name = "torch-cpu"
    formats = ("int8",)
    device = "cpu"
    epilogue = TORCH_EPILOGUE
    description = "torch._int_mm on the CPU + w_then_a epilogue in torch fp32 ops"

    def available(self) -> tuple[bool, str]:
        if not hasattr(torch, "_int_mm"):
            return False, f"torch {torch.__version__} has no torch._int_mm; install torch>=2.2"
        return True, f"torch._int_mm on the CPU (torch {torch.__version__})"

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor | None:
        # A fresh row-major [K,N] copy: for N×1 weights `w_q.T.contiguous()` keeps the strides (1, 1),
        # which torch calls contiguous but torch 2.13's CPU _int_mm misreads (garbage at K = 1).
        return torch._int_mm(a_q.contiguous(), w_q.T.clone(memory_format=torch.contiguous_format))

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch_epilogue(self.accumulator(a_q, w_q), s_a, s_w, bias, out_dtype)
