"""`alibi bench conform`: how fast the conformance pipeline runs, and where its time goes.

A benchmark, not a timed test: one process runs `run_conformance` on the same pair and tiles, once to warm up (kernel
builds, Triton compilation for every shape, CUDA context, cuBLAS handles, the memory the caching allocator keeps, the
CUDA graphs' captures — all outside the timing; its wall is reported apart, `warmup_seconds`), with CUDA graphs on a
GPU once more, untimed (a graph's first replay uploads it to the device, once per process; without this run the first
timed run was the slowest), then `repeats` plain runs and `repeats` staged runs per check device. A plain run is what
`alibi conform` pays: its wall time (`wall`) is the throughput reported, output elements (M·N summed over units) per
second. A staged run carries a `StageTimer`, which splits wall time into the kernels (every launch, the accumulator,
M-invariance and reruns included, with each arm's private copies, eager or replayed from a CUDA graph), the exact
reference (accumulator GEMM, epilogue models, fp64 exact values), the checks, and I/O (the tiles' packing and
transfers); timing a GPU stage needs a synchronize at its end, which stops the host from queueing work ahead of the
GPU, so a staged run is slower than a plain one (`staged`, reported beside it; the stage split is the staged runs'
median). Tile generation or reading is outside the timing (it happens once, before).

On the GPU one more plain run goes under torch.profiler: the time its device events (kernels, copies, sets) cover,
their spans' union (`device_busy_seconds`), set against the plain runs' median wall is `device_busy`, how much of
a run the GPU works, so how far the run is from the device's limit (the host's profiling overhead lengthens that
run's wall, not its device spans). On the CPU it is absent: there is no separate device.

Each check device given (`cuda`, `cpu`) runs the whole pipeline; the verdict and every unit's counts
must be the same on all of them — the result records whether they are (`identical_results`), so the
GPU path of the exact reference is shown to give the CPU path's bits on the tiles benchmarked.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from alibi.conform.results import ReportVerdict
from alibi.governance.environment import environment_record
from alibi.io.typed import TypedResult

SCHEMA = "alibi.bench-conform/v2"
V1 = "alibi.bench-conform/v1"  # one kind of run, staged: its wall is v2's `staged`


@dataclass(frozen=True)
class Wall:
    """The wall time of repeated runs: the median in seconds, the spread (min, max), and output elements per second
    at the median."""

    seconds: float
    spread: tuple[float, float]
    elements_per_s: float


def wall(totals: list[float], elements: int) -> Wall:
    median = statistics.median(totals)
    return Wall(median, (min(totals), max(totals)), elements / median)


@dataclass(frozen=True)
class DeviceTiming:
    """One check device: the wall of the plain runs (`wall`: what `alibi conform` pays once warm, None in a v1
    result, which had none) and of the staged runs (`staged`), the median seconds per stage over the staged runs,
    the wall of the warm-up run (`warmup_seconds`: the whole source run once, first in the process; None, and
    absent from the document, where the warm-up ran on the first tile only and was not timed), the exact-reference
    path that ran, and the GPU's busy time in one profiled plain run (`device_busy_seconds`; None, and absent from
    the document, on the CPU and in results made before it was measured)."""

    check_device: str
    reference_path: str
    repeats: int
    warmup_seconds: float | None
    wall: Wall | None
    staged: Wall
    stage_seconds: dict[str, float]
    device_busy_seconds: float | None = None

    @property
    def device_busy(self) -> float | None:
        """The fraction of a plain run's median wall during which the GPU ran work (None where not measured)."""
        if self.device_busy_seconds is None or self.wall is None:
            return None
        return self.device_busy_seconds / self.wall.seconds

    @classmethod
    def _layout_in(cls, doc: dict[str, Any], where: str) -> dict[str, Any]:
        """`warmup_seconds` absent: not measured (the first v2 results, 4785b26, warmed up on the first tile only);
        `device_busy_seconds` absent: a result made before the GPU's busy time was measured."""
        doc.setdefault("warmup_seconds", None)
        doc.setdefault("device_busy_seconds", None)
        return doc

    def _layout_out(self, doc: dict[str, Any]) -> dict[str, Any]:
        """A field not measured is absent, as in the results written before it existed."""
        for name in ("warmup_seconds", "device_busy_seconds"):
            if doc[name] is None:
                del doc[name]
        return doc


@dataclass(frozen=True)
class ConformBench(TypedResult):
    """`alibi bench conform`: one pair over one tile source, timed per check device (`timings`), with the
    per-unit results compared across the devices (`n_differing`, `identical_results`); `cuda_graphs`: the runs
    replayed GPU arms' launches from CUDA graphs (`alibi conform --cuda-graphs`; absent from the document when
    False, as in every result made before it existed); `checks_launched`: with them, on a GPU, how the checks ran
    (`alibi.conform.judge_graphs.JudgeGraphs.how`: replayed per batch layout, or eagerly and why; absent otherwise,
    as in the results made before the checks were replayed)."""

    SCHEMA = SCHEMA
    READS = (V1,)
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
    cuda_graphs: bool = False
    checks_launched: str | None = None
    schema: str = SCHEMA

    @classmethod
    def _layout_in(cls, doc: dict[str, Any], where: str) -> dict[str, Any]:
        """A v1 result's timings (staged runs only, their wall flat in the timing) in v2's layout, `wall` None."""
        if doc.get("schema") == V1 and isinstance(doc.get("timings"), list):
            doc["timings"] = [_v1_timing(t) if isinstance(t, dict) else t for t in doc["timings"]]
        doc.setdefault("cuda_graphs", False)
        doc.setdefault("checks_launched", None)
        return doc

    def _layout_out(self, doc: dict[str, Any]) -> dict[str, Any]:
        """As stored: a result read from v1 goes back in v1's layout; `cuda_graphs` only when True, `checks_launched`
        only when there is one."""
        if not doc["cuda_graphs"]:
            del doc["cuda_graphs"]
        if doc["checks_launched"] is None:
            del doc["checks_launched"]
        if doc["schema"] == V1:
            doc["timings"] = [{"check_device": t["check_device"], "reference_path": t["reference_path"],
                               "repeats": t["repeats"], "stage_seconds": t["stage_seconds"],
                               "total_seconds": t["staged"]["seconds"], "total_spread": t["staged"]["spread"],
                               "elements_per_s": t["staged"]["elements_per_s"]} for t in doc["timings"]]
        return doc


def _v1_timing(t: dict[str, Any]) -> dict[str, Any]:
    flat = ("total_seconds", "total_spread", "elements_per_s")
    return {**{k: v for k, v in t.items() if k not in flat}, "wall": None,
            "staged": {"seconds": t.get("total_seconds"), "spread": t.get("total_spread"),
                       "elements_per_s": t.get("elements_per_s")}}


def covered_seconds(spans: Iterable[tuple[float, float]]) -> float:
    """Seconds covered by the union of (start, end) spans given in microseconds (overlapping work counts once)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total / 1e6


def device_busy_seconds(run: Callable[[], object]) -> float:
    """The GPU's busy time during `run()`: the union of its device events' spans under torch.profiler."""
    # deferred: keeps torch out of start-up
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return covered_seconds((e.time_range.start, e.time_range.end) for e in prof.events()
                           if e.device_type == torch.autograd.DeviceType.CUDA)


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
                  progress=None, graphs: bool = True) -> ConformBench:
    # deferred: keeps torch out of start-up
    import torch

    # deferred: keeps torch out of start-up
    from alibi.conform.judge_graphs import judge_graphs
    from alibi.conform.pipeline import StageTimer, run_conformance

    cuda = torch.cuda.is_available()

    def timed(device: str, timer: StageTimer | None):
        """One run of the whole source and its wall, the GPU idle at both ends."""
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        report = run_conformance(pair, source, regimes, device=device, timer=timer, graphs=graphs)
        if cuda:
            torch.cuda.synchronize()
        return report, time.perf_counter() - t0

    timings, reports = [], []
    for device in devices:
        warmup = timed(device, None)[1]
        if progress:
            progress(f"{device} warm-up run: {warmup:.3f} s")
        if graphs and torch.device(device).type == "cuda":
            # the warm-up captured the graphs; a graph's first replay uploads it to the device, once per process
            settle = timed(device, None)[1]
            if progress:
                progress(f"{device} second warm-up run, each graph's first replay: {settle:.3f} s")
        plain, staged, stages = [], [], []
        for i in range(repeats):
            report, seconds = timed(device, None)
            plain.append(seconds)
            if progress:
                progress(f"{device} plain run {i + 1}/{repeats}: {seconds:.3f} s")
        for i in range(repeats):
            timer = StageTimer()
            report, seconds = timed(device, timer)
            staged.append(seconds)
            stages.append(timer.seconds)
            if progress:
                progress(f"{device} staged run {i + 1}/{repeats}: {seconds:.3f} s")
        busy = None
        if torch.device(device).type == "cuda":
            busy = device_busy_seconds(lambda: run_conformance(pair, source, regimes, device=device, graphs=graphs))
            if progress:
                progress(f"{device} profiled plain run: the GPU busy {busy:.3f} s")
        reports.append(report)
        elements = sum(u.n_elements for u in report.tiles)
        timings.append(DeviceTiming(device, reference_path(device), repeats, warmup, wall(plain, elements),
                                    wall(staged, elements),
                                    {k: statistics.median(s[k] for s in stages) for k in StageTimer.STAGES}, busy))
    first = reports[0]
    replayed = graphs and any(torch.device(d).type == "cuda" for d in devices)
    return ConformBench(pair.a.name, pair.b.name, source.record, len(first.tiles),
                        sum(u.n_elements for u in first.tiles), first.verdict,
                        tuple(u.n_differing for u in first.tiles),
                        all(_comparable(r) == _comparable(first) for r in reports), tuple(timings),
                        environment_record(), graphs, judge_graphs().how() if replayed else None)


def format_table(result: ConformBench) -> str:
    """The plain runs' wall and throughput (what `alibi conform` pays), then the staged runs' wall and its split."""
    lines = [(f"alibi bench conform: {result.kernel_a} vs {result.kernel_b} on {result.source.get('label')}: "
              f"{result.units} units, {result.output_elements:,} output elements, verdict {result.verdict}"
              + ("; launches replayed from CUDA graphs where the kernels allow" if result.cuda_graphs else "")),
             (f"  {'check device':<12} {'wall s':>7} {'M elem/s':>9} {'spread s':>13}   {'staged s':>8} "
              f"{'M elem/s':>9} {'kernels':>8} {'reference':>9} {'checks':>7} {'io':>7} {'GPU busy':>8}")]
    for t in result.timings:
        s, w = t.stage_seconds, t.wall
        plain = (f"{w.seconds:7.3f} {w.elements_per_s / 1e6:9.1f} {w.spread[0]:6.3f}–{w.spread[1]:.3f}" if w
                 else f"{'–':>7} {'–':>9} {'–':>13}")
        lines.append(f"  {t.check_device:<12} {plain}   {t.staged.seconds:8.3f} {t.staged.elements_per_s / 1e6:9.1f} "
                     f"{s['kernels']:8.3f} {s['reference']:9.3f} {s['checks']:7.3f} {s['io']:7.3f} "
                     + (f"{t.device_busy:8.1%}" if t.device_busy is not None else f"{'–':>8}"))
    warmups = ", ".join(f"{t.check_device} {t.warmup_seconds:.3f} s" for t in result.timings
                        if t.warmup_seconds is not None)
    lines.append("  wall: plain runs, as `alibi conform` runs once warm; staged: runs split by stage, each stage "
                 "synchronized at its end; GPU busy: the device's share of the plain wall, from one profiled run"
                 + (f"; warm-up run (first in the process): {warmups}" if warmups else ""))
    if result.checks_launched:
        lines.append(f"  on the GPU: {result.checks_launched}")
    lines.append("  same verdict and per-unit counts on every check device: "
                 + ("yes" if result.identical_results else "NO"))
    return "\n".join(lines)


__all__ = ["SCHEMA", "V1", "ConformBench", "DeviceTiming", "Wall", "bench_conform", "covered_seconds",
           "device_busy_seconds", "format_table"]
