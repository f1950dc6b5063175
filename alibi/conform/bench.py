"""`alibi bench conform`: how fast the conformance pipeline runs, and where its time goes.

A benchmark, not a timed test: one process runs `run_conformance` on the same pair and tiles, once to
warm up (kernel builds, Triton compilation, CUDA context, cuBLAS handles — all outside the timing),
then `repeats` times with a `StageTimer` that splits wall time into the kernels (every launch, the
accumulator, M-invariance and reruns included), the exact reference (accumulator GEMM, epilogue
models, fp64 exact values), the checks, and I/O (operand copies and transfers). Throughput is output
elements (M·N summed over units) per second of total wall time. Tile generation or reading is
outside the timing (it happens once, before).

Each check device given (`cuda`, `cpu`) runs the whole pipeline; the verdict and every unit's counts
must be the same on all of them — the result records whether they are (`identical_results`), so the
GPU path of the exact reference is shown to give the CPU path's bits on the tiles benchmarked.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from alibi.conform.results import ReportVerdict
from alibi.governance.environment import environment_record
from alibi.io.typed import TypedResult

SCHEMA = "alibi.bench-conform/v1"


@dataclass(frozen=True)
class DeviceTiming:
    """One check device: median seconds per stage and in total over the repeats, the spread of the total,
    output elements per second (at the median total), and the exact-reference path that ran."""

    check_device: str
    reference_path: str
    repeats: int
    stage_seconds: dict[str, float]
    total_seconds: float
    total_spread: tuple[float, float]
    elements_per_s: float


@dataclass(frozen=True)
class ConformBench(TypedResult):
    """`alibi bench conform`: one pair over one tile source, timed per check device (`timings`), with the
    per-unit results compared across the devices (`n_differing`, `identical_results`)."""

    SCHEMA = SCHEMA
    JSON_INDENT = 2
    REMEDY = "re-run `alibi bench conform`"

    kernel_a: str
    kernel_b: str
    source: dict[str, Any]
    units: int
    output_elements: int
    verdict: ReportVerdict
    n_differing: tuple[int, ...]
    identical_results: bool
    timings: tuple[DeviceTiming, ...]
    environment: dict[str, Any]
    schema: str = SCHEMA


def reference_path(device: str) -> str:
    # deferred: keeps torch out of start-up
    import torch

    if device == "cuda":
        return "fp64 GEMM on the GPU (cuBLAS DGEMM); epilogue models in fp32 on the GPU"
    return ("chunked fp32 GEMMs on the CPU (torch " + torch.__version__ + ", K-chunks of 1024); epilogue models "
            "in fp32 on the CPU")


def _comparable(report) -> list[tuple]:
    """What must not depend on the check device: per unit, every count and every verdict."""
    return [(u.tile, u.regime, u.n_differing, u.max_ulp, u.n_predicted, u.explained, u.cause,
             tuple((v.check, v.status) for v in u.verdicts)) for u in report.tiles] + [report.verdict]


def bench_conform(pair, source, *, devices: list[str], repeats: int = 3, regimes=("real", "pow2"),
                  progress=None) -> ConformBench:
    # deferred: keeps torch out of start-up
    import torch

    # deferred: keeps torch out of start-up
    from alibi.conform.pipeline import StageTimer, run_conformance, source_from_tiles

    warm = source_from_tiles(source.tiles[:1], "warm-up")
    timings, reports = [], []
    for device in devices:
        run_conformance(pair, warm, regimes, device=device)
        totals, stages = [], []
        for i in range(repeats):
            timer = StageTimer()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            report = run_conformance(pair, source, regimes, device=device, timer=timer)
            totals.append(time.perf_counter() - t0)
            stages.append(timer.seconds)
            if progress:
                progress(f"{device} repeat {i + 1}/{repeats}: {totals[-1]:.3f} s")
        reports.append(report)
        total = statistics.median(totals)
        elements = sum(u.n_elements for u in report.tiles)
        timings.append(DeviceTiming(device, reference_path(device), repeats,
                                    {k: statistics.median(s[k] for s in stages) for k in StageTimer.STAGES},
                                    total, (min(totals), max(totals)), elements / total))
    first = reports[0]
    return ConformBench(pair.a.name, pair.b.name, source.record, len(first.tiles),
                        sum(u.n_elements for u in first.tiles), first.verdict,
                        tuple(u.n_differing for u in first.tiles),
                        all(_comparable(r) == _comparable(first) for r in reports), tuple(timings),
                        environment_record())


def format_table(result: ConformBench) -> str:
    lines = [f"alibi bench conform: {result.kernel_a} vs {result.kernel_b} on {result.source.get('label')}: "
             f"{result.units} units, {result.output_elements:,} output elements, verdict {result.verdict}",
             f"  {'check device':<12} {'total s':>8} {'kernels':>8} {'reference':>9} {'checks':>7} {'io':>7} "
             f"{'M elem/s':>9}  spread s"]
    for t in result.timings:
        s = t.stage_seconds
        lines.append(f"  {t.check_device:<12} {t.total_seconds:8.3f} {s['kernels']:8.3f} {s['reference']:9.3f} "
                     f"{s['checks']:7.3f} {s['io']:7.3f} {t.elements_per_s / 1e6:9.1f}  "
                     f"{t.total_spread[0]:.3f}–{t.total_spread[1]:.3f}")
    lines.append("  same verdict and per-unit counts on every check device: "
                 + ("yes" if result.identical_results else "NO"))
    return "\n".join(lines)


__all__ = ["SCHEMA", "ConformBench", "DeviceTiming", "bench_conform", "format_table"]
