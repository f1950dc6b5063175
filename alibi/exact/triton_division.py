"""Triton's fp32 division on sm_90, bit for bit: what FBGEMM's block kernel divides its scales with.

Triton lowers `x / y` on fp32 to PTX `div.full.f32`, a fast division that is not correctly rounded (PTX ISA: at
most 2 ulp from the true quotient), not to `div.rn.f32`. Measured on an H100 (`analysis/h200/fp8_block_measure.py`,
part `division`; `alibi/exact/data/README.md`): Triton's `1 / y` for every significand of [1, 2) is stored as its
offset in ulps from the correctly rounded reciprocal (`RECIPROCAL_TABLE`, int8, 2^23 entries); the reciprocal of
any normal `y` is that of its significand scaled by `2^-e` (checked at every exponent scales take), and `x / y` is
`RN(x · (1 / y))`, one fp32 multiplication (checked on 2^22 pairs). The model refuses operands outside the range
those checks cover.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from alibi.errors import InputError

RECIPROCAL_TABLE = Path(__file__).parent / "data" / "triton-reciprocal-sm90.npz"
EXPONENT_RANGE = (-100, 100)  # unbiased exponents of y the model covers (scales: about 1e-30 .. 1e30)


@functools.cache
def _offsets(device: str) -> torch.Tensor:
    """The table (int8) on `device`, read and moved once per device: the rescaled chain divides once per scale
    block."""
    with np.load(RECIPROCAL_TABLE) as data:
        return torch.from_numpy(data["reciprocal_offset_ulps"]).to(device)


def triton_reciprocal(y: torch.Tensor) -> torch.Tensor:
    """Triton's fp32 `1 / y` on sm_90 for fp32 `y` (any shape; module docstring)."""
    y = y.to(torch.float32)
    bits = y.contiguous().view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - 127
    if bool(((exponent < EXPONENT_RANGE[0]) | (exponent > EXPONENT_RANGE[1]) | ~torch.isfinite(y)).any()):
        raise InputError("Triton's division is modelled for normal divisors with exponents in "
                         f"[{EXPONENT_RANGE[0]}, {EXPONENT_RANGE[1]}]: a scale outside that range is not a scale")
    fraction = bits & 0x7FFFFF
    significand = (fraction | 0x3F800000).view(torch.float32)  # y's significand, in [1, 2)
    exact = torch.ones_like(significand) / significand  # correctly rounded on every device torch runs on
    rcp = (exact.view(torch.int32) + _offsets(str(y.device))[fraction.long()].to(torch.int32)).view(torch.float32)
    scale = ((127 - exponent) << 23).view(torch.float32)  # 2^-e, exact in this range
    return torch.copysign(rcp * scale, y)


def triton_divide(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Triton's fp32 `x / y` on sm_90: `RN(x · triton_reciprocal(y))` (module docstring)."""
    return x.to(torch.float32) * triton_reciprocal(y)


__all__ = ["EXPONENT_RANGE", "RECIPROCAL_TABLE", "triton_divide", "triton_reciprocal"]
