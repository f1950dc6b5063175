"""Which block schedule does a black-box block-scaled fp8 kernel run? Read from its output bits (`alibi identify`).

A block-scaled kernel's schedule (`alibi.exact.fp8_block_mma.BlockSchedule`) has four parts: the promotion (its
association and whether it is one FMA, or a rescaled chain), the interval, the order of the blocks, and a split of
K. Two tiles read them:

* the association probe (`alibi.tiles.block_probe.association_probe_tile`, 15 × 1920 × 256): every output sits on a
  bf16 rounding tie that the last promotion decides, so each pair of the six promotions gives different outputs on
  at least one element. Each promotion is run through the emulator and compared bit for bit with the kernel's
  output. A kernel that refuses the probe (FBGEMM's takes one activation scale per 256 rows) is read from the random
  tiles alone, and the probe is reported not applicable with its refusal.
* a random block tile per shape (`random_block_tile`: Gaussian activations with a heavy-tailed column spread and
  weights, quantised as the checkpoints are, `alibi.exact.fp8_block`), run twice (the second run tells a
  run-to-run difference, which only a nondeterministic reduction explains), and compared bit for bit with the
  emulator under the declared schedule, every promotion of `candidate_block_schedules` at 128 k on the declared
  schedule's tensor-core step (`wgmma`'s where none is declared) and the same promotions with the blocks in reverse
  or K split in 2 or 4 parts (`SPLITS`): all of them, since on a bf16 tile a plain promotion can reproduce a split
  kernel's output by chance (cuBLASLt's split-2 shapes were first misread so). Where none matches, every promotion
  on the other steps of `STEP_PARTS` (the f16 `mma.sync` of a 16-row Triton dot) too.

A declared schedule matches at a shape when its emulation equals the kernel's output on every element of the random
tile and, where the probe applies, on every element of the probe. A kernel that declares none (`cublaslt-fp8-block`
until it has been read) never matches: `alibi identify` exits 1 and prints what does. A declaration of a
nondeterministic reduction (split-K with atomics, stream-K) is not checked bit for bit: it is reported with the
run-to-run result, and neither passes nor fails the kernel there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from alibi.errors import InputError
from alibi.exact.emulator import apply_epilogue
from alibi.exact.fp8_block import DEEPSEEK_V3, LAYOUT_KEY, BlockLayout, quantize_fp8_blocks, quantize_fp8_groups
from alibi.exact.fp8_block_mma import (
    PROMOTIONS,
    STEP_PARTS,
    BlockSchedule,
    accumulate_blocks,
    candidate_block_schedules,
    parse_block_schedule,
    step_part,
)
from alibi.exact.fp8_mma import WGMMA_FP8, StepModel
from alibi.exact.numerics import bitwise_differ_mask, bitwise_equal_mask
from alibi.kernels.base import Kernel
from alibi.kernels.cpu import unit_scales
from alibi.tiles.block_probe import association_probe_tile
from alibi.tiles.tile import Tile

SPLITS = ("reverse", "split-2", "split-4")  # the variants tried when no plain promotion matches
PROBE_SHAPE = (15, 1920, 256)  # association_probe_tile's, for all six promotions


@dataclass(frozen=True)
class BlockCandidate:
    """One schedule checked bit for bit: differing elements of the tile it was compared on."""

    schedule: str
    n_differing: int
    n_elements: int

    @property
    def matches(self) -> bool:
        return self.n_differing == 0


@dataclass(frozen=True)
class ProbeReading:
    """The association probe: every promotion's differing elements, or why it does not apply; the kernel's
    declaration at the probe's shape (None: undeclared) and whether its promotion matched there (None: not
    applicable or not checked)."""

    applicable: bool
    reason: str
    candidates: tuple[BlockCandidate, ...]
    declared: str | None = None
    declared_matches: bool | None = None

    @property
    def matched(self) -> list[str]:
        return [c.schedule for c in self.candidates if c.matches]


@dataclass(frozen=True)
class BlockShapeIdentification:
    """One shape: the declared schedule (None: undeclared), whether it matches (None: declared nondeterministic, not
    checked), whether two runs of the random tile gave the same bits, and every candidate checked."""

    M: int
    N: int
    K: int
    declared: str | None
    declared_matches: bool | None
    run_to_run_identical: bool
    candidates: tuple[BlockCandidate, ...]

    @property
    def matched(self) -> list[str]:
        return [c.schedule for c in self.candidates if c.matches]


@dataclass(frozen=True)
class BlockIdentification:
    """`identify_block_schedule`: the probe and each shape; `ok` when the declaration matched everywhere it was
    checked (and somewhere)."""

    kernel: str
    probe: ProbeReading
    shapes: tuple[BlockShapeIdentification, ...]

    @property
    def ok(self) -> bool:
        checked = [s.declared_matches for s in self.shapes if s.declared_matches is not None]
        return bool(checked) and all(checked) and self.probe.declared_matches is not False


def random_block_tile(M: int, N: int, K: int, seed: int, out_dtype: torch.dtype = torch.bfloat16, *,
                      activation_rows: int = 1, layout: BlockLayout = DEEPSEEK_V3) -> Tile:
    """A block-scaled tile quantised from Gaussian values (columns spread by a log-normal factor, so the groups'
    scales differ), as the checkpoints and vLLM's group quantiser make them. `activation_rows` > 1: every aligned
    block of that many rows shares its activation scales (each group's amax taken over the block), for kernels that
    take one activation scale per block of rows."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g) * torch.exp(torch.randn(1, K, generator=g))
    w = torch.randn(N, K, generator=g) * 0.05
    w_q, s_w = quantize_fp8_blocks(w, layout)
    if activation_rows > 1:
        blocks = -(-M // activation_rows)
        padded = torch.nn.functional.pad(a, (0, 0, 0, blocks * activation_rows - M))
        # the row of each block holding its group amax is copied into the block's first row, so one group
        # quantisation of the first rows gives the block's scales; every row is then divided by them
        amax_rows = padded.abs().reshape(blocks, activation_rows, K).amax(1)
        _, s_first = quantize_fp8_groups(amax_rows, layout.block_k)
        s_a = s_first.repeat_interleave(activation_rows, dim=0)[:M]
        a_q = (a / s_a.repeat_interleave(layout.block_k, dim=1)[:, :K]).clamp(-448, 448).to(torch.float8_e4m3fn)
    else:
        a_q, s_a = quantize_fp8_groups(a, layout.block_k)
    meta = {"kind": "random-fp8-block", LAYOUT_KEY: layout.text, "seed": str(seed)}
    return Tile(f"random-fp8-block-{M}x{N}x{K}-{seed}", a_q, s_a, w_q, s_w, None, out_dtype, meta).validate()


def _emulated(schedule: BlockSchedule, tile: Tile, kernel: Kernel, dev: str) -> torch.Tensor:
    a_q, s_a, w_q, s_w = (x.to(dev) for x in (tile.a_q, tile.s_a, tile.w_q, tile.s_w))
    acc = accumulate_blocks(schedule, a_q, s_a, w_q, s_w, tile.block_layout or DEEPSEEK_V3)
    return apply_epilogue(kernel.epilogue_at(tile.M), acc, *unit_scales(acc), None, tile.out_dtype).cpu()


def _checked(schedule: BlockSchedule, tile: Tile, out: torch.Tensor, kernel: Kernel, dev: str) -> BlockCandidate:
    try:
        expected = _emulated(schedule, tile, kernel, dev)
    except InputError:  # a schedule that does not fit this K (e.g. more parts than chains)
        return BlockCandidate(schedule.label, out.numel(), out.numel())
    return BlockCandidate(schedule.label, int(bitwise_differ_mask(out, expected).sum()), out.numel())


def read_probe(kernel: Kernel, seed: int = 0) -> ProbeReading:
    """Run the association probe through `kernel` and check every promotion on it (module docstring)."""
    tile = association_probe_tile(seed)
    declared = kernel.schedule_at(*PROBE_SHAPE)
    label = None if declared is None else declared.label
    if tile.out_dtype not in getattr(kernel, "out_dtypes", (tile.out_dtype,)):
        return ProbeReading(False, f"{kernel.name} does not write {tile.out_dtype}", (), label)
    try:
        out = kernel.run(tile).out
    except InputError as refusal:
        return ProbeReading(False, f"{kernel.name} refuses the probe: {refusal}", (), label)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    schedules = {s.label: s for s in candidate_block_schedules(128, WGMMA_FP8 if declared is None else declared.step)}
    if declared is not None and declared.deterministic:
        schedules.setdefault(declared.label, declared)
    cands = tuple(_checked(s, tile, out, kernel, dev) for s in schedules.values())
    matched = None if label is None or not declared.deterministic else any(
        c.matches and c.schedule == label for c in cands)
    return ProbeReading(True, f"association probe {PROBE_SHAPE[0]}x{PROBE_SHAPE[1]}x{PROBE_SHAPE[2]}", cands,
                        label, matched)


def _variants(promotion: str, step: StepModel) -> list[BlockSchedule]:
    return [parse_block_schedule(f"block128:{promotion}:{v}{step_part(step)}") for v in SPLITS]


def identify_block_schedule(kernel: Kernel, shapes: list[tuple[int, int, int]], *, seed: int = 0,
                            out_dtype: torch.dtype | None = None) -> BlockIdentification:
    """The probe, then per shape the declared schedule and the candidates on a random tile (module docstring)."""
    out_dtype = out_dtype or getattr(kernel, "out_dtypes", (torch.bfloat16,))[0]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    probe = read_probe(kernel, seed)
    results = []
    for M, N, K in shapes:
        tile = random_block_tile(M, N, K, seed, out_dtype, activation_rows=getattr(kernel, "activation_rows", 1))
        out = kernel.run(tile).out
        again = kernel.run(tile, evidence=False).out
        identical = bool(bitwise_equal_mask(out, again).all())
        declared = kernel.schedule_at(M, N, K)
        if declared is not None and not isinstance(declared, BlockSchedule):
            raise InputError(f"kernel {kernel.name!r} declares {declared!r}, not a block schedule")
        checked: dict[str, BlockCandidate] = {}
        declared_ok: bool | None = None
        if declared is not None and declared.deterministic:
            checked[declared.label] = _checked(declared, tile, out, kernel, dev)
            declared_ok = checked[declared.label].matches
        step = WGMMA_FP8 if declared is None else declared.step
        # every variant, always: on a bf16 tile a plain promotion can match by chance where the kernel splits K
        for cand in candidate_block_schedules(128, step) + [c for p in PROMOTIONS for c in _variants(p, step)]:
            if cand.label not in checked:
                checked[cand.label] = _checked(cand, tile, out, kernel, dev)
        if not any(c.matches for c in checked.values()):
            for cand in [c for m in STEP_PARTS.values() if m != step for c in candidate_block_schedules(128, m)]:
                checked[cand.label] = _checked(cand, tile, out, kernel, dev)
        results.append(BlockShapeIdentification(M, N, K, None if declared is None else declared.label, declared_ok,
                                                 identical, tuple(checked.values())))
    return BlockIdentification(kernel.name, probe, tuple(results))


__all__ = ["BlockCandidate", "BlockIdentification", "BlockShapeIdentification", "ProbeReading",
           "identify_block_schedule", "random_block_tile", "read_probe"]
