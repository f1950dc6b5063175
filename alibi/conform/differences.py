"""Where two arms' outputs differ: the positions and both values of the differing elements of one unit.

A unit's `n_differing` says how many output elements differ in any bit; this module says which.
For every differing element it records the row and column, both bit patterns (hex, the exact
values) and both values as numbers (bf16 and fp16 widen exactly to a Python float), and the ulp
distance between them. The list is capped at `DIFFERENCE_CAP` elements per unit so that a report
over kernels that differ everywhere (fp8, or a faulty kernel) stays small; `count` always holds
the full number, so a truncated list says so (`count > len(elements)`). Elements are listed in
row-major order (row, then column), the first `cap` of them: the same operands give the same list.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from alibi.io.typed import TypedResult

if TYPE_CHECKING:
    import torch

    from alibi.exact.numerics import OutputComparison

SCHEMA = "alibi.differences/v1"
# Elements listed per unit. SmolLM2-135M's real-scale units differ in at most 7 elements each at
# M = 512; 32 lists every such difference while bounding a fully divergent unit to a few kB.
DIFFERENCE_CAP = 32


def _number(x: float) -> float | str:
    """A finite value as a float; inf, -inf and nan as strings (JSON has no literal for them)."""
    return x if math.isfinite(x) else str(x)


@dataclass(frozen=True)
class ElementDifference:
    """One output element on which the arms differ.

    row, column: the element's position in the `[M, N]` output; a_bits, b_bits: each arm's bit
    pattern as `0x`-prefixed hex of the output width (4 digits for bf16/fp16); a, b: the values
    (a float, or "inf" / "-inf" / "nan"); ulp: their ulp distance (None when either is not finite).
    """

    row: int
    column: int
    a_bits: str
    b_bits: str
    a: float | str
    b: float | str
    ulp: int | None


@dataclass(frozen=True)
class Differences(TypedResult):
    """The differing elements of one unit: `count` in all, the first `cap` of them in `elements`."""

    SCHEMA = SCHEMA

    schema: str = field(default=SCHEMA, kw_only=True)  # first: the stored object names its schema first
    count: int
    cap: int
    elements: tuple[ElementDifference, ...]

    @property
    def truncated(self) -> bool:
        return self.count > len(self.elements)


def differing_elements(out_a: torch.Tensor, out_b: torch.Tensor, comparison: OutputComparison,
                       cap: int = DIFFERENCE_CAP) -> Differences:
    """The elements of two `[M, N]` outputs whose bit patterns differ (see the module docstring), read from
    `comparison`, the unit's one comparison of the two (`alibi.exact.numerics.compare_outputs`).

    Bitwise, as every check: `+0` and `-0` differ, NaN payloads are compared.
    """
    if out_a.dim() != 2:
        raise ValueError(f"differing_elements: expected [M, N] outputs, got {list(out_a.shape)}")
    return first_differences(out_a.unsqueeze(0), out_b.unsqueeze(0), comparison.differs.unsqueeze(0),
                             comparison.ulp.unsqueeze(0), [comparison.n_differing], cap)[0]


# `listed_differences` finds a unit's j-th differing element in two steps: the block of this many elements that holds it
# (a running count over the blocks' counts), then its place in that block (a running count over the block).
SEARCH_BLOCK = 1024
LISTED_COLUMNS = 6  # `listed_differences`: position, both bit patterns, both values, ulp distance


def listed_differences(out_a: torch.Tensor, out_b: torch.Tensor, differs: torch.Tensor, ulp: torch.Tensor,
                       cap: int = DIFFERENCE_CAP) -> torch.Tensor:
    """[6, B, cap] float64, on the outputs' device: for each unit of a batch (outputs, difference masks and ulp
    distances [B, M, N]), its first `cap` differing elements in row-major order, as columns: the flat position, both
    bit patterns, both values and the ulp distance (every column exact in float64: positions < 2^53, patterns of ≤ 32
    bits). A unit's j-th differing element is found by searching running counts, of its blocks of `SEARCH_BLOCK`
    elements and then within the block that holds it, so nothing is read back to find it (a running count over a
    whole output is slow on a GPU); the rows past a unit's count hold a stand-in element, which `differences_from`
    leaves out."""
    import torch  # torch: only when computing

    from alibi.exact.numerics import bits  # torch: only when computing

    B = differs.shape[0]
    n = differs[0].numel()
    blocks = -(-n // SEARCH_BLOCK)
    mask = torch.zeros((B, blocks * SEARCH_BLOCK), dtype=torch.int32, device=differs.device)
    mask[:, :n] = differs.reshape(B, n)
    mask = mask.view(B, blocks, SEARCH_BLOCK)
    per_block = mask.sum(-1, dtype=torch.int64)
    through = per_block.cumsum(1)  # differing elements up to the end of each block
    wanted = torch.arange(1, cap + 1, device=differs.device).expand(B, cap).contiguous()
    block = torch.searchsorted(through, wanted).clamp_(max=blocks - 1)  # the block holding the j-th
    rank = wanted - (through - per_block).gather(1, block)  # its rank within the block (1-based)
    inside = mask.gather(1, block.unsqueeze(-1).expand(B, cap, SEARCH_BLOCK)).cumsum(-1)
    at = torch.searchsorted(inside, rank.unsqueeze(-1)).squeeze(-1)
    positions = (block * SEARCH_BLOCK + at).clamp_(max=n - 1)
    # gathered as bit patterns: a float gather may quiet a NaN's payload
    a_bits, b_bits = (bits(out).reshape(B, -1).gather(1, positions) for out in (out_a, out_b))
    return torch.stack([positions.double(), a_bits.double(), b_bits.double(), a_bits.view(out_a.dtype).double(),
                        b_bits.view(out_b.dtype).double(), ulp.reshape(B, -1).gather(1, positions).double()])


def differences_from(listed: list[float], counts: list[int], N: int, element_size: int, cap: int = DIFFERENCE_CAP
                     ) -> list[Differences]:
    """The `Differences` of each unit from `listed_differences`' columns on the host (`listed`: flat, row-major
    [LISTED_COLUMNS, B, cap]), each unit's number of differing elements (`counts`), the outputs' width N and element
    size in bytes."""
    width = 2 * element_size  # hex digits of one element
    mask = (1 << (8 * element_size)) - 1
    B = len(counts)
    found = []
    for u, n in enumerate(counts):
        rows = [listed[(c * B + u) * cap:(c * B + u) * cap + min(n, cap)] for c in range(LISTED_COLUMNS)]
        elements = []
        for pos, ab, bb, va, vb, d in zip(*rows, strict=True):
            pos, ab, bb = int(pos), int(ab), int(bb)
            elements.append(ElementDifference(pos // N, pos % N, f"0x{ab & mask:0{width}x}", f"0x{bb & mask:0{width}x}",
                                              _number(va), _number(vb), None if d < 0 else int(d)))
        found.append(Differences(n, cap, tuple(elements)))
    return found


def first_differences(out_a: torch.Tensor, out_b: torch.Tensor, differs: torch.Tensor, ulp: torch.Tensor,
                      counts: list[int], cap: int = DIFFERENCE_CAP) -> list[Differences]:
    """`differing_elements` of a batch of units at once: outputs, difference masks and ulp distances [B, M, N], and
    each unit's number of differing elements (`counts`); the first `cap` of each unit in row-major order."""
    if not any(counts):
        return [Differences(0, cap, ()) for _ in counts]
    return differences_from(listed_differences(out_a, out_b, differs, ulp, cap).reshape(-1).cpu().tolist(), counts,
                            differs.shape[-1], out_a.element_size(), cap)


__all__ = ["DIFFERENCE_CAP", "LISTED_COLUMNS", "SCHEMA", "SEARCH_BLOCK", "Differences", "ElementDifference",
           "differences_from", "differing_elements", "first_differences", "listed_differences"]
