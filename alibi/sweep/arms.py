"""The two arms of a sweep: kernels resolved by name, checked for the format, and fed on their own device.

Names are the registry's (`alibi.kernels.registry.get_kernel`) plus one CPU reference kernel for fp8 that the
registry does not carry:

`fp8-sequential:<order>[+<bias>]` — e4m3 operands widened to fp32 (exact), every product formed in
fp32 (exact: two 4-bit significands give at most 8 significant bits, and the exponents of e4m3
products, 2⁻¹⁸…2¹⁸, lie inside fp32's normal range) and added into one fp32 accumulator per output
in the order k = 0, 1, …, K−1, each addition rounding once to nearest even; then the named epilogue
model (`alibi.exact.emulator.apply_epilogue`) on that fp32 accumulator. It is the simplest fully specified
fp32 summation order — an emulated fp8 GEMM for CPU tests, not a model of any GPU's order. (An FMA
would give the same bits: the product is exact, so `fma(a, w, acc) = RN(a·w + acc)`.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from alibi.errors import InputError
from alibi.exact.emulator import EpilogueModel, apply_epilogue
from alibi.kernels.base import Kernel
from alibi.kernels.registry import get_kernel
from alibi.sweep.operands import Operands

SEQUENTIAL_FP8_PREFIX = "fp8-sequential:"
ACCUMULATE_ELEMENTS = 2**24  # products held at once by the sequential kernel (64 MiB of fp32)


class SequentialFp8Kernel(Kernel):
    """`fp8-sequential:<order>[+bias]`: fp32 sequential accumulation of exact e4m3 products, then the epilogue."""

    formats = ("fp8_e4m3",)
    device = "cpu"

    def __init__(self, epilogue: EpilogueModel):
        self.epilogue = epilogue
        self.name = SEQUENTIAL_FP8_PREFIX + epilogue.order + ("" if epilogue.bias == "fma" else f"+{epilogue.bias}")
        self.description = (f"emulated fp8 e4m3 GEMM: fp32 accumulation in order k = 0…K−1, then {epilogue.name} "
                            "(CPU reference for tests)")

    def available(self) -> tuple[bool, str]:
        return True, "emulated on the CPU (fp32 sequential accumulation of exact e4m3 products)"

    def accumulator(self, a_q, w_q):
        if a_q.dtype != torch.float8_e4m3fn or w_q.dtype != torch.float8_e4m3fn:
            raise InputError(f"kernel {self.name!r} takes float8_e4m3fn operands, got {a_q.dtype} and {w_q.dtype}")
        a = a_q.cpu().to(torch.float32).numpy()
        w = w_q.cpu().to(torch.float32).numpy()
        M, K = a.shape
        N = w.shape[0]
        acc = np.zeros((M, N), dtype=np.float32)
        step = max(1, ACCUMULATE_ELEMENTS // max(1, M * N))
        for k0 in range(0, K, step):
            # The products of this chunk (exact in fp32), the running sum folded into the first, then
            # numpy's add.accumulate: the recurrence r[k] = r[k−1] + x[k], one fp32 rounding per term.
            terms = a[:, None, k0:k0 + step] * w[None, :, k0:k0 + step]
            terms[:, :, 0] += acc
            acc = np.add.accumulate(terms, axis=2, dtype=np.float32)[:, :, -1].copy()
        return torch.from_numpy(acc)

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        return apply_epilogue(self.epilogue, self.accumulator(a_q, w_q), s_a, s_w, bias, out_dtype)


def resolve_kernel(name: str) -> Kernel:
    """A registry kernel, or `fp8-sequential:<order>[+bias]`; InputError for an unknown name."""
    if name.startswith(SEQUENTIAL_FP8_PREFIX):
        spec = name.removeprefix(SEQUENTIAL_FP8_PREFIX)
        try:
            return SequentialFp8Kernel(EpilogueModel.parse(spec))
        except InputError as exc:
            raise InputError(f"unknown kernel {name!r}: {exc}") from None
    return get_kernel(name)


@dataclass
class Arm:
    """One kernel of the pair and its operand copies on the kernel's device (one transfer per operand set)."""

    label: str
    kernel: Kernel

    @property
    def device(self) -> torch.device:
        return self.kernel.torch_device()

    def place(self, ops: Operands) -> Operands:
        return ops if ops.a_q.device == self.device else ops.to(self.device)

    def run(self, ops: Operands, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """The kernel's raw op on operands already placed by `place`."""
        return self.kernel.scaled_mm(ops.a_q, ops.s_a, ops.w_q, ops.s_w, None, out_dtype)


def resolve_pair(name_a: str, name_b: str, fmt: str, *, tensorwise_ok: bool) -> tuple[Arm, Arm]:
    """Both arms, refusing (InputError, exit 2) a kernel that does not handle `fmt` and (exit 3) one
    that cannot run here. `tensorwise_ok`: the operands have per-tensor scales (a tensor-wise kernel
    takes nothing else)."""
    arms = []
    for label, name in (("a", name_a), ("b", name_b)):
        kernel = resolve_kernel(name)
        if fmt not in kernel.formats:
            raise InputError(f"--kernel-{label} {name!r} handles {', '.join(kernel.formats)} operands, not {fmt}; "
                             f"choose a kernel for {fmt} (see 'alibi kernels') or change --format")
        if getattr(kernel, "tensorwise", False) and not tensorwise_ok:
            raise InputError(f"--kernel-{label} {name!r} takes per-tensor scales only; use --fp8-scales tensor "
                             "or the row-wise 'cublaslt-fp8'")
        kernel.require_available()
        arms.append(Arm(label, kernel))
    return arms[0], arms[1]


def home_device(arms: tuple[Arm, Arm], requested: str) -> torch.device:
    """Where operands are drawn and the reference and comparisons run: `requested` (cpu/cuda), or with
    `auto` CUDA when either kernel runs there (so that the sweep is bound by GPU work), else the CPU."""
    if requested == "cpu":
        return torch.device("cpu")
    if requested == "cuda":
        if not torch.cuda.is_available():
            raise InputError("--device cuda: torch sees no CUDA device here; use --device cpu or auto")
        return torch.device("cuda")
    if requested != "auto":
        raise InputError(f"--device {requested!r}: choose auto, cpu or cuda")
    return torch.device("cuda") if any(a.device.type == "cuda" for a in arms) else torch.device("cpu")
