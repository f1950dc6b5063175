"""Which accumulation schedule does a black-box fp8 kernel run? Read from its output bits (`alibi identify` on fp8).

The probe. Inside one chain of MMA steps, a product far smaller than the running sum is cut away (the step keeps 13
fractional bits of the largest term); a chain added into a full fp32 accumulator — a promotion, or a split-K part
reduced in fp32 — keeps it (24 bits). So a small product placed one step after a large one survives exactly when a
chain boundary lies between them. To read that through a bf16 (or fp16) output with scales of 1, the large term is
a rounding tie of the output format: `1 + 2^-8` (fp16: `1 + 2^-11`) is exactly halfway between two bf16 values and
rounds to even, 1, unless the small product `2^-18` survived and tips it up. Column n of a probe tile tests the step
boundary `t` (the tie in step t − 1, the small product in step t) on every row, so the tile's output shows, for each
k offset `32·t`, whether the kernel starts a new chain there, on every output tile it computes. One tile tests up to
N boundaries; K / 32 − 1 are tested in all.

The boundaries say where chains start; which fp32 additions combine them (promotion in order, split-K parts reduced
in some order) and the rest of the step model are then checked on random operands: each candidate schedule whose
boundaries match is run through the emulator with the kernel's declared epilogue and compared bit for bit with the
kernel's output (`identify_schedule`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from alibi.errors import InputError
from alibi.exact.emulator import apply_epilogue
from alibi.exact.fp8_mma import FAST_ACCUM, AccumulationSchedule, SplitK, accumulate
from alibi.exact.numerics import bitwise_differ_mask, bitwise_equal_mask, dtype_name
from alibi.kernels.base import Kernel
from alibi.tiles.tile import Tile

E4M3 = torch.float8_e4m3fn
STEP = 32
# (tie term's second factor pair, so that 1 + a·b is a tie of the output format) per output dtype
TIE = {torch.bfloat16: (2.0 ** -4, 2.0 ** -4), torch.float16: (2.0 ** -5, 2.0 ** -6)}
MAX_OTHERS = 3  # candidates besides the declared one checked bit for bit per shape (same boundaries, other additions)
SMALL = 2.0 ** -9  # the small product is SMALL·SMALL = 2^-18: below the 2^-13 grid of a chain holding 1, above fp32's 2^-23


@dataclass(frozen=True)
class BoundaryProbe:
    """One probe tile and the boundary (a step index t ≥ 1: k offset 32·t) each of its columns tests."""

    tile: Tile
    column_boundary: tuple[int, ...]


def boundary_probes(M: int, N: int, K: int, out_dtype: torch.dtype = torch.bfloat16) -> list[BoundaryProbe]:
    """The probe tiles for an M × N × K call (module docstring): every boundary 1 … K/32 − 1 tested, in as many
    tiles of N columns as it takes (each boundary on several columns when N allows)."""
    if out_dtype not in TIE:
        raise InputError(f"schedule probes need bfloat16 or float16 output, got {dtype_name(out_dtype)}")
    steps = -(-K // STEP)
    if steps < 2:
        raise InputError(f"K={K}: a schedule probe needs at least two steps of {STEP} (K ≥ 33)")
    boundaries = [t for t in range(1, steps) if t * STEP + 2 < K]  # the small product must fit in step t
    x, y = TIE[out_dtype]
    a = torch.zeros(K, dtype=torch.float64)
    for t in range(steps):
        for offset, value in ((0, 1.0), (1, x), (2, SMALL)):
            if t * STEP + offset < K:
                a[t * STEP + offset] = value
    out = []
    for first in range(0, len(boundaries), N):
        chunk = boundaries[first:first + N]
        cols = [chunk[n % len(chunk)] for n in range(N)]
        w = torch.zeros((N, K), dtype=torch.float64)
        for n, t in enumerate(cols):
            w[n, (t - 1) * STEP] = 1.0
            w[n, (t - 1) * STEP + 1] = y
            w[n, t * STEP + 2] = SMALL
        # per-tensor scales of 1: every fp8 kernel takes them (tensor-wise ones take nothing else)
        tile = Tile(f"schedule-probe-{M}x{N}x{K}-{first // N}", a.expand(M, K).to(E4M3).contiguous(),
                    torch.ones(1), w.to(E4M3), torch.ones(1), None, out_dtype,
                    {"kind": "schedule-probe", "boundaries": ",".join(map(str, sorted(set(cols))))})
        out.append(BoundaryProbe(tile, tuple(cols)))
    return out


@dataclass(frozen=True)
class BoundaryReading:
    """What the probe read at one shape: the k offsets where a chain boundary was seen on every output element
    that tests it (`boundaries`), and those seen on some elements only (`partial`: the schedule differs between
    output tiles, e.g. stream-K)."""

    M: int
    N: int
    K: int
    boundaries: tuple[int, ...]
    partial: tuple[int, ...]


def read_boundaries(kernel: Kernel, M: int, N: int, K: int, out_dtype: torch.dtype = torch.bfloat16) -> BoundaryReading:
    """Run the probe tiles of this shape through `kernel` and read its chain boundaries."""
    x, y = TIE[out_dtype]
    tie_up = torch.tensor(1 + x * y + 2.0 ** -18, dtype=torch.float64).to(out_dtype)
    tie_down = torch.tensor(1 + x * y, dtype=torch.float64).to(out_dtype)
    seen: dict[int, list[bool]] = {}
    for probe in boundary_probes(M, N, K, out_dtype):
        out = kernel.run(probe.tile).out
        up = bitwise_equal_mask(out, tie_up.expand_as(out))
        down = bitwise_equal_mask(out, tie_down.expand_as(out))
        if not bool((up | down).all()):
            bad = (~(up | down)).nonzero()[0].tolist()
            raise InputError(f"kernel {kernel.name!r} gave {out[bad[0], bad[1]].item()!r} at {bad} on schedule probe "
                             f"{probe.tile.name}: neither the tie's value nor the next one (not scales of 1?)")
        for n, t in enumerate(probe.column_boundary):
            seen.setdefault(t, []).extend(up[:, n].tolist())
    full = tuple(sorted(STEP * t for t, v in seen.items() if all(v)))
    partial = tuple(sorted(STEP * t for t, v in seen.items() if any(v) and not all(v)))
    return BoundaryReading(M, N, K, full, partial)


def candidate_schedules(K: int, base: AccumulationSchedule = FAST_ACCUM) -> list[AccumulationSchedule]:
    """Schedules a kernel may run at depth K: no promotion, promotion every 32·2^i products, split-K into 2 … 16
    parts of 128-product granules (and 32, 64, 256), with and without promotion inside the parts, ascending
    reduction."""
    out = [base]
    promos = [STEP * 2 ** i for i in range(0, 8) if STEP * 2 ** i < K]
    out += [AccumulationSchedule(f"promote-{p}", base.step, p) for p in promos]
    for parts in range(2, 17):
        for granule in (32, 64, 128, 256):
            if parts * granule > K + granule - 1 and parts > 2:
                continue
            split = SplitK(parts, granule)
            out.append(AccumulationSchedule(f"split-{parts}x{granule}", base.step, None, split))
            out += [AccumulationSchedule(f"split-{parts}x{granule}+promote-{p}", base.step, p, split)
                    for p in promos if p < granule * -(-K // (granule * parts))]
    return out


@dataclass(frozen=True)
class ScheduleMatch:
    """One candidate schedule at one shape: whether its chain boundaries are the probe's, and (when they are)
    how many output elements of the random tiles differ from the emulator running it with the kernel's epilogue."""

    schedule: str
    description: str
    boundaries_match: bool
    n_differing: int | None
    n_elements: int
    matches: bool


@dataclass(frozen=True)
class ShapeIdentification:
    """`identify_schedule` at one shape: the boundaries read, the declared schedule (None: undeclared) and whether it
    matches, and every candidate whose boundaries match (with its bit check)."""

    M: int
    N: int
    K: int
    reading: BoundaryReading
    declared: str | None
    declared_matches: bool
    candidates: tuple[ScheduleMatch, ...]

    @property
    def matched(self) -> list[str]:
        return [c.schedule for c in self.candidates if c.matches]


def random_fp8_tile(M: int, N: int, K: int, seed: int, out_dtype: torch.dtype = torch.bfloat16, *,
                    per_tensor: bool = False) -> Tile:
    """A tile of e4m3 operands quantised from Gaussian values with per-row and per-column fp32 scales (the shapes of
    real activations and weights), or one scale per operand (`per_tensor`), for the bit check."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g) * torch.exp(torch.randn(1, K, generator=g))
    w = torch.randn(N, K, generator=g) * 0.05
    if per_tensor:
        s_a, s_w = a.abs().amax().reshape(1) / 448, w.abs().amax().reshape(1) / 448
    else:
        s_a, s_w = a.abs().amax(1).clamp_min(1e-6) / 448, w.abs().amax(1).clamp_min(1e-6) / 448
    return Tile(f"random-fp8-{M}x{N}x{K}-{seed}", (a / s_a[:, None]).to(E4M3), s_a.float(),
                (w / s_w[:, None]).to(E4M3), s_w.float(), None, out_dtype, {"kind": "random-fp8"})


def identify_schedule(kernel: Kernel, shapes: list[tuple[int, int, int]], *, seed: int = 0,
                      out_dtype: torch.dtype = torch.bfloat16) -> list[ShapeIdentification]:
    """Per shape: the probe's boundaries, then each candidate with those boundaries checked bit for bit on a random
    tile of that shape (module docstring)."""
    results = []
    for M, N, K in shapes:
        reading = read_boundaries(kernel, M, N, K, out_dtype)
        declared = kernel.schedule_at(M, N, K)
        cands = list({c.label: c for c in ([declared] if declared else []) + candidate_schedules(K)}.values())
        tile = random_fp8_tile(M, N, K, seed, out_dtype, per_tensor=bool(getattr(kernel, "tensorwise", False)))
        out = kernel.run(tile).out
        epilogue = kernel.epilogue_at(M)
        # the emulator gives the same bits on any device (tests/exact/test_fp8_mma.py): the GPU's when there is one
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        a_q, w_q, s_a, s_w = (x.to(dev) for x in (tile.a_q, tile.w_q, tile.s_a, tile.s_w))
        checked, others = [], 0
        for cand in cands:
            same = not reading.partial and tuple(cand.boundaries(K)) == reading.boundaries
            if not (same or cand == declared) or (cand != declared and others >= MAX_OTHERS):
                continue
            others += cand != declared
            n = None
            if same and cand.deterministic and epilogue is not None:
                expected = apply_epilogue(epilogue, accumulate(cand, a_q, w_q), s_a, s_w, None, out_dtype)
                n = int(bitwise_differ_mask(out, expected.cpu()).sum())
            checked.append(ScheduleMatch(cand.label, cand.describe(), same, n, M * N, same and n == 0))
        ok = declared is not None and any(c.matches and c.schedule == declared.label for c in checked)
        results.append(ShapeIdentification(M, N, K, reading, None if declared is None else declared.label, ok,
                                           tuple(checked)))
    return results


__all__ = ["BoundaryProbe", "BoundaryReading", "ScheduleMatch", "ShapeIdentification", "boundary_probes",
           "candidate_schedules", "identify_schedule", "random_fp8_tile", "read_boundaries"]
