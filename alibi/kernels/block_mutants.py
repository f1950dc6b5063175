"""Positive controls for block-scaled fp8 kernels: `mutant:<fault>[@<severity>]:<block-scaled base>`.

Each recomputes the selected outputs of a block-scaled base from the base's declared `BlockSchedule` with one fault
in it (`alibi.exact.fp8_block_mma`), and declares the base's schedule and epilogue all the same, as a buggy kernel
would:

| fault | what it does |
|---|---|
| `wrong-block-scale` | the partial of k block b promoted with the activation scales of block b + 1 (the last block with block 0's): an off-by-one index into the [M, K/128] scale tensor |
| `promotion-interval` | chains twice the declared length: two scale blocks accumulated in one tensor-core chain before one promotion, with the scales current at the promotion (the second block's) |
| `reordered-blocks` | the chains promoted in descending k instead of the declared order |
| `null` | the base's own output (false-positive control) |

A fault that changes no bit on a tile is unobservable there, not missed: the scale and interval faults need K of two
scale blocks or more (the `smollm2-135m-fp8-block` preset has K = 576 and 1536).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from alibi.errors import InputError
from alibi.exact.emulator import apply_epilogue
from alibi.exact.fp8_block_mma import RESCALE, BlockSchedule, accumulate_blocks
from alibi.kernels.base import Kernel
from alibi.kernels.cpu import unit_scales
from alibi.kernels.mutants import ALL, ScheduleMutantKernel, Severity
from alibi.tiles.tile import BLOCK_FORMAT, Tile


def _twice_the_interval(s: BlockSchedule) -> BlockSchedule:
    if s.promotion == RESCALE:
        raise InputError(f"schedule {s.label!r} runs one rescaled chain: it has no promotion interval to get wrong")
    return replace(s, label=f"{s.label} promoted every {2 * s.chain_k} k", chain_k=2 * s.chain_k)


def _reversed_blocks(s: BlockSchedule) -> BlockSchedule:
    if s.promotion == RESCALE:
        raise InputError(f"schedule {s.label!r} runs one rescaled chain: it has no promotion order to reverse")
    return replace(s, label=f"{s.label} promoted in reverse",
                   order="ascending" if s.order == "descending" else "descending")


def _next_block_scales(s_a: torch.Tensor) -> torch.Tensor:
    return torch.roll(s_a, -1, dims=-1)


@dataclass(frozen=True)
class BlockFault:
    """A fault in a block-scaled kernel's accumulation: `schedule` turns the declared schedule into the faulty one,
    `activation_scales` the [M, G] activation scales into the ones it uses; summary: one line for tables."""

    name: str
    summary: str
    schedule: Callable[[BlockSchedule], BlockSchedule] | None = None
    activation_scales: Callable[[torch.Tensor], torch.Tensor] | None = None


BLOCK_FAULTS: dict[str, BlockFault] = {f.name: f for f in (
    BlockFault("wrong-block-scale", "each k block's partial promoted with the next block's activation scales",
               activation_scales=_next_block_scales),
    BlockFault("promotion-interval", "two scale blocks chained before one promotion (the interval off by one block)",
               schedule=_twice_the_interval),
    BlockFault("reordered-blocks", "the k blocks promoted in reverse order", schedule=_reversed_blocks),
    BlockFault("null", "no fault: the base's own output (false-positive control)"),
)}


class BlockFp8MutantKernel(ScheduleMutantKernel):
    """A block-scaled `base` whose selected outputs are recomputed from its declared schedule with a fault in it;
    it declares the base's schedule and epilogue all the same."""

    formats = (BLOCK_FORMAT,)
    scaled_accumulator = True
    tiles, base_needed, faults, wrapper = "block-scaled fp8 tiles", "a block-scaled fp8 base", "block", "block fp8"
    fault: BlockFault

    def __init__(self, f: BlockFault, severity: Severity, base: Kernel, name: str | None = None):
        super().__init__(f, severity, base, name)
        self.layout = getattr(base, "layout", None)

    def _faulty_acc(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                    layout) -> torch.Tensor:
        M, K = a_q.shape
        declared = self.base.schedule_at(M, w_q.shape[0], K)
        if not isinstance(declared, BlockSchedule) or not declared.deterministic:
            raise InputError(f"mutant {self.name!r}: its base declares no deterministic block schedule at this shape, "
                             "so the fault cannot be computed from it")
        schedule = self.fault.schedule(declared) if self.fault.schedule else declared
        sa = self.fault.activation_scales(s_a) if self.fault.activation_scales else s_a
        return accumulate_blocks(schedule, a_q, sa, w_q, s_w, layout)

    def faulty(self, tile: Tile, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        a_q, s_a, w_q, s_w = (x.to(dev) for x in (tile.a_q, tile.s_a, tile.w_q, tile.s_w))
        acc = self._faulty_acc(a_q, s_a, w_q, s_w, tile.block_layout)
        return acc, apply_epilogue(self.base.epilogue_at(tile.M), acc, *unit_scales(acc),
                                   None if tile.bias is None else tile.bias.to(dev), tile.out_dtype)

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor, s_a: torch.Tensor | None = None,
                    s_w: torch.Tensor | None = None) -> torch.Tensor | None:
        base = self.base.accumulator(a_q, w_q, s_a, s_w)
        if base is None or self.layout is None:
            return base
        mask = self.severity.mask((a_q.shape[0], w_q.shape[0])).to(base.device)
        return torch.where(mask, self._faulty_acc(a_q, s_a, w_q, s_w, self.layout), base)


_NAME = re.compile(r"mutant:(?P<fault>[a-z0-9-]+)(?:@(?P<severity>[^:]+))?:(?P<base>.+)")


def parse_block_mutant(name: str, kernel_named: Callable[[str], Kernel]) -> Kernel | None:
    """The block mutant `mutant:<fault>[@<severity>]:<base>` when `<fault>` is a block fault and `<base>` a
    block-scaled kernel; None otherwise (the other mutants' parser decides)."""
    m = _NAME.fullmatch(name)
    if m is None or m.group("fault") not in BLOCK_FAULTS:
        return None
    base = kernel_named(m.group("base"))
    if BLOCK_FORMAT not in base.formats:
        return None
    severity = Severity.parse(m.group("severity")) if m.group("severity") else ALL
    return BlockFp8MutantKernel(BLOCK_FAULTS[m.group("fault")], severity, base, name)


__all__ = ["BLOCK_FAULTS", "BlockFault", "BlockFp8MutantKernel", "parse_block_mutant"]
