"""An independent exact reference: rational arithmetic and correct rounding to binary formats.

Nothing here uses floating-point hardware: values are `fractions.Fraction`, rounding is done on
integers, so it can judge the library's bit tricks and fp64 arguments independently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class Format:
    precision: int  # significand bits including the implicit one
    emin: int  # exponent of the smallest normal number
    emax: int  # exponent of the largest finite number


FP32 = Format(24, -126, 127)
BF16 = Format(8, -126, 127)
FP16 = Format(11, -14, 15)


def round_nearest_even(x: Fraction, fmt: Format) -> Fraction | float:
    """x correctly rounded to `fmt` (ties to even); ±inf on overflow. Returns a Fraction or ±inf."""
    if x == 0:
        return Fraction(0)
    sign = -1 if x < 0 else 1
    a = abs(x)
    e = math.floor(math.log2(a.numerator) - math.log2(a.denominator))
    # fix e so that 2**e <= a < 2**(e+1)
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    quantum_exp = max(e, fmt.emin) - (fmt.precision - 1)
    q = Fraction(2) ** quantum_exp
    n = a / q
    floor = n.numerator // n.denominator
    rem = n - floor
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and floor % 2 == 1):
        floor += 1
    r = floor * q
    max_finite = (2 - Fraction(2) ** (1 - fmt.precision)) * Fraction(2) ** fmt.emax
    if r > max_finite:
        return sign * math.inf
    return sign * r
