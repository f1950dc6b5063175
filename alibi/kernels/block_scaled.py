"""Block-scaled fp8 kernels of other projects: what they share, and `cublaslt-fp8-block` (torch's blockwise recipe).

Every `-block` kernel takes a block-scaled tile (`alibi.exact.fp8_block`: e4m3 `a_q` [M, K] with 1 × 128 group
scales `s_a` [M, G], `w_q` [N, K] with 128 × 128 block scales `s_w` [Nb, G]), hands the operands to its project's
code in the layout that code asks for, and declares its accumulation as a `BlockSchedule`
(`alibi.exact.fp8_block_mma`) with the source it was read from (`declared_from`). None of them exposes its
accumulator. The bias never enters their GEMMs (none of the four takes one on this path); like vLLM's block linear
(`output + bias` after the GEMM, BlockScaledMMLinearKernel.apply_weights) they add it to the output in a separate
op: `add_after_cast` (`alibi.kernels.cpu.block_epilogue`).

Padding (`pad_block_operands`) is exact and documented where a kernel needs it: zero bytes appended to K inside the
last scale group (a zero product leaves a chain as it is, and the last group's scale is the group's, over the
columns that exist), zero weight rows appended to N with scale 1 whose output columns are dropped, zero activation
rows appended to M with scale 1 whose output rows are dropped. New scale groups along K (a chain of zero products
promoted into the accumulator) are exact too: every promotion adds `+0` to an accumulator started at `+0`, and an
fp32 accumulator built by round-to-nearest additions from `+0` is never `−0` (x + (−x) rounds to `+0`), so adding
`+0` changes no bit. Each kernel records its padding in `last_run`.

`cublaslt-fp8-block`: `torch.nn.functional.scaled_mm(a, w.t(), s_a, BlockWise1x128, s_w.t(), BlockWise128x128,
output_dtype=...)` (science.md §8), the activation scales [M, G] in M-major strides (`s_a.t().contiguous().t()`),
the weight scales [Nb, G] as the transposed view of their contiguous tensor. Scale padding: before PyTorch PR 166752
a weight-scale tensor whose K/128 extent was not a multiple of 4 gave silently wrong answers (cuBLASLt reads the
block scales with a leading dimension rounded up to 4). The GPU machine runs torch 2.11, whose behaviour on such a
call has not been read yet; so this kernel pads K with zero bytes to a multiple of 4 · 128 = 512 and both scale
tensors with groups of scale 1, which is exact (the argument above) and gives the same bits on a torch with the fix
and without it. The cost: cuBLASLt sees K rounded up to 512, so its schedule is identified at that K (`last_run`
names both). N is padded to whole 128-row weight blocks, and M to a multiple of 4: on the H200 (torch 2.11, CUDA
13.0) cuBLASLt's heuristic answered CUBLAS_STATUS_NOT_SUPPORTED for M = 15, and torch requires the activation
scales' strides to be (1, M), which a one-row tensor made by `.t().contiguous().t()` does not have.
Declared schedule, a per-shape fact read from cuBLASLt's output bits (it documents neither its promotion nor its
split-K), cuBLASLt 130100 with torch 2.11.0+cu130:

- up to a padded K of 2048 (`SHORT_K`): `block128:fma(sa*sw,p,acc)` (a fresh chain per 128-k block promoted as one
  FMA with the product of the two scales, CUTLASS's and DeepGEMM's association), no split: every element of the
  association probe and of a random tile at each of 13 shapes on an H100 (M 1…256, N 192…7168) and of three
  recorded tiles on an H200 (`tests/fixtures/fp8-block-recorded/`);
- beyond, cuBLASLt's heuristic changes kernel with the shape: on the H100 it runs the same promotion without a
  split at some shapes and splits K in two at others (`:split-2`, the two halves' accumulators added in fp32;
  deterministic: two runs identical), e.g. at K = 7168 split at M ≤ 16 for N up to 4096 but not at M = 64 for
  N ≥ 2048, nor at N = 7168 or 36864; at N = 7168 with K = 16384 and 18432 split up to M = 16.
  `IDENTIFIED_LONG_K` declares the shapes whose recorded fp32 outputs one candidate alone reproduces bit for bit;
  every other long-K shape declares none, so its pairs are not judged, saying why. (A reading of bf16 outputs
  alone misled here: a plain promotion reproduces a split kernel's bf16 output by chance on many tiles, and an
  earlier identify, which tried splits only where nothing else matched, declared and then withdrew a no-split
  schedule at 128 × 256 × 7168.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from alibi.errors import InputError
from alibi.exact.fp8_block import DEEPSEEK_V3, BlockLayout
from alibi.exact.fp8_block_mma import BlockSchedule, check_block_operands, parse_block_schedule
from alibi.kernels.base import Kernel, cuda_problem
from alibi.kernels.cpu import block_epilogue, require_layout
from alibi.kernels.fp8 import cublaslt_version
from alibi.tiles.tile import BLOCK_FORMAT

E4M3 = torch.float8_e4m3fn
AFTER_CAST = block_epilogue("add_after_cast")


@dataclass(frozen=True)
class Padded:
    """Block operands padded for a kernel (module docstring), and how much was added to each dimension."""

    a_q: torch.Tensor
    s_a: torch.Tensor
    w_q: torch.Tensor
    s_w: torch.Tensor
    pad_m: int
    pad_n: int
    pad_k: int

    def record(self) -> dict[str, int]:
        return {"pad_m": self.pad_m, "pad_n": self.pad_n, "pad_k": self.pad_k}


def _pad_bytes(x: torch.Tensor, spec: tuple[int, ...]) -> torch.Tensor:
    return F.pad(x.view(torch.uint8), spec).view(x.dtype)  # the zero byte is +0.0 in e4m3


def pad_block_operands(a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                       layout: BlockLayout = DEEPSEEK_V3, *, m_multiple: int = 1, n_multiple: int = 1,
                       k_multiple: int = 1) -> Padded:
    """`a_q`, `s_a`, `w_q`, `s_w` with M, N and K padded up to the given multiples (module docstring: exact). Scale
    groups or weight blocks the padding adds get scale 1; the scales of the groups and blocks that exist are kept."""
    check_block_operands(layout, a_q, s_a, w_q, s_w)
    (M, K), N = a_q.shape, w_q.shape[0]
    pad_m, pad_n, pad_k = -M % m_multiple, -N % n_multiple, -K % k_multiple
    Mp, Np, Kp = M + pad_m, N + pad_n, K + pad_k
    if pad_m or pad_k:
        a_q = _pad_bytes(a_q, (0, pad_k, 0, pad_m))
    if pad_n or pad_k:
        w_q = _pad_bytes(w_q, (0, pad_k, 0, pad_n))
    (_, G), (Nb, _) = s_a.shape, s_w.shape
    Gp, Nbp = layout.groups(Kp), -(-Np // layout.block_n)
    s_a = F.pad(s_a.to(torch.float32), (0, Gp - G, 0, pad_m), value=1.0)
    s_w = F.pad(s_w.to(torch.float32), (0, Gp - G, 0, Nbp - Nb), value=1.0)
    return Padded(a_q.contiguous(), s_a.contiguous(), w_q.contiguous(), s_w.contiguous(), pad_m, pad_n, pad_k)


def add_bias_after_cast(out: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`add_after_cast`: the GEMM's output (already in the output dtype) plus the bias in fp32, cast again."""
    if bias is None:
        return out
    return (out.to(torch.float32) + bias.to(out.device, torch.float32).reshape(1, -1)).to(out.dtype)


class BlockScaledKernel(Kernel):
    """What the `-block` kernels share: the format, the layout, the epilogue after the GEMM, the operand checks.

    declared_from: where the declared `accumulation` was read (project file and line), for `alibi identify` and the
    docs; activation_rows: rows that must share one activation scale per group (1: any 1 × 128 tile; FBGEMM's kernel
    takes one activation scale per block of rows)."""

    formats = (BLOCK_FORMAT,)
    device = "cuda"
    layout = DEEPSEEK_V3
    epilogue = AFTER_CAST
    accumulation: BlockSchedule | None = None
    declared_from: str = ""
    activation_rows: int = 1
    out_dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)

    def __init__(self) -> None:
        self.last_run: dict[str, Any] = {}

    def cuda_problem(self) -> str | None:
        """Why this machine's GPU cannot run an fp8 kernel, or None."""
        problem = cuda_problem(fp8=False)
        if problem:
            return problem
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) < (9, 0):
            return f"block-scaled fp8 kernels here are sm_90 (H100/H200) kernels; this GPU is sm_{major}{minor}"
        return None

    def run(self, tile, **kwargs):
        require_layout(self.name, self.layout, tile)
        return super().run(tile, **kwargs)

    def checked(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                out_dtype: torch.dtype) -> None:
        if a_q.dtype != E4M3 or w_q.dtype != E4M3:
            raise InputError(f"kernel {self.name!r} takes float8_e4m3fn operands, got {a_q.dtype} and {w_q.dtype}")
        if out_dtype not in self.out_dtypes:
            names = " or ".join(str(d).removeprefix("torch.") for d in self.out_dtypes)
            raise InputError(f"kernel {self.name!r} writes {names} only; got {str(out_dtype).removeprefix('torch.')} "
                             "tiles")
        check_block_operands(self.layout, a_q, s_a, w_q, s_w)

    def evidence(self) -> dict[str, Any]:
        ev = super().evidence()
        ev.update(block_schedule=None if self.accumulation is None else self.accumulation.label,
                  declared_from=self.declared_from, last_run=dict(self.last_run))
        return ev


# --- cuBLASLt through torch ------------------------------------------------------------------------------

SCALE_GROUP_MULTIPLE = 4  # K/128 padded to a multiple of 4 (module docstring: PyTorch PR 166752)
ROW_MULTIPLE = 4  # M padded to a multiple of 4 (module docstring: cuBLASLt refuses other M)


def blockwise_scale_views(s_a: torch.Tensor, s_w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The scale tensors as torch's blockwise recipe takes them: `s_a` [M, G] in M-major strides (1, M), built
    explicitly (`.t().contiguous().t()` keeps row-major strides when M = 1, which torch refuses), `s_w` [Nb, G] as
    the transposed view [G, Nb] of its contiguous tensor."""
    M, G = s_a.shape
    m_major = torch.empty_strided((M, G), (1, M), dtype=s_a.dtype, device=s_a.device).copy_(s_a)
    return m_major, s_w.contiguous().t()


SHORT_K = 2048  # padded K up to which cuBLASLt ran block128:fma(sa*sw,p,acc) at every shape read (module docstring)
# Longer K: the schedule that alone reproduces every fp32 output bit of random tiles of two or four seeds per shape,
# among 180 candidates (six promotions, either block order, K unsplit or split in 2 to 8 parts reduced either way),
# fitted to cuBLASLt 130100's recorded outputs on an H100 (analysis/h200/block_record.py, analysis/
# fit_block_schedule.py; analysis/results/h100/fp8-block/: long-k-fit, deepseek-fit, 46d0a19), keyed by the GPU
# and the shape cuBLASLt saw (M, N, K padded). Its bf16 output was the fp32 output rounded at every recorded
# shape, so the fitted schedule is the bf16 one too. Shapes not recorded declare none.
_H100 = "NVIDIA H100 80GB HBM3"
IDENTIFIED_LONG_K = {
    **{(_H100, M, N, K): "block128:fma(sa*sw,p,acc):split-2" for M, N, K in (
        (4, 256, 7168), (16, 256, 7168), (32, 256, 7168), (64, 256, 7168), (128, 256, 7168),
        (4, 640, 7168), (8, 640, 7168), (16, 640, 7168), (32, 640, 7168), (64, 640, 7168),
        (128, 640, 7168), (4, 1536, 7168), (16, 1536, 7168), (64, 1536, 7168), (4, 2048, 7168), (16, 2048, 7168),
        (32, 2048, 7168), (4, 4096, 7168), (16, 4096, 7168), (4, 7168, 16384), (16, 7168, 16384),
        (4, 7168, 18432), (16, 7168, 18432))},
    **{(_H100, M, N, K): "block128:fma(sa*sw,p,acc)" for M, N, K in (
        (256, 640, 7168), (64, 2048, 7168), (128, 2048, 7168), (64, 4096, 7168), (4, 7168, 7168), (16, 7168, 7168),
        (32, 7168, 7168), (64, 7168, 7168), (128, 7168, 7168), (4, 36864, 7168), (16, 36864, 7168),
        (64, 36864, 7168), (64, 7168, 16384), (64, 7168, 18432), (4, 4096, 4096), (16, 4096, 4096),
        (64, 4096, 4096), (256, 4096, 4096))},
}


class CublasLtFp8BlockKernel(BlockScaledKernel):
    """`cublaslt-fp8-block`: torch's blockwise recipe (cuBLASLt), 1 × 128 activations and 128 × 128 weights."""

    replayable = True  # every launch a function of the operands (alibi.conform.launches)

    name = "cublaslt-fp8-block"
    accumulation = parse_block_schedule("block128:fma(sa*sw,p,acc)")
    declared_from = ("read from cuBLASLt 130100's output bits by `alibi identify` on an H200 and an H100 (module "
                     "docstring): block128:fma(sa*sw,p,acc) up to a padded K of 2048; beyond, per shape where "
                     "identified (IDENTIFIED_LONG_K: split-2 at some), none elsewhere. cuBLASLt documents neither "
                     "its promotion association nor its split-K")
    description = ("torch.nn.functional.scaled_mm, BlockWise1x128 activations and BlockWise128x128 weights "
                   "(cuBLASLt), K padded to 512, bias added after the cast")

    @property
    def multiples(self) -> tuple[int, int, int]:
        """The multiples `scaled_mm` pads M, N and K to before cuBLASLt sees them."""
        return ROW_MULTIPLE, self.layout.block_n, self.layout.block_k * SCALE_GROUP_MULTIPLE

    def padded_shape(self, M: int, N: int, K: int) -> tuple[int, int, int]:
        """The shape cuBLASLt sees: M, N and K padded as `scaled_mm` pads them (`multiples`)."""
        return tuple(-(-size // multiple) * multiple for size, multiple in zip((M, N, K), self.multiples, strict=True))

    def schedule_at(self, M: int, N: int, K: int) -> BlockSchedule | None:
        """The declaration at the shape cuBLASLt sees (`padded_shape`)."""
        Mp, Np, Kp = self.padded_shape(M, N, K)
        if Kp <= SHORT_K:
            return self.accumulation
        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
        label = IDENTIFIED_LONG_K.get((gpu, Mp, Np, Kp))
        if label is None or (":split" in label and Kp != K):  # a split of the padded K is not one of the tile's
            return None
        return parse_block_schedule(label)

    def available(self) -> tuple[bool, str]:
        problem = self.cuda_problem()
        if problem:
            return False, problem
        if not hasattr(F, "scaled_mm") or not hasattr(F, "ScalingType") \
                or not hasattr(F.ScalingType, "BlockWise128x128"):
            return False, (f"torch {torch.__version__} has no torch.nn.functional.scaled_mm with "
                           "ScalingType.BlockWise128x128; install torch>=2.10")
        return True, (f"torch.nn.functional.scaled_mm blockwise recipe (torch {torch.__version__}, CUDA "
                      f"{torch.version.cuda}) on {torch.cuda.get_device_name()}")

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        self.checked(a_q, s_a, w_q, s_w, out_dtype)
        M, N = a_q.shape[0], w_q.shape[0]
        m_multiple, n_multiple, k_multiple = self.multiples
        p = pad_block_operands(a_q, s_a, w_q, s_w, self.layout, m_multiple=m_multiple, n_multiple=n_multiple,
                               k_multiple=k_multiple)
        scale_a, scale_b = blockwise_scale_views(p.s_a, p.s_w)
        out = F.scaled_mm(p.a_q, p.w_q.t(), scale_a, F.ScalingType.BlockWise1x128, scale_b,
                          F.ScalingType.BlockWise128x128, output_dtype=out_dtype)
        self.last_run = {"op": "torch.nn.functional.scaled_mm", "recipe": "BlockWise1x128 x BlockWise128x128",
                         "shape": [M, N, a_q.shape[1]],
                         "padded_shape": [p.a_q.shape[0], p.w_q.shape[0], p.a_q.shape[1]],
                         **p.record(), "bias": None if bias is None else "added after the cast"}
        return add_bias_after_cast(out[:M, :N], bias)

    def evidence(self) -> dict[str, Any]:
        ev = super().evidence()
        ev.update(backend="torch.nn.functional.scaled_mm", cublaslt_version=cublaslt_version())
        return ev


__all__ = ["AFTER_CAST", "BlockScaledKernel", "CublasLtFp8BlockKernel", "Padded", "SCALE_GROUP_MULTIPLE",
           "add_bias_after_cast", "blockwise_scale_views", "pad_block_operands"]
