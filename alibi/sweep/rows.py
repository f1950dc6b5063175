"""`alibi sweep rows`: the per-element rate of differing outputs at each M, the decode regime included.

Design. For each M, operand blocks are drawn independently (seeded by `(seed, M, block)`): a fresh
weight matrix W [N,K] and R fresh activation rows, R = `rows_per_block` rounded up to a multiple of
M. Each block is cut into R/M tiles of M rows and every tile is one kernel call at that M, so the
kernels pick their M-dependent tilings as in decode (M = 1, 4, 16) or prefill. Blocks are added until
the M point covers at least `elements` output elements. Every M point thus sees the same operand
distribution; only the call shape differs.

Drawing a fresh W for every tile is out of reach at M = 1 (10⁸ elements at N = 4096 are 24,414
tiles, each W 16.7 M values), so the tiles of a block share its weights. A differing element depends
on its column's scale s_w as well as on its own accumulator and s_a, so elements of one block are
not fully independent: the `dispersion` test of each M point checks whether the rate varies between
blocks more than binomial counts would.

Statistics (`alibi.sweep.rates`): per M the exact (Clopper–Pearson) interval; across M the
homogeneity tests (χ², G, exact conditional), the Poisson trend `rate ∝ M^b` with the factor across
the M range compatible at 90%, and the largest ratio between any two M points' rates compatible at
90% (Bonferroni over the pairs).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from alibi.errors import InputError
from alibi.io.limits import MAX_SWEEP_ELEMENTS, check_count, check_gemm_size
from alibi.io.progress import ProgressCallback
from alibi.sweep.arms import Arm
from alibi.sweep.clock import PhaseClock
from alibi.sweep.compare import count_differences
from alibi.sweep.depth import _both, validate_ks, validate_shape
from alibi.sweep.operands import FORMATS, FP8_SCALES, OperandSpec, draw
from alibi.sweep.rates import binomial_rate, homogeneity, poisson_trend, ratio_bound
from alibi.sweep.records import RowsPoint, RowsSweep

DEFAULT_MS = (1, 4, 16, 64, 256, 512, 4096)
DEFAULT_ROWS_PER_BLOCK = 4096
TREND_LEVEL = 0.90


@dataclass(frozen=True)
class RowsPlan:
    """The design of a rows sweep (see the module docstring)."""

    kernel_a: str
    kernel_b: str
    format: str = "int8"
    Ms: tuple[int, ...] = DEFAULT_MS
    K: int = 4096
    N: int = 4096
    elements: int = 100_000_000
    seed: int = 0
    rows_per_block: int = DEFAULT_ROWS_PER_BLOCK
    confidence: float = 0.95
    fp8_scales: str | None = None

    def validate(self) -> RowsPlan:
        if self.format not in FORMATS:
            raise InputError(f"--format {self.format!r}: choose one of {', '.join(FORMATS)}")
        if not self.Ms:
            raise InputError(f"--M: give at least one M, e.g. {','.join(map(str, DEFAULT_MS))}")
        bad = [m for m in self.Ms if m < 1]
        if bad:
            raise InputError(f"--M must list positive integers, got {bad[0]}")
        if len(set(self.Ms)) != len(self.Ms):
            raise InputError(f"--M {','.join(map(str, self.Ms))}: an M appears twice; list each M once")
        validate_shape(N=self.N)
        validate_ks((self.K,), self.format, increasing=False)
        if self.elements < 1:
            raise InputError(f"--elements must be a positive number of output elements per M, got {self.elements}")
        check_count(self.elements, "--elements", MAX_SWEEP_ELEMENTS, "output elements per M")
        if self.seed < 0:
            raise InputError(f"--seed must be ≥ 0, got {self.seed}")
        if self.rows_per_block < 1:
            raise InputError(f"--rows-per-block must be positive, got {self.rows_per_block}")
        check_gemm_size(max(self.block_rows(m) for m in self.Ms), self.K, self.N,
                        "alibi sweep rows (one operand block)")
        if not 0 < self.confidence < 1:
            raise InputError(f"--confidence {self.confidence!r}: give a level in (0, 1), e.g. 0.95")
        if self.fp8_scales is not None:
            if self.format != "fp8_e4m3":
                raise InputError("--fp8-scales applies to --format fp8_e4m3 only; drop it for int8")
            if self.fp8_scales not in FP8_SCALES:
                raise InputError(f"--fp8-scales {self.fp8_scales!r}: choose tensor or row")
        return self

    def block_rows(self, M: int) -> int:
        return M * math.ceil(self.rows_per_block / M)

    def blocks(self, M: int) -> int:
        return math.ceil(self.elements / (self.block_rows(M) * self.N))


def run_rows_sweep(plan: RowsPlan, arms: tuple[Arm, Arm], device: torch.device,
                   progress: ProgressCallback | None = None) -> RowsSweep:
    """Run the sweep of a validated `plan` with resolved `arms`; operands on `device`.

    progress: called `(done, total, label)` after each M (alibi.io.progress), the label giving its rate."""
    arm_a, arm_b = arms
    devices = (device, arm_a.device, arm_b.device)
    points = []
    clock = PhaseClock(*devices)
    timed = clock.timed

    def run_tiles(arm: Arm, ops, M: int, R: int) -> torch.Tensor:
        out = torch.empty((R, plan.N), dtype=torch.bfloat16, device=arm.device)
        for r in range(0, R, M):
            out[r:r + M] = arm.run(ops.rows(r, r + M))
        return out

    for j, M in enumerate(plan.Ms):
        point_start = time.perf_counter()
        R, n_blocks = plan.block_rows(M), plan.blocks(M)
        spec = OperandSpec(plan.format, R, plan.N, plan.fp8_scales or "tensor")
        events, ge2, nonfinite, max_ulp, sa_total, sb_total = [], 0, 0, None, 0.0, 0.0
        for b in range(n_blocks):
            ops, _ = timed("operands", draw, spec, plan.K, (plan.seed, M, b), device)
            ops_a, ops_b = arm_a.place(ops), arm_b.place(ops)
            if b == 0:  # each M may compile or select its own tiling: warm both kernels up at this M
                timed("warmup", _both, arm_a, ops_a.rows(0, M), arm_b, ops_b.rows(0, M))
            out_a, sa = timed("kernel_a", run_tiles, arm_a, ops_a, M, R)
            out_b, sb = timed("kernel_b", run_tiles, arm_b, ops_b, M, R)
            diff, _ = timed("compare", count_differences, out_a.to(device), out_b.to(device))
            events.append(diff.n_differing)
            ge2 += diff.n_ge2ulp
            nonfinite += diff.n_nonfinite
            if diff.max_ulp is not None:
                max_ulp = diff.max_ulp if max_ulp is None else max(max_ulp, diff.max_ulp)
            sa_total += sa
            sb_total += sb
        elements = n_blocks * R * plan.N
        rate = binomial_rate(sum(events), elements, plan.confidence)
        points.append(RowsPoint(M, n_blocks * R // M, n_blocks, elements, rate, tuple(events),
                                homogeneity(events, [R * plan.N] * n_blocks, seed=plan.seed), ge2, nonfinite,
                                max_ulp, sa_total, sb_total))
        if progress:
            progress(j + 1, len(plan.Ms), f"M={M}: {n_blocks * R // M} tiles, {rate.events} of {elements} elements differ "
                     f"({rate.rate * 1e6:.3g} ppm, {plan.confidence:.0%} CI {rate.low * 1e6:.3g}–{rate.high * 1e6:.3g}) "
                     f"in {time.perf_counter() - point_start:.1f} s")
    tm = clock.finish()
    Ms = [float(p.M) for p in points]
    ev = [p.rate.events for p in points]
    ex = [p.elements for p in points]
    return RowsSweep(
        kernel_a=arm_a.kernel.name, kernel_b=arm_b.kernel.name, format=plan.format,
        fp8_scales=(plan.fp8_scales or "tensor") if plan.format == "fp8_e4m3" else None, out_dtype="bfloat16",
        K=plan.K, N=plan.N, Ms=tuple(plan.Ms), elements_target=plan.elements, rows_per_block=plan.rows_per_block,
        seed=plan.seed, confidence=plan.confidence, operands=spec.describe(), operand_device=str(device),
        points=tuple(points), homogeneity=homogeneity(ev, ex, seed=plan.seed),
        trend=poisson_trend(Ms, ev, ex, "M", TREND_LEVEL), ratio=ratio_bound(Ms, ev, ex, TREND_LEVEL),
        timing=tm)
