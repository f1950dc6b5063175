"""The fp64 reference and what one (seed, K) comparison measures, computed on the kernels' device.

Reference. `Y_ref = (A·Wᵀ) · s_a · s_w` in float64, where the GEMM is exact:

* int8: every partial sum is an integer of magnitude ≤ 16384·K < 2⁵³, so a float64 GEMM is exact in
  any order (on CUDA: torch's float64 matmul). On the CPU the toolkit's exact accumulator
  (`alibi.exact.emulator.exact_accumulator`, chunked fp32, exact by construction) is used instead; it is
  faster there and gives the same integers.
* fp8 e4m3: products are multiples of 2⁻¹⁸ below 2¹⁸, so for K ≤ 65536 every partial sum lies on a
  2⁻¹⁸ grid below 2³⁴ and float64 (52 fraction bits) holds it exactly, in any order.

The two scalings are float64 multiplications (relative error ≤ 2⁻⁵³ each), negligible next to the
bf16 output's 2⁻⁹. On CUDA the reference of the first operands is cross-checked against the CPU's
exact computation on two rows (`check_reference`), so a GPU path that is not exact stops the sweep.

Measurements (`Comparison`). Bitwise comparison of the two outputs (signed zeros differ, NaN
payloads compared: `alibi.exact.numerics`); elements whose reference is *near zero*, `|Y_ref| <
near_zero_rel · rms(Y_ref)`, are counted apart, because there a rounding of the accumulator that is
tiny against the tile's scale is large against the element and relative differences and ulp
distances say nothing about the kernels; everything "far" from zero is measured in relative terms
against `|Y_ref|`. All statistics are reduced on the device and fetched in one transfer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from alibi.errors import InputError
from alibi.exact.emulator import exact_accumulator
from alibi.exact.numerics import bitwise_differ_mask, ulp_distance
from alibi.sweep.operands import Operands

CHECK_ROWS = 2


def exact_product(ops: Operands, device: torch.device) -> tuple[torch.Tensor, str]:
    """The exact `A·Wᵀ` in float64 on `device`, and which path computed it."""
    if device.type == "cuda":
        a, w = ops.a_q.to(device), ops.w_q.to(device)
        return a.to(torch.float64) @ w.to(torch.float64).T, "cuda: torch float64 matmul (exact, see alibi.sweep.compare)"
    if ops.a_q.dtype == torch.int8:
        return (exact_accumulator(ops.a_q, ops.w_q).to(torch.float64),
                "cpu: alibi.exact.emulator.exact_accumulator (exact int64) in float64")
    return (ops.a_q.cpu().to(torch.float64) @ ops.w_q.cpu().to(torch.float64).T,
            "cpu: torch float64 matmul (exact, see alibi.sweep.compare)")


def scaled(acc: torch.Tensor, ops: Operands) -> torch.Tensor:
    s_a = ops.s_a.to(acc.device, torch.float64).reshape(-1, 1)
    s_w = ops.s_w.to(acc.device, torch.float64).reshape(1, -1)
    return acc * s_a * s_w


def check_reference(ops: Operands, acc: torch.Tensor) -> str:
    """Compare the first rows of a CUDA reference with the CPU's exact computation; raise if they differ."""
    if acc.device.type != "cuda":
        return "not needed: computed on the CPU by an exact path"
    head = Operands(ops.a_q[:CHECK_ROWS].cpu(), ops.s_a.cpu(), ops.w_q.cpu(), ops.s_w.cpu())
    cpu, _ = exact_product(head, torch.device("cpu"))
    if not torch.equal(acc[:CHECK_ROWS].cpu(), cpu):
        raise InputError("the CUDA float64 reference GEMM is not exact on this machine (rows 0–1 differ from the "
                         "CPU's exact accumulator); rerun with --device cpu")
    return f"rows 0–{CHECK_ROWS - 1} of the first operands (K={ops.K}) equal the CPU's exact computation"


@dataclass(frozen=True)
class Comparison:
    """Two outputs and their reference, one tile.

    n: elements; n_differing / frac_differ: elements whose bit patterns differ; n_nonfinite: elements
    where either output is inf/NaN; near_zero_floor: the absolute floor `near_zero_rel·rms(Y_ref)`;
    n_near_zero / n_near_zero_differing: elements below it, and those of them that differ;
    n_differing_far: differing elements at or above it; n_ge2ulp / share_ge2ulp: of those, the ones
    at ulp distance ≥ 2 (share None when n_differing_far is 0); median_rel_diff / max_rel_diff:
    `|Y_a − Y_b| / |Y_ref|` over them (torch.median: the lower middle value for an even count);
    max_ulp: largest finite ulp distance over all elements (None without a finite pair); max_ulp_far:
    the same over far elements; err_{a,b}_{max,mean}_rel: each arm's `|Y − Y_ref| / |Y_ref|` over the
    far, finite elements (None when there are none).
    """

    n: int
    n_differing: int
    frac_differ: float
    n_nonfinite: int
    near_zero_floor: float
    n_near_zero: int
    n_near_zero_differing: int
    n_differing_far: int
    n_ge2ulp: int
    share_ge2ulp: float | None
    median_rel_diff: float | None
    max_rel_diff: float | None
    max_ulp: int | None
    max_ulp_far: int | None
    err_a_max_rel: float | None
    err_a_mean_rel: float | None
    err_b_max_rel: float | None
    err_b_mean_rel: float | None


@torch.no_grad()
def compare(out_a: torch.Tensor, out_b: torch.Tensor, ref: torch.Tensor, near_zero_rel: float) -> Comparison:
    """Measure one tile (all tensors on one device); see `Comparison`.

    Ulp distances and relative differences are computed on the differing elements only (one masked
    selection): elements with equal bit patterns are at distance 0, and that keeps the cost
    proportional to the differences on CPUs, where the integer views are slow.
    """
    differ = bitwise_differ_mask(out_a, out_b)
    finite = torch.isfinite(out_a) & torch.isfinite(out_b)
    abs_ref = ref.abs()
    floor = near_zero_rel * ref.square().mean().sqrt()
    near = abs_ref < floor
    far = ~near & (abs_ref > 0) & finite
    a64, b64 = out_a.to(torch.float64), out_b.to(torch.float64)
    safe_ref = torch.where(far, abs_ref, torch.ones_like(abs_ref))
    zero = torch.zeros((), dtype=torch.float64, device=ref.device)
    err_a = torch.where(far, (a64 - ref).abs() / safe_ref, zero)  # 0 outside the far elements
    err_b = torch.where(far, (b64 - ref).abs() / safe_ref, zero)

    # The differing elements (a masked selection: one synchronization).
    ulp_d = ulp_distance(out_a[differ], out_b[differ])
    far_d = far[differ]
    rel_d = (a64[differ] - b64[differ]).abs() / safe_ref[differ]
    rel_far = rel_d[far_d]
    nan = torch.tensor(float("nan"), dtype=torch.float64, device=ref.device)

    def max_or(x: torch.Tensor, empty: torch.Tensor) -> torch.Tensor:
        return x.max().to(torch.float64) if x.numel() else empty

    minus_one = -torch.ones((), dtype=torch.float64, device=ref.device)
    stats = torch.stack([
        differ.sum().to(torch.float64), (~finite).sum().to(torch.float64), floor.to(torch.float64),
        near.sum().to(torch.float64), (near & differ).sum().to(torch.float64), far_d.sum().to(torch.float64),
        (far_d & (ulp_d >= 2)).sum().to(torch.float64),
        rel_far.median() if rel_far.numel() else nan, max_or(rel_far, nan),
        max_or(ulp_d, minus_one), max_or(ulp_d[far_d], minus_one),
        err_a.max(), err_a.sum(), err_b.max(), err_b.sum(),
        far.sum().to(torch.float64), (finite & ~differ).sum().to(torch.float64),
        (far & ~differ).sum().to(torch.float64),
    ]).tolist()
    (n_diff, n_nonfinite, floor_v, n_near, n_near_diff, n_dfar, n_ge2, med, mx, ulp_max_d, ulp_max_far_d,
     ea_max, ea_sum, eb_max, eb_sum, nf, n_equal_finite, n_equal_far) = stats
    n = out_a.numel()
    n_dfar_i, nf_i = int(n_dfar), int(nf)
    # Equal finite patterns are at distance 0: the maximum over all finite pairs is the larger of 0 (if
    # any) and the differing elements' maximum; None when no pair is finite.
    max_ulp = max(ulp_max_d, 0.0 if n_equal_finite else -1.0)
    max_ulp_far = max(ulp_max_far_d, 0.0 if n_equal_far else -1.0)
    return Comparison(
        n=n, n_differing=int(n_diff), frac_differ=n_diff / n, n_nonfinite=int(n_nonfinite),
        near_zero_floor=float(floor_v), n_near_zero=int(n_near), n_near_zero_differing=int(n_near_diff),
        n_differing_far=n_dfar_i, n_ge2ulp=int(n_ge2), share_ge2ulp=n_ge2 / n_dfar_i if n_dfar_i else None,
        median_rel_diff=_finite(med) if n_dfar_i else None, max_rel_diff=_finite(mx) if n_dfar_i else None,
        max_ulp=int(max_ulp) if max_ulp >= 0 else None, max_ulp_far=int(max_ulp_far) if max_ulp_far >= 0 else None,
        err_a_max_rel=_finite(ea_max) if nf_i else None, err_a_mean_rel=_finite(ea_sum / nf_i) if nf_i else None,
        err_b_max_rel=_finite(eb_max) if nf_i else None, err_b_mean_rel=_finite(eb_sum / nf_i) if nf_i else None,
    )


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


@dataclass(frozen=True)
class Differences:
    """Bitwise differences between two outputs without a reference (the rows sweep's blocks)."""

    n: int
    n_differing: int
    n_ge2ulp: int
    n_nonfinite: int
    max_ulp: int | None


@torch.no_grad()
def count_differences(out_a: torch.Tensor, out_b: torch.Tensor) -> Differences:
    """As `compare` without a reference; ulp distances on the differing elements only."""
    differ = bitwise_differ_mask(out_a, out_b)
    finite = torch.isfinite(out_a) & torch.isfinite(out_b)
    ulp_d = ulp_distance(out_a[differ], out_b[differ])
    ulp_max = ulp_d.max() if ulp_d.numel() else torch.full((), -1, dtype=ulp_d.dtype, device=ulp_d.device)
    n_diff, n_ge2, n_nf, n_equal_finite, mu = torch.stack(
        [differ.sum(), (ulp_d >= 2).sum(), (~finite).sum(), (finite & ~differ).sum(), ulp_max]).tolist()
    mu = max(mu, 0 if n_equal_finite else -1)
    return Differences(out_a.numel(), int(n_diff), int(n_ge2), int(n_nf), int(mu) if mu >= 0 else None)
