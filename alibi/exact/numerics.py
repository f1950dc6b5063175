"""Bit-level numerics: bit views, bitwise equality, ulp distance, power-of-two scales, RNE casts.

Everything here is a pure function of tensors on the CPU. The definitions follow science.md §5:

* *Bitwise equal* compares bit patterns: `+0.0` and `-0.0` differ, two NaNs are equal only when
  their payloads (all bits) are equal.
* *Ulp distance* is defined on finite pairs only: each bit pattern is mapped to an ordered integer
  (both zeros map to the same point) and the distance is the absolute difference, i.e. the number
  of representable values stepped over between the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from alibi.errors import InputError

FLOAT_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}

_INT_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32,
             torch.float64: torch.int64, torch.float8_e4m3fn: torch.int8, torch.float8_e5m2: torch.int8}
_SIGN_BIT = {torch.int16: 1 << 15, torch.int32: 1 << 31, torch.int64: 1 << 63, torch.int8: 1 << 7}

Pow2Mode = Literal["nearest", "ceil", "floor"]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def bits(x: torch.Tensor) -> torch.Tensor:
    """The bit pattern of a floating tensor as a signed integer tensor of the same width."""
    try:
        return x.contiguous().view(_INT_VIEW[x.dtype])
    except KeyError:
        raise TypeError(f"bits: unsupported dtype {x.dtype}") from None


def bitwise_equal_mask(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: True where the two bit patterns are identical (signed zeros differ, NaN payloads compared)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        raise ValueError(f"cannot compare {a.dtype}{list(a.shape)} with {b.dtype}{list(b.shape)} bitwise")
    return bits(a) == bits(b)


def bitwise_differ_mask(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: True where the two bit patterns differ (`bitwise_equal_mask`'s complement, in one operation)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        raise ValueError(f"cannot compare {a.dtype}{list(a.shape)} with {b.dtype}{list(b.shape)} bitwise")
    return bits(a) != bits(b)


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when every element has the same bit pattern."""
    return bool(bitwise_equal_mask(a, b).all())


def ordered(x: torch.Tensor) -> torch.Tensor:
    """Map floats to integers (int32 for formats of 16 bits or fewer, else int64, wide enough for any distance)
    so that numeric order equals integer order and ±0 coincide.

    Positive patterns keep their value; a negative pattern `s|m` maps to `-m`. Adjacent
    representable values therefore differ by exactly 1, and the two zeros both map to 0.
    """
    b = bits(x)
    i = b.to(torch.int32 if b.element_size() <= 2 else torch.int64)
    magnitude = i & (_SIGN_BIT[b.dtype] - 1)
    return torch.where(i < 0, -magnitude, magnitude)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-element ulp distance on finite pairs; -1 where either element is not finite."""
    if a.dtype != b.dtype or a.shape != b.shape:
        raise ValueError(f"cannot compare {a.dtype}{list(a.shape)} with {b.dtype}{list(b.shape)}")
    finite = torch.isfinite(a) & torch.isfinite(b)
    return torch.where(finite, (ordered(a) - ordered(b)).abs(), -1)


@dataclass(frozen=True)
class OutputComparison:
    """Two outputs of one shape and dtype compared once, element by element.

    differs: True where the bit patterns differ (signed zeros differ, NaN payloads compared); ulp: the
    distance on finite pairs, -1 where either element is not finite (`ulp_distance`). A conformance unit
    computes this once and hands it to every check, its difference list and its summary, instead of each
    of them comparing the whole output again."""

    differs: torch.Tensor
    ulp: torch.Tensor

    @property
    def n_elements(self) -> int:
        return self.differs.numel()

    @property
    def n_differing(self) -> int:
        return int(self.differs.sum())

    @property
    def max_ulp(self) -> int | None:
        """Largest ulp distance over finite pairs, None when there is no finite pair (`max_ulp_distance`)."""
        finite = self.ulp[self.ulp >= 0]
        return int(finite.max()) if finite.numel() else None


def compare_outputs(a: torch.Tensor, b: torch.Tensor) -> OutputComparison:
    """The one element-by-element comparison of two outputs (`OutputComparison`)."""
    return OutputComparison(differs=bitwise_differ_mask(a, b), ulp=ulp_distance(a, b))


def max_ulp_distance(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """Largest ulp distance over finite pairs, or None when there is no finite pair."""
    d = ulp_distance(a, b)
    d = d[d >= 0]
    return int(d.max()) if d.numel() else None


def pow2_round(scale: torch.Tensor, mode: Pow2Mode = "nearest") -> torch.Tensor:
    """Round positive finite scales to powers of two: `2**round(log2 s)` (or ceil / floor).

    `nearest` rounds log2 to the nearest integer with ties away from zero (a scale exactly at
    2**(k+0.5) is irrational, so ties cannot occur for float inputs). Anything that is not a
    positive finite number is refused.
    """
    if mode not in ("nearest", "ceil", "floor"):
        raise InputError(f"pow2 rounding mode {mode!r} is unknown; use nearest, ceil or floor")
    s = scale.to(torch.float64)
    bad = ~torch.isfinite(s) | (s <= 0)
    if bool(bad.any()):
        first = s[bad][0].item()
        raise InputError(f"pow2 rounding needs positive finite scales; got {first!r} "
                         f"({int(bad.sum())} bad values)")
    mantissa, exponent = torch.frexp(s)  # s = m * 2**e with m in [0.5, 1): exact, no log2 rounding
    if mode == "floor":
        k = exponent - 1
    elif mode == "ceil":
        k = torch.where(mantissa == 0.5, exponent - 1, exponent)
    else:  # nearest in log2: up when m >= sqrt(1/2) (log2 m >= -0.5)
        k = torch.where(mantissa >= math.sqrt(0.5), exponent, exponent - 1)
    # 2**k from its bit pattern (k lies in fp64's normal range for any float32/float64-normal scale): exact on every
    # device, unlike torch.ldexp / torch.pow, whose CUDA results were seen a few ulps off (docs/fp8.md)
    return ((k.to(torch.int64) + 1023) << 52).view(torch.float64).to(scale.dtype)


def is_pow2(x: torch.Tensor) -> torch.Tensor:
    """Elementwise: x is a positive (normal or subnormal) power of two, exactly."""
    m, _ = torch.frexp(x.to(torch.float64))
    return (m == 0.5) & (x > 0)


def tiny(dtype: torch.dtype) -> float:
    """Smallest positive normal number of `dtype`."""
    return torch.finfo(dtype).tiny


def is_subnormal(x: torch.Tensor) -> torch.Tensor:
    """Elementwise: a nonzero finite value below the smallest normal of its own dtype."""
    a = x.abs()
    return (a > 0) & (a < tiny(x.dtype))


def round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round fp32 values to `dtype` with round-to-nearest-even (torch's casts do exactly that, on the
    CPU and on CUDA: `__float2bfloat16_rn`, `__float2half_rn`).

    From float64 to bfloat16 torch goes through float32 (two roundings), so that case rounds
    correctly with `round_f64_to_bf16` instead (on the CPU).
    """
    if x.dtype == torch.float64 and dtype == torch.bfloat16:
        return round_f64_to_bf16(x).to(x.device)
    return x.to(dtype)


def round_f64_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded (nearest-even) float64 → bfloat16, one rounding.

    Rounds to float32 with round-to-odd first (truncate, then set the last bit if inexact), then
    to bfloat16 with nearest-even. Round-to-odd at p+2 or more bits followed by nearest-even at p
    bits equals a single nearest-even rounding; float32 has 24 bits, bfloat16 8.
    """
    v = x.detach().cpu().numpy().astype(np.float64)
    with np.errstate(over="ignore"):
        f = v.astype(np.float32)
    over = np.abs(f.astype(np.float64)) > np.abs(v)  # rounded away from zero (or to inf): step back
    f = np.where(over & np.isfinite(v), np.nextafter(f, np.float32(0)), f)
    u = f.view(np.uint32).copy()
    inexact = np.isfinite(v) & (f.astype(np.float64) != v)
    u |= inexact.astype(np.uint32)
    rounded = ((u.astype(np.uint64) + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(v)
    rounded = np.where(nan, ((u >> 16) | 0x0040).astype(np.uint16), rounded)
    return torch.from_numpy(rounded.view(np.int16).copy()).view(torch.bfloat16).reshape(x.shape)
