"""Seeded operands for the sweeps: INT8 as the synthetic presets make them, FP8 as the paper's design.

* INT8 (`format="int8"`): `alibi.tiles.synthetic`'s own generator — heavy-tailed (Student-t, 4 degrees of
  freedom) activations with ~1% outlier channels and a shared direction with the weights — then
  vLLM's dynamic per-token quantization of the activations and compressed-tensors' per-channel
  quantization of the weights with the scale stored in bf16 (`alibi.exact.quant`), exactly the steps of
  `alibi.tiles.synthetic.synthetic_tiles`; the scales are real (not powers of two).
  `quantize_per_token` never produces −128 (`|x·127/amax| ≤ 127`), so every product is bounded by
  127·128 = 16256 and no int32 accumulator can wrap for K ≤ `INT8_K_LIMIT` = 132,104.
* FP8 (`format="fp8_e4m3"`), `fp8_scales="tensor"` (the paper's design): standard Gaussian values
  cast to e4m3 (round to nearest even) with per-tensor scales 1. `fp8_scales="row"`: Gaussian
  values with a log-normal magnitude per row (per token) and per weight row (output channel),
  scaled by `s = amax/448` per row and column (fp32, correctly rounded division) before the cast,
  so the scales are real vectors `[M]` and `[N]`.

Seeds. Each draw uses one `torch.Generator` on the operand device, seeded with a 63-bit integer
derived from a tuple of words (`seed_for`, numpy's SeedSequence): `(seed,)` for a nested-prefix
seed, `(seed, K)` for a redrawn K, `(seed, M, block)` for a rows-sweep block. The same words give
the same bits on the same device type (CPU: on every machine; CUDA: torch's Philox generator).

Nested prefixes. `Operands.prefix(K)` keeps the leading K columns of A and W and the scales as they
are, so within a seed only K varies: the smaller-K operands are exactly slices of the largest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from alibi.exact.emulator import INT32_LIMIT
from alibi.exact.quant import (
    quantize_per_token,
    quantize_weight_per_channel,
    weight_scale_per_channel,
)
from alibi.tiles.synthetic import (
    _operands as synthetic_operands,  # the presets' generator, reused as is
)

FORMATS = ("int8", "fp8_e4m3")
FP8_SCALES = ("tensor", "row")
INT8_PRODUCT_BOUND = 127 * 128  # activations never reach −128 (see the module docstring)
INT8_K_LIMIT = (INT32_LIMIT - 1) // INT8_PRODUCT_BOUND  # 132,104
# The fp64 reference of an e4m3 GEMM is exact for K ≤ 65536: each product is a multiple of 2⁻¹⁸
# of magnitude ≤ 448² < 2¹⁸, so every partial sum lies on a 2⁻¹⁸ grid below 2³⁴ (52 bits).
FP8_K_LIMIT = 65536
E4M3_MAX = 448.0


def seed_for(*words: int) -> int:
    """A 63-bit generator seed derived from `words` (numpy SeedSequence: well mixed, reproducible)."""
    state = np.random.SeedSequence([int(w) for w in words]).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 32 | int(state[1])) >> 1)


@dataclass(frozen=True)
class OperandSpec:
    """What to draw: `format`, the shape `M×N` (K is given per draw) and, for fp8, the scale layout."""

    format: str
    M: int
    N: int
    fp8_scales: str = "tensor"

    def describe(self) -> str:
        if self.format == "int8":
            return ("alibi.synthetic operands (Student-t activations with outlier channels and a shared direction), "
                    "vLLM dynamic per-token int8 activations, compressed-tensors per-channel int8 weights "
                    "(bf16 scale absmax/127.5), real scales")
        if self.fp8_scales == "tensor":
            return "standard Gaussian values cast to e4m3 (round to nearest even), per-tensor scales 1"
        return ("Gaussian values with a log-normal magnitude per row, scaled by amax/448 per row of A and of W "
                "(real fp32 scales [M] and [N]), cast to e4m3 (round to nearest even)")


@dataclass(frozen=True)
class Operands:
    """One GEMM's operands on one device: A [M,K], s_a, W [N,K], s_w (int8 or float8_e4m3fn)."""

    a_q: torch.Tensor
    s_a: torch.Tensor
    w_q: torch.Tensor
    s_w: torch.Tensor

    @property
    def K(self) -> int:
        return self.a_q.shape[1]

    def prefix(self, K: int) -> Operands:
        """The leading K columns of A and W (contiguous copies), the scales unchanged."""
        if not 1 <= K <= self.K:
            raise ValueError(f"prefix K={K} outside 1…{self.K}")
        if K == self.K:
            return self
        return Operands(self.a_q[:, :K].contiguous(), self.s_a, self.w_q[:, :K].contiguous(), self.s_w)

    def rows(self, start: int, stop: int) -> Operands:
        """Activation rows start…stop−1 (a tile of the rows sweep); weights shared."""
        s_a = self.s_a if self.s_a.numel() == 1 else self.s_a[start:stop]
        return Operands(self.a_q[start:stop], s_a, self.w_q, self.s_w)

    def to(self, device: torch.device) -> Operands:
        return Operands(*(t.to(device) for t in (self.a_q, self.s_a, self.w_q, self.s_w)))


def draw(spec: OperandSpec, K: int, words: tuple[int, ...], device: torch.device) -> Operands:
    """Operands of shape M×K and N×K for `spec`, from a generator seeded by `seed_for(*words)` on `device`."""
    gen = torch.Generator(device=device).manual_seed(seed_for(*words))
    with torch.device(device):  # factory functions inside the generators then allocate on `device`
        if spec.format == "int8":
            return _int8(gen, spec.M, K, spec.N)
        return _fp8(gen, spec.M, K, spec.N, spec.fp8_scales)


def _int8(gen: torch.Generator, M: int, K: int, N: int) -> Operands:
    x, w = synthetic_operands(gen, M, K, N)
    a_q, s_a = quantize_per_token(x)
    w_q, s_w = quantize_weight_per_channel(w, weight_scale_per_channel(w, torch.bfloat16))
    return Operands(a_q, s_a, w_q, s_w)


def _fp8(gen: torch.Generator, M: int, K: int, N: int, scales: str) -> Operands:
    if scales == "tensor":
        a = torch.randn((M, K), generator=gen).to(torch.float8_e4m3fn)
        w = torch.randn((N, K), generator=gen).to(torch.float8_e4m3fn)
        one = torch.ones(1, dtype=torch.float32)
        return Operands(a, one, w, one.clone())
    a, s_a = _scaled_rows(torch.randn((M, K), generator=gen) * torch.exp(0.5 * torch.randn((M, 1), generator=gen)))
    w, s_w = _scaled_rows(torch.randn((N, K), generator=gen) * torch.exp(0.5 * torch.randn((N, 1), generator=gen)))
    return Operands(a, s_a, w, s_w)


def _scaled_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row scale amax/448 and the e4m3 values x/s (≤ 448 up to one fp32 rounding, which the cast absorbs)."""
    amax = x.abs().amax(dim=1)
    s = amax / torch.full_like(amax, E4M3_MAX)
    q = (x / s.unsqueeze(1)).to(torch.float8_e4m3fn)
    return q, s.to(torch.float32)
