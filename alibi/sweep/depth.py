"""`alibi sweep depth`: how often, and by how much, two kernels' outputs differ as K grows.

For each seed and each K: draw the operands (or, with nested prefixes, take the leading K columns
of the seed's largest-K operands), run both kernels on the very same operands, compute the exact
fp64 reference on the home device, and measure (`alibi.sweep.compare`). Every phase is
synchronized with the device and timed, so the sweep reports how much of its wall time the kernels
and the reference took (`SweepTiming`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise

import torch

from alibi.errors import InputError
from alibi.io.limits import MAX_SEEDS, check_count, check_gemm_size
from alibi.io.progress import ProgressCallback
from alibi.sweep.arms import Arm
from alibi.sweep.clock import PhaseClock
from alibi.sweep.compare import check_reference, compare, exact_product, scaled
from alibi.sweep.operands import (
    FORMATS,
    FP8_K_LIMIT,
    FP8_SCALES,
    INT8_K_LIMIT,
    Operands,
    OperandSpec,
    draw,
)
from alibi.sweep.records import DepthRecord, DepthSweep

DEFAULT_KS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
DEFAULT_NEAR_ZERO_REL = 1e-3


@dataclass(frozen=True)
class DepthPlan:
    """The design of a depth sweep: kernels, format, K grid, shape, seeds `first_seed … first_seed+seeds−1`,
    nested prefixes, fp8 scale layout, the near-zero floor relative to rms(Y_ref)."""

    kernel_a: str
    kernel_b: str
    format: str
    Ks: tuple[int, ...] = DEFAULT_KS
    M: int = 256
    N: int = 2048
    seeds: int = 20
    first_seed: int = 0
    nested_prefix: bool = False
    fp8_scales: str | None = None
    near_zero_rel: float = DEFAULT_NEAR_ZERO_REL

    @property
    def spec(self) -> OperandSpec:
        return OperandSpec(self.format, self.M, self.N, self.fp8_scales or "tensor")

    def validate(self) -> DepthPlan:
        """InputError (one line, naming the option and the fix) for any parameter that cannot run."""
        if self.format not in FORMATS:
            raise InputError(f"--format {self.format!r}: choose one of {', '.join(FORMATS)}")
        validate_shape(M=self.M, N=self.N)
        if self.seeds < 1:
            raise InputError(f"--seeds must be a positive count of seeds, got {self.seeds}")
        check_count(self.seeds, "--seeds", MAX_SEEDS, "seeds")
        if self.first_seed < 0:
            raise InputError(f"--first-seed must be ≥ 0, got {self.first_seed}")
        validate_ks(self.Ks, self.format, increasing=self.nested_prefix)
        check_gemm_size(self.M, max(self.Ks), self.N, f"alibi sweep depth at K={max(self.Ks)}")
        if self.fp8_scales is not None:
            if self.format != "fp8_e4m3":
                raise InputError("--fp8-scales applies to --format fp8_e4m3 only; drop it for int8")
            if self.fp8_scales not in FP8_SCALES:
                raise InputError(f"--fp8-scales {self.fp8_scales!r}: choose tensor or row")
        if not 0 < self.near_zero_rel < 1:
            raise InputError(f"--near-zero {self.near_zero_rel!r}: give a fraction of rms(reference) in (0, 1), "
                             f"e.g. {DEFAULT_NEAR_ZERO_REL}")
        return self


def validate_shape(**dims: int) -> None:
    for name, value in dims.items():
        if value < 1:
            raise InputError(f"--{name} must be a positive integer, got {value}")


def validate_ks(Ks: tuple[int, ...], fmt: str, *, increasing: bool, option: str = "--K") -> None:
    if not Ks:
        raise InputError(f"{option}: give at least one K, e.g. {','.join(map(str, DEFAULT_KS))}")
    bad = [k for k in Ks if k < 1]
    if bad:
        raise InputError(f"{option}: K must be positive, got {bad[0]}")
    if increasing and any(b <= a for a, b in pairwise(Ks)):
        raise InputError(f"{option} {','.join(map(str, Ks))}: with --nested-prefix the K list must be strictly "
                         "increasing (each K a prefix of the next)")
    if len(set(Ks)) != len(Ks):
        raise InputError(f"{option} {','.join(map(str, Ks))}: a K appears twice; list each K once")
    if fmt == "int8" and max(Ks) > INT8_K_LIMIT:
        raise InputError(f"{option}: K={max(Ks)} exceeds the int32 bound for int8 (product bound 16256 · K < 2³¹ "
                         f"needs K ≤ {INT8_K_LIMIT}); choose a smaller K")
    if fmt == "fp8_e4m3" and max(Ks) > FP8_K_LIMIT:
        raise InputError(f"{option}: K={max(Ks)} exceeds {FP8_K_LIMIT}, beyond which the fp64 reference of an e4m3 "
                         "GEMM is no longer exact; choose a smaller K")


def operand_schedule(plan: DepthPlan, seed: int, device: torch.device) -> Iterator[tuple[int, Operands]]:
    """(K, operands) for one seed in the order of `plan.Ks`: with nested prefixes the leading K columns
    of one draw at the largest K (words `(seed,)`), else a fresh draw per K (words `(seed, K)`)."""
    if plan.nested_prefix:
        full = draw(plan.spec, max(plan.Ks), (seed,), device)
        for K in plan.Ks:
            yield K, full.prefix(K)
    else:
        for K in plan.Ks:
            yield K, draw(plan.spec, K, (seed, K), device)


def _both(arm_a: Arm, ops_a: Operands, arm_b: Arm, ops_b: Operands) -> None:
    arm_a.run(ops_a)
    arm_b.run(ops_b)


def run_depth_sweep(plan: DepthPlan, arms: tuple[Arm, Arm], device: torch.device,
                    progress: ProgressCallback | None = None) -> DepthSweep:
    """Run the sweep of a validated `plan` with resolved `arms`; operands and reference on `device`.

    progress: called `(done, total, label)` after each seed (alibi.io.progress), the label giving the
    seed's range of the fraction differing over the K list."""
    arm_a, arm_b = arms
    devices = (device, arm_a.device, arm_b.device)
    seeds = tuple(range(plan.first_seed, plan.first_seed + plan.seeds))
    k_max = max(plan.Ks)
    records: list[DepthRecord] = []
    reference_path = reference_check = ""
    clock = PhaseClock(*devices)
    timed = clock.timed

    for i, seed in enumerate(seeds):
        seed_start = time.perf_counter()
        schedule = operand_schedule(plan, seed, device)
        fracs = []
        for _ in plan.Ks:
            (K, ops), _ = timed("operands", next, schedule)
            ops_a, ops_b = arm_a.place(ops), arm_b.place(ops)
            if not records:
                timed("warmup", _both, arm_a, ops_a, arm_b, ops_b)
            out_a, sa = timed("kernel_a", arm_a.run, ops_a)
            out_b, sb = timed("kernel_b", arm_b.run, ops_b)
            (acc, reference_path), t_product = timed("reference", exact_product, ops, device)
            if i == 0 and K == k_max:  # once, at the largest operands: the CUDA reference against the CPU's
                reference_check, _ = timed("reference_check", check_reference, ops, acc)
            ref, t_scale = timed("reference", scaled, acc, ops)
            sr = t_product + t_scale
            cmp, _ = timed("compare", compare, out_a.to(device), out_b.to(device), ref, plan.near_zero_rel)
            records.append(DepthRecord(**vars(cmp), seed=seed, K=K, seconds_a=sa, seconds_b=sb,
                                       seconds_reference=sr))
            fracs.append(cmp.frac_differ)
        if progress:
            progress(i + 1, len(seeds), f"seed {seed}: K {plan.Ks[0]}…{plan.Ks[-1]}, fraction differing "
                     f"{min(fracs):.3g}…{max(fracs):.3g} in {time.perf_counter() - seed_start:.2f} s")
    return DepthSweep(
        kernel_a=arm_a.kernel.name, kernel_b=arm_b.kernel.name, format=plan.format,
        fp8_scales=(plan.fp8_scales or "tensor") if plan.format == "fp8_e4m3" else None, out_dtype="bfloat16",
        M=plan.M, N=plan.N, Ks=tuple(plan.Ks), seeds=seeds, nested_prefix=plan.nested_prefix,
        operands=plan.spec.describe(), operand_device=str(device), reference=reference_path,
        reference_check=reference_check, near_zero_rel=plan.near_zero_rel, records=tuple(records),
        timing=clock.finish())
