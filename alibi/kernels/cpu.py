"""CPU kernels: the exact emulator under any epilogue model, and `torch._int_mm` on the CPU.

`torch-cpu` is a real instruction path (oneDNN/FBGEMM integer GEMM), not a reference: some CPU
int8 paths pair products through a saturating 16-bit intermediate (oneDNN documents this for
AVX2/AVX-512 without VNNI), so its accumulator is exposed and checked like any GPU kernel's.
"""

from __future__ import annotations

import torch

from alibi.errors import InputError
from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator
from alibi.exact.fp8_block import DEEPSEEK_V3, BlockLayout
from alibi.exact.fp8_block_mma import BlockSchedule, accumulate_blocks
from alibi.exact.fp8_mma import AccumulationSchedule, accumulate
from alibi.kernels.base import TORCH_EPILOGUE, Kernel, torch_epilogue
from alibi.tiles.tile import Tile


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


BLOCK_BIAS_MODES = ("add_before_cast", "add_after_cast")


def block_epilogue(bias_mode: str) -> EpilogueModel:
    """A block-scaled kernel's epilogue as an epilogue model applied with unit scales (the scales are inside the
    accumulator): `add_before_cast` (the bias added to the fp32 accumulator, one cast; `fma` would be the same bits)
    or `add_after_cast` (cast, then the bias added and the sum cast again: vLLM's `output + bias` after its block
    GEMM). Without a bias both are one cast of the accumulator."""
    if bias_mode not in BLOCK_BIAS_MODES:
        raise InputError(f"block-scaled epilogue {bias_mode!r} is unknown; use {' or '.join(BLOCK_BIAS_MODES)} (the "
                         "scales are applied inside the accumulation, so only the bias and the cast remain)")
    return EpilogueModel("product_first", bias_mode)  # type: ignore[arg-type]


def unit_scales(acc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales of 1 for `apply_epilogue` on an accumulator [..., M, N] that already holds the scales: every order then
    multiplies by exactly 1."""
    lead, (M, N) = acc.shape[:-2], acc.shape[-2:]
    return (torch.ones((*lead, M), dtype=torch.float32, device=acc.device),
            torch.ones((*lead, N), dtype=torch.float32, device=acc.device))


def require_layout(kernel: str, layout: BlockLayout, tile: Tile) -> None:
    """InputError unless a block-scaled `tile` has the `layout` that `kernel` takes (a per-row tile passes)."""
    if tile.block_layout is not None and tile.block_layout != layout:
        raise InputError(f"kernel {kernel!r} takes {layout.text} scales; tile {tile.name!r} has "
                         f"{tile.block_layout.text}")


class BlockFp8EmulatorKernel(Kernel):
    """The block-scaled fp8 reference: the accumulator a declared `BlockSchedule` prescribes (the measured Hopper step
    model in fresh chains, promoted with the block scales: `alibi.exact.fp8_block_mma`), then the bias and the cast.
    Exact on the CPU and on the GPU alike (exact float64 inside the chains, one IEEE fp32 operation or one exactly
    rounded FMA per promotion step); `accumulator` returns the fp32 accumulator *after* the scales."""

    formats = ("fp8_e4m3_block",)
    PREFIX = "emulator-fp8-block:"
    scaled_accumulator = True

    def __init__(self, schedule: BlockSchedule, bias_mode: str, layout: BlockLayout = DEEPSEEK_V3):
        self.accumulation, self.epilogue, self.layout = schedule, block_epilogue(bias_mode), layout
        self.name = f"{self.PREFIX}{schedule.label}:{bias_mode}"
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.description = f"block-scaled fp8 step model, {schedule.describe()}; bias {bias_mode} (reference)"

    def available(self) -> tuple[bool, str]:
        return True, f"reference emulator of block-scaled fp8 ({self.layout.text}) on the measured sm_90 step model"

    def run(self, tile, **kwargs):
        require_layout(self.name, self.layout, tile)
        return super().run(tile, **kwargs)

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor | None = None,
                    s_w: torch.Tensor | None = None) -> torch.Tensor | None:
        if s_a is None or s_w is None:
            raise InputError(f"kernel {self.name!r}: a block-scaled accumulator includes the scales; pass s_a and s_w")
        # a nondeterministic declaration runs in one of its orders (conform leaves such a pair not judged)
        return accumulate_blocks(self.accumulation.in_one_order(), a_q, s_a, w_q, s_w, self.layout)

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        acc = self.accumulator(a_q, w_q, s_a, s_w)
        return apply_epilogue(self.epilogue, acc, *unit_scales(acc), bias, out_dtype)


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
