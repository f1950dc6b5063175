"""Block-scaled FP8, the format: e4m3 operands with one fp32 scale per 1×128 activation group and per 128×128
weight block (DeepSeek-V3, Qwen3-FP8), as the checkpoints store it and as serving stacks quantise at run time.

Layout (`BlockLayout`, block sizes `block_n` × `block_k`, 128 × 128 by default):

| tensor | dtype | shape | meaning |
|---|---|---|---|
| activations `a_q` | float8_e4m3fn | `[M, K]` | quantised per 1 × `block_k` group of each row, at run time |
| activation scales `s_a` | float32 | `[M, ceil(K / block_k)]` | one per row and k group (row-major here; vLLM's CUTLASS and DeepGEMM paths ask for it M-major, the same values) |
| weights `w_q` | float8_e4m3fn | `[N, K]` | quantised per `block_n` × `block_k` block, offline |
| weight scales `s_w` | float32 | `[ceil(N / block_n), ceil(K / block_k)]` | the checkpoint's `weight_scale_inv` (a dequantisation scale despite its name: `w ≈ w_q · s_w`) |

A K or N that is not a multiple of the block leaves a ragged last group or block, its scale taken over the
columns (rows) that exist. DeepSeek-V3's checkpoint has ragged N blocks (`kv_a_proj_with_mqa`: N = 576, 5 row
blocks) but every K a multiple of 128; vLLM's group quantiser asserts `K % group_size == 0`, so a layer with a
ragged K (SmolLM2-135M's K = 576 = 4.5 · 128) cannot be served by vLLM's block path without zero-padding K. Padding
K with zeros changes nothing here: a zero column leaves every group's amax, every quantised value and (zero
products being no-ops in the step model, `alibi.exact.fp8_block_mma`) every accumulator bit as they were.

Quantisation (`quantize_fp8_groups`, `quantize_fp8_blocks`) follows vLLM's `per_token_group_quant_fp8` (its CUDA
kernel and its Triton fallback agree): `amax = max(max|x|, eps)` with `eps = fp32(1e-10)`, `s = RN32(amax / 448)`
(a correctly rounded fp32 division), `q = e4m3(clamp(RN32(x / s), −448, 448))` (a division per element, not a
multiplication by a reciprocal; the cast rounds to nearest even). An all-zero group therefore gets the tiny
positive scale `RN32(eps / 448)` and all-zero bytes, not a zero or NaN scale. The weight blocks use the same rule
(DeepSeek's own `weight_quant` divides by `amax / 448` without the eps, which differs only on all-zero blocks).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch

from alibi.errors import InputError
from alibi.exact.quant import E4M3_MAX

GROUP_EPS = float(np.float32(1e-10))  # vLLM passes eps = 1e-10 to a float parameter: the fp32 value
LAYOUT_KEY = "scale_layout"  # the tile metadata key naming a block-scaled layout (`BlockLayout.text`)
_LAYOUT = re.compile(r"block:1x(\d+):(\d+)x(\d+)")


@dataclass(frozen=True)
class BlockLayout:
    """Where the scales of a block-scaled GEMM apply: activations in 1 × `block_k` groups of each row, weights in
    `block_n` × `block_k` blocks. Written `block:1x<block_k>:<block_n>x<block_k>` in a tile's `scale_layout`
    metadata (`text`)."""

    block_n: int = 128
    block_k: int = 128

    def __post_init__(self) -> None:
        if self.block_n < 1 or self.block_k < 1:
            raise InputError(f"block layout {self.block_n}x{self.block_k}: block sizes must be positive")

    @property
    def text(self) -> str:
        return f"block:1x{self.block_k}:{self.block_n}x{self.block_k}"

    @classmethod
    def parse(cls, text: str) -> BlockLayout:
        m = _LAYOUT.fullmatch(text.strip())
        if m is None or m.group(1) != m.group(3):
            raise InputError(f"scale layout {text!r} is not block:1x<k>:<n>x<k> (activation groups and weight blocks "
                             "share their k), e.g. block:1x128:128x128")
        return cls(int(m.group(2)), int(m.group(1)))

    def groups(self, K: int) -> int:
        """Scale groups along K: ceil(K / block_k)."""
        return -(-K // self.block_k)

    def a_scale_shape(self, M: int, K: int) -> tuple[int, int]:
        return (M, self.groups(K))

    def w_scale_shape(self, N: int, K: int) -> tuple[int, int]:
        return (-(-N // self.block_n), self.groups(K))

    def column_scales(self, s_w: torch.Tensor, N: int) -> torch.Tensor:
        """The weight scales per output column [N, G] (row n of the weight takes its block's row `n // block_n`)."""
        return s_w.repeat_interleave(self.block_n, dim=-2)[..., :N, :]


DEEPSEEK_V3 = BlockLayout(128, 128)


def _group_scales(amax: torch.Tensor) -> torch.Tensor:
    eps = torch.full_like(amax, GROUP_EPS)
    return torch.maximum(amax, eps) / torch.full_like(amax, E4M3_MAX)


def _quantize(xf: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return (xf / s).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def quantize_fp8_groups(x: torch.Tensor, block_k: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token-group e4m3 quantisation of activations `x` [M, K] → (float8_e4m3fn [M, K], float32 [M, ceil(K/block_k)])
    (module docstring; a ragged last group's scale is over its own columns)."""
    if x.dim() != 2:
        raise InputError(f"quantize_fp8_groups: x must be [M, K], got {list(x.shape)}")
    M, K = x.shape
    xf = x.to(torch.float32)
    G = -(-K // block_k)
    padded = torch.nn.functional.pad(xf, (0, G * block_k - K))  # zeros leave every amax as it is
    s = _group_scales(padded.abs().reshape(M, G, block_k).amax(-1))
    q = _quantize(xf, s.repeat_interleave(block_k, dim=1)[:, :K])
    return q, s


def quantize_fp8_blocks(w: torch.Tensor, layout: BlockLayout = DEEPSEEK_V3) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-block e4m3 quantisation of weights `w` [N, K] → (float8_e4m3fn [N, K], float32 [ceil(N/block_n),
    ceil(K/block_k)]), the checkpoint's `weight_scale_inv` (module docstring)."""
    if w.dim() != 2:
        raise InputError(f"quantize_fp8_blocks: w must be [N, K], got {list(w.shape)}")
    N, K = w.shape
    Nb, G = layout.w_scale_shape(N, K)
    bn, bk = layout.block_n, layout.block_k
    wf = w.to(torch.float32)
    padded = torch.nn.functional.pad(wf, (0, G * bk - K, 0, Nb * bn - N))
    s = _group_scales(padded.abs().reshape(Nb, bn, G, bk).amax(dim=(1, 3)))
    per_element = s.repeat_interleave(bn, dim=0).repeat_interleave(bk, dim=1)[:N, :K]
    return _quantize(wf, per_element), s


__all__ = ["BlockLayout", "DEEPSEEK_V3", "E4M3_MAX", "GROUP_EPS", "LAYOUT_KEY", "quantize_fp8_blocks",
           "quantize_fp8_groups"]
