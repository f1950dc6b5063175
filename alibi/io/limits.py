"""Bounds on sizes and values that come from the input, checked before anything is allocated.

Element budget. A tile's size on disk says nothing about the work it asks for: a 120 kB tile with
M = N = 60,000 and K = 1 makes the exact emulator hold a 60,000 × 60,000 int64 accumulator and a
few fp32/bf16 copies of the output (about 14 GB); `--rows 1000000000` asks a synthetic preset for
10⁹ × 1536 activations. So every GEMM alibi is asked to run is checked against an element budget
first: each of its three matrices, `M·K` (activations), `N·K` (weights) and `M·N` (accumulator and
outputs), must hold at most `max_elements()` elements.

The default, 2²⁸ = 268,435,456 elements, admits every shape the toolkit is used on (the largest,
M = N = K = 16,384, has 2²⁸ per matrix) and bounds the emulator's peak at roughly 40 bytes per
output element, about 11 GB. Raise it for bigger tiles with the environment variable
`ALIBI_MAX_ELEMENTS` (an integer, e.g. `ALIBI_MAX_ELEMENTS=1073741824`); the refusal names it.

Counts of work. A count from the command line asks for that much work up front: `--bootstrap
1000000000000` replicates or `--elements 1e30` output elements would run for longer than any machine
stays up, and the run would look busy, not wrong. So each is bounded, and refused before any input is
read or anything written (`check_count`): bootstrap replicates at `MAX_BOOTSTRAP` = 10⁶ (200 times
the larger default, 5000), output elements per M of `alibi sweep rows` at `MAX_SWEEP_ELEMENTS` = 10¹⁴
(10⁶ times the default 10⁸), seeds of `alibi sweep depth` at `MAX_SEEDS` = 10⁶.

Seeds. Every seed alibi takes (synthetic tiles, `alibi run`, `alibi conform`) seeds torch's CPU
generator, which accepts integers in [0, 2⁶⁴): one rule, `check_seed`, for all of them (a negative
seed would be silently mapped to another one by torch).
"""

from __future__ import annotations

import os

from alibi.errors import InputError, shown

DEFAULT_MAX_ELEMENTS = 2**28
MAX_ELEMENTS_ENV = "ALIBI_MAX_ELEMENTS"
SEED_LIMIT = 2**64
MAX_BOOTSTRAP = 10**6
MAX_SWEEP_ELEMENTS = 10**14
MAX_SEEDS = 10**6


def max_elements() -> int:
    """The element budget: `ALIBI_MAX_ELEMENTS` if set (a positive integer), else 2²⁸."""
    raw = os.environ.get(MAX_ELEMENTS_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_MAX_ELEMENTS
    try:
        value = int(raw.strip().replace("_", ""))
    except ValueError:
        raise InputError(f"{MAX_ELEMENTS_ENV}={shown(raw)} is not an integer; set it to an element count "
                         f"such as {DEFAULT_MAX_ELEMENTS}") from None
    if value < 1:
        raise InputError(f"{MAX_ELEMENTS_ENV}={value} must be positive")
    return value


def check_gemm_size(M: int, K: int, N: int, where: str) -> None:
    """InputError naming `where` unless `M·K`, `N·K` and `M·N` each fit the element budget."""
    budget = max_elements()
    for label, count in (("a_q is M×K", M * K), ("w_q is N×K", N * K), ("the output is M×N", M * N)):
        if count > budget:
            raise InputError(f"{where}: {label} = {count:,} elements (M={M}, K={K}, N={N}), over the element "
                             f"budget of {budget:,}; raise it with {MAX_ELEMENTS_ENV}=N if the machine has the "
                             "memory (about 40 bytes per output element)")


def check_count(value: int, option: str, limit: int, unit: str) -> int:
    """`value` itself unless it is over `limit` (module docstring: counts of work); InputError naming `option`."""
    if value > limit:
        raise InputError(f"{option} {_count(value)} {unit} is over the limit of {_count(limit)}: a run that large "
                         f"would not finish; give at most {_count(limit)} (nothing was run or written)")
    return value


def _count(n: int) -> str:
    return f"{n:,}" if n < 10**9 else f"{n:.3g}".replace("e+", "e")


def check_seed(seed: object, where: str = "seed") -> int:
    """`seed` itself if it is an integer in [0, 2⁶⁴) (booleans are not seeds); InputError naming `where` otherwise."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < SEED_LIMIT:
        raise InputError(f"{where} must be an integer from 0 to 2^64 - 1, got {shown(seed)}")
    return seed


__all__ = ["DEFAULT_MAX_ELEMENTS", "MAX_BOOTSTRAP", "MAX_ELEMENTS_ENV", "MAX_SEEDS", "MAX_SWEEP_ELEMENTS", "SEED_LIMIT",
           "check_count", "check_gemm_size", "check_seed", "max_elements"]
