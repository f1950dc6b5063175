"""A slow, scalar restatement of the fp8 MMA step model in Python integers: the reference the tests hold
`alibi.exact.fp8_mma` to.

It shares no code with the vectorised model: bytes are decoded by hand into (sign, integer significand, exponent of
its last bit), every term is an exact integer multiple of a power of two, cuts are integer shifts, and the fp32
result is assembled from its bit fields. Finite terms only (the vectorised model's NaN/Inf rules are tested on
crafted cases).
"""

from __future__ import annotations

import struct

# (mantissa bits, exponent bias, exponent mask) of the two fp8 formats by name
FORMATS = {"e4m3": (3, 7, 0xF), "e5m2": (2, 15, 0x1F)}


def fp8_term(byte: int, fmt: str) -> tuple[int, int, int]:
    """(signed integer significand, exponent of its unit bit, nominal exponent) of one finite fp8 byte: the value
    is `sig · 2^unit`; the nominal exponent is the one the step aligns with (the minimum for subnormals)."""
    mant_bits, bias, mask = FORMATS[fmt]
    sign = -1 if byte & 0x80 else 1
    field = (byte >> mant_bits) & mask
    mant = byte & ((1 << mant_bits) - 1)
    if field == 0:
        return sign * mant, 1 - bias - mant_bits, 1 - bias
    return sign * ((1 << mant_bits) | mant), field - bias - mant_bits, field - bias


def fp32_term(value: float) -> tuple[int, int, int]:
    """(signed integer significand, unit exponent, nominal exponent) of a finite fp32 value."""
    (u,) = struct.unpack("<I", struct.pack("<f", value))
    sign = -1 if u >> 31 else 1
    field, mant = (u >> 23) & 0xFF, u & 0x7FFFFF
    if field == 0:
        return sign * mant, -149, -126
    return sign * ((1 << 23) | mant), field - 150, field - 127


def _cut(sig: int, shift: int, toward_minus_inf: bool) -> int:
    """`sig · 2^shift` cut to an integer (toward zero, or toward −∞)."""
    if shift >= 0:
        return sig << shift
    if toward_minus_inf:
        return sig >> -shift  # Python's >> on negative integers floors
    magnitude = abs(sig) >> -shift
    return magnitude if sig >= 0 else -magnitude


def to_fp32(sig: int, unit: int) -> float:
    """The fp32 value `sig · 2^unit`, which must be representable exactly (at most 24 significant bits, in range)."""
    if sig == 0:
        return 0.0
    sign = 1 if sig < 0 else 0
    mag = abs(sig)
    top = mag.bit_length() - 1 + unit  # exponent of the leading bit
    if top >= -126:
        # normalise to 24 bits
        shift = 23 - (mag.bit_length() - 1)
        m = mag << shift if shift >= 0 else mag >> -shift
        assert (m >> 23) == 1 and (shift >= 0 or (mag & ((1 << -shift) - 1)) == 0), "not exact in fp32"
        u = (sign << 31) | ((top + 127) << 23) | (m & 0x7FFFFF)
    else:
        shift = unit + 149
        assert shift >= 0, "below fp32's subnormal grid"
        u = (sign << 31) | (mag << shift)
    return struct.unpack("<f", struct.pack("<I", u))[0]


def step(a_bytes: list[int], b_bytes: list[int], c: float, *, fmt_a: str = "e4m3", fmt_b: str = "e4m3",
         align_bits: int = 13, result_bits: int = 13, toward_minus_inf: bool = False) -> float:
    """One step: `c` plus Σ a_i·b_i over the given bytes (finite values only), as the published model adds them."""
    terms = []  # (sig, unit, nominal exponent or None for a zero)
    for x, y in zip(a_bytes, b_bytes, strict=True):
        sa, ua, ea = fp8_term(x, fmt_a)
        sb, ub, eb = fp8_term(y, fmt_b)
        terms.append((sa * sb, ua + ub, ea + eb if sa * sb else None))
    sc, uc, ec = fp32_term(c)
    terms.append((sc, uc, ec))
    E = max([-126] + [e for _, _, e in terms if e is not None])
    grid = E - align_bits  # every term is cut to a multiple of 2^grid
    total = sum(_cut(sig, unit - grid, toward_minus_inf) for sig, unit, _ in terms)
    if total == 0:
        return 0.0
    lead = abs(total).bit_length() - 1  # total·2^grid has its leading bit at 2^(lead + grid)
    keep = _cut(total, result_bits - lead, toward_minus_inf)  # result_bits fractional bits below the leading one
    return to_fp32(keep, lead - result_bits + grid)


def chain(a_bytes: list[int], b_bytes: list[int], c: float = 0.0, k: int = 32, **kw) -> float:
    """Steps of `k` products in order, each feeding the next (len(a_bytes) a multiple of k)."""
    for k0 in range(0, len(a_bytes), k):
        c = step(a_bytes[k0:k0 + k], b_bytes[k0:k0 + k], c, **kw)
    return c


__all__ = ["FORMATS", "chain", "fp32_term", "fp8_term", "step", "to_fp32"]
