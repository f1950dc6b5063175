"""Throughput of the GPU kernels, side by side in one process: `alibi bench`.

Every kernel runs the full scaled GEMM it implements (int8 or e4m3 operands, per-row and
per-column fp32 scales, bfloat16 output, no bias) on the same operands. The first call of each
kernel — which may compile (nvcc, Triton) — is made before timing. Two timings per row:
* `graph_ms`: `triton.testing.do_bench_cudagraph` — the call captured in a CUDA graph and replayed,
  so host-side launch overhead (Python, ctypes, several torch launches for `cublas`) is excluded:
  GPU time, as a CUDA-graph-serving engine sees it. TOPS and ratios use this when every kernel of
  the comparison could be captured;
* `eager_ms`: `triton.testing.do_bench` — plain launches back to back (CUDA events, median), which
  at small M measures the host overhead as much as the GPU.

TOPS = 2·M·N·K / time. Each row is also given as a ratio to two baselines measured in the same
process:
* `torch._int_mm` alone (int8) or `cublaslt-fp8` (fp8): the bare vendor GEMM. For int8 this is
  stricter than the `cublas` kernel, which adds its epilogue as separate torch kernels;
* the `cublas` kernel itself (int8): the like-for-like comparison the issue asks for.

Kernels that cannot run here are listed with the reason, never dropped; a kernel that fails while
running is listed with its error.
"""

from __future__ import annotations

import json
import platform
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from alibi import atomic
from alibi.errors import KernelUnavailable
from alibi.kernels import get_kernel

# vLLM's own kernels run wherever their op library / Triton file is found (alibi/kernels/vllm.py), so the
# project's kernels are measured against the engine's in one process; elsewhere they are rows with the reason.
INT8_KERNELS: tuple[str, ...] = ("cutlass", "cutlass-sm80", "triton", "cublas", "vllm-cutlass", "vllm-triton")
FP8_KERNELS: tuple[str, ...] = ("cutlass-fp8", "triton-fp8", "cublaslt-fp8", "vllm-cutlass-fp8")
INT_MM = "torch._int_mm"  # the bare cuBLASLt int8 GEMM (accumulator only), a baseline row


@dataclass(frozen=True)
class Case:
    """One GEMM shape in one operand format ("int8" or "fp8_e4m3")."""

    fmt: str
    M: int
    N: int
    K: int

    @property
    def ops(self) -> int:
        return 2 * self.M * self.N * self.K


def default_cases(fmt: str) -> list[Case]:
    """M ∈ {1, 16, 128, 512, 4096} at K = N = 4096, and M = 4096 at K = N = 8192."""
    return [Case(fmt, m, 4096, 4096) for m in (1, 16, 128, 512, 4096)] + [Case(fmt, 4096, 8192, 8192)]


@dataclass(frozen=True)
class Measurement:
    """One kernel on one case. ms/tops are None when it did not run (see `status` and `reason`)."""

    kernel: str
    fmt: str
    M: int
    N: int
    K: int
    status: str  # "ok" | "unavailable" | "error"
    reason: str = ""
    ms: float | None = None        # the time TOPS and ratios use (graph_ms if captured, else eager_ms)
    timing: str = ""               # "graph" or "eager"
    graph_ms: float | None = None
    eager_ms: float | None = None
    tops: float | None = None
    ratios: dict[str, float] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)


def timer(fn: Callable[[], Any], rep_ms: int) -> float:
    """Median ms per eager call of `fn` (triton.testing.do_bench; plain CUDA events if triton is absent)."""
    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None
    if do_bench is not None:
        return float(do_bench(fn, warmup=max(5, rep_ms // 4), rep=rep_ms, return_mode="median"))
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(20):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def graph_timer(fn: Callable[[], Any], rep_ms: int) -> float | None:
    """Median ms per call of `fn` replayed from a CUDA graph, or None if it cannot be captured."""
    try:
        from triton.testing import do_bench_cudagraph
        return float(do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"))
    except Exception:  # noqa: BLE001 - capture can fail in many ways; the eager timing still stands
        torch.cuda.synchronize()
        return None


def operands(case: Case, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random operands on the GPU: int8 in [-127, 127] or e4m3 from N(0,1); scales ~ 1e-2 (real, not pow2)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    if case.fmt == "int8":
        a = torch.randint(-127, 128, (case.M, case.K), dtype=torch.int8, device="cuda", generator=g)
        w = torch.randint(-127, 128, (case.N, case.K), dtype=torch.int8, device="cuda", generator=g)
    else:
        a = torch.randn(case.M, case.K, device="cuda", generator=g).to(torch.float8_e4m3fn)
        w = torch.randn(case.N, case.K, device="cuda", generator=g).to(torch.float8_e4m3fn)
    s_a = torch.rand(case.M, device="cuda", generator=g) * 1e-2 + 1e-3
    s_w = torch.rand(case.N, device="cuda", generator=g) * 1e-2 + 1e-3
    return {"a_q": a, "s_a": s_a, "w_q": w, "s_w": s_w}


def _measure(name: str, case: Case, ops: dict[str, torch.Tensor], rep_ms: int) -> Measurement:
    base = {"kernel": name, "fmt": case.fmt, "M": case.M, "N": case.N, "K": case.K}
    if name == INT_MM:
        from alibi.kernels.cublas import int_mm_padded

        fn: Callable[[], Any] = lambda: int_mm_padded(ops["a_q"], ops["w_q"])
        detail: dict[str, Any] = {"what": "torch._int_mm accumulator only (rows padded to 17 when M <= 16)"}
    else:
        kernel = get_kernel(name)
        ok, reason = kernel.available()
        if not ok:
            return Measurement(**base, status="unavailable", reason=reason)
        if case.fmt not in kernel.formats:
            return Measurement(**base, status="unavailable", reason=f"handles {kernel.formats}, not {case.fmt}")
        fn = lambda: kernel.scaled_mm(ops["a_q"], ops["s_a"], ops["w_q"], ops["s_w"], None, torch.bfloat16)
        detail = {}
    try:
        fn()  # first call: may compile (nvcc, Triton); not timed
        torch.cuda.synchronize()
        eager_ms = timer(fn, rep_ms)
        graph_ms = graph_timer(fn, rep_ms)
    except (KernelUnavailable, RuntimeError) as exc:
        return Measurement(**base, status="error", reason=f"{type(exc).__name__}: {exc}"[:500])
    if name != INT_MM:
        last = getattr(kernel, "last_run", None) or getattr(kernel, "last_config", None)
        if last is not None:
            detail = {"last_run": last if isinstance(last, dict) else asdict(last)}
    ms = graph_ms if graph_ms is not None else eager_ms
    return Measurement(**base, status="ok", ms=ms, timing="graph" if graph_ms is not None else "eager",
                       graph_ms=graph_ms, eager_ms=eager_ms, tops=case.ops / (ms * 1e-3) / 1e12, detail=detail)


def _with_ratios(rows: list[Measurement], baselines: Sequence[str]) -> list[Measurement]:
    """Ratios of TOPS to each baseline on the same shape, both timed the same way (graph, else eager)."""
    out = []
    for r in rows:
        ratios = {}
        for b in baselines:
            ref = next((x for x in rows if x.kernel == b and x.fmt == r.fmt and (x.M, x.N, x.K) == (r.M, r.N, r.K)
                        and x.status == "ok"), None)
            if r.status != "ok" or ref is None:
                continue
            if r.graph_ms is not None and ref.graph_ms is not None:
                ratios[b] = round(ref.graph_ms / r.graph_ms, 3)
            else:
                ratios[b] = round(ref.eager_ms / r.eager_ms, 3)  # type: ignore[operator]
        out.append(Measurement(**{**asdict(r), "ratios": ratios}))
    return out


def environment() -> dict[str, Any]:
    """GPU, driver, torch, triton, CUDA, CUTLASS and nvcc versions of this run."""
    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda_runtime_torch": torch.version.cuda, "host": platform.node(),
                           "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=torch.cuda.get_device_name(0), capability=f"sm_{p.major}{p.minor}",
                   sm_count=p.multi_processor_count, memory_gib=round(p.total_memory / 2**30, 1))
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,power.limit",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30, check=False)
        if smi.returncode == 0:
            driver, clock, power = (x.strip() for x in smi.stdout.splitlines()[0].split(","))
            env.update(driver=driver, max_sm_clock=clock, power_limit=power)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        env["driver"] = None
    try:
        from alibi.kernels import nvcc
        env["cutlass"] = nvcc.cutlass_version()
        env["nvcc"] = nvcc.nvcc_version(nvcc.find_nvcc())
    except KernelUnavailable as exc:
        env["cutlass"] = env.get("cutlass") or f"unavailable: {exc}"
    return env


def run_bench(int8_kernels: Sequence[str] = INT8_KERNELS, fp8_kernels: Sequence[str] = FP8_KERNELS,
              cases: Sequence[Case] | None = None, rep_ms: int = 100, seed: int = 0,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure every kernel on every case; returns the report (see `write_report`)."""
    if cases is None:
        cases = default_cases("int8") + default_cases("fp8_e4m3")
    rows: list[Measurement] = []
    have_cuda = torch.cuda.is_available()
    for case in cases:
        names = ([INT_MM, *int8_kernels] if case.fmt == "int8" else list(fp8_kernels))
        if not have_cuda:
            rows += [Measurement(n, case.fmt, case.M, case.N, case.K, "unavailable",
                                 "no CUDA GPU here (torch.cuda.is_available() is False)") for n in names]
            continue
        ops = operands(case, seed)
        for name in names:
            m = _measure(name, case, ops, rep_ms)
            rows.append(m)
            if progress:
                what = f"{m.tops:8.1f} TOPS" if m.tops is not None else f"{m.status}: {m.reason[:80]}"
                progress(f"{case.fmt:8s} M={case.M:<5d} N={case.N:<5d} K={case.K:<5d} {name:22s} {what}")
        del ops
        torch.cuda.empty_cache()
    rows = _with_ratios(rows, [INT_MM, "cublas", "cublaslt-fp8"])
    return {"schema": "alibi.bench/1", "environment": environment(),
            "timer": "triton.testing.do_bench_cudagraph median (graph_ms), triton.testing.do_bench median (eager_ms)",
            "rep_ms": rep_ms, "seed": seed, "results": [asdict(r) for r in rows]}


def write_report(report: dict[str, Any], path: str | Path) -> Path:
    """Write the report as JSON, atomically."""
    return atomic.write_text(path, json.dumps(report, indent=2) + "\n")


def format_table(report: dict[str, Any]) -> str:
    """A plain-text table: one line per kernel and shape, with TOPS, ratios and both timings."""
    header = (f"{'fmt':8s} {'M':>5s} {'N':>5s} {'K':>5s}  {'kernel':22s} {'TOPS':>8s}  "
              f"{'/int_mm':>7s} {'/cublas':>7s} {'/cublaslt-fp8':>13s}  {'graph µs':>9s} {'eager µs':>9s}  note")
    lines = [header]
    for r in report["results"]:
        tops = f"{r['tops']:8.1f}" if r["tops"] is not None else f"{'-':>8s}"
        ratio = [f"{r['ratios'][b]:.2f}" if b in r["ratios"] else "-" for b in (INT_MM, "cublas", "cublaslt-fp8")]
        g = f"{r['graph_ms'] * 1e3:9.1f}" if r.get("graph_ms") is not None else f"{'-':>9s}"
        e = f"{r['eager_ms'] * 1e3:9.1f}" if r.get("eager_ms") is not None else f"{'-':>9s}"
        note = "" if r["status"] == "ok" else f"{r['status']}: {r['reason'][:90]}"
        lines.append(f"{r['fmt']:8s} {r['M']:5d} {r['N']:5d} {r['K']:5d}  {r['kernel']:22s} {tops}  "
                     f"{ratio[0]:>7s} {ratio[1]:>7s} {ratio[2]:>13s}  {g} {e}  {note}")
    return "\n".join(lines)
