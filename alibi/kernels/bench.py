"""Throughput of the GPU kernels, side by side in one process: `alibi bench`.

Every kernel runs the full scaled GEMM it implements (int8 or e4m3 operands, per-row and
per-column fp32 scales, bfloat16 output, no bias) on the same operands. The first call of each
kernel — which may compile (nvcc, Triton) — is made before timing. Every row carries both timings,
side by side, because they rank kernels differently at small M:
* `graph_ms`: `triton.testing.do_bench_cudagraph` — the call captured in a CUDA graph and replayed,
  so host-side launch overhead (Python, ctypes, several torch launches for `cublas`) is excluded:
  GPU time, as a CUDA-graph-serving engine sees it;
* `eager_ms`: `triton.testing.do_bench` — plain launches back to back (CUDA events, median), which
  at small M measures the host overhead as much as the GPU. `graph_tops` and `eager_tops` are
  both given; `tops`/`ms` use the graph timing when it exists.

Repeats and spread. Each measurement is repeated `repeats` times, interleaved: round r times every
kernel of the case once, in an order rotated by r (so no kernel always runs first or last, after
the same neighbour, or on a cooler clock); `*_ms` is the median over rounds and `*_ms_spread`
(min, max) shows how much the rounds disagree.

L2. With `l2="warm"` the same operands are reused call after call, so in the CUDA-graph timing
weights that fit the L2 (16 MiB of int8 weights at N = K = 4096, against 60 MB of L2 on an H200)
are served from it. With `l2="cold"` the call rotates over `rotation_count` copies of the operands
whose total size is at least twice the L2, so every call reads its operands from HBM, as a model's
successive layers do; the timed function makes all the rotated calls and the time is divided by
their number (a CUDA graph replays fixed pointers, so the rotation is captured inside it). Note
that `triton.testing.do_bench` already clears the L2 (it writes a 256 MB buffer) before every
eager call it times, so eager timings are L2-cold in both modes; the mode matters for `graph_ms`.

TOPS = 2·M·N·K / time. Each row is also given as a ratio to two baselines measured in the same
process, for each timing (`ratios` graph or else eager, `ratios_eager` eager):
* `torch._int_mm` alone (int8) or `cublaslt-fp8` (fp8): the bare vendor GEMM. Its operands are
  padded once, before timing (`prepare_int_mm`: cuBLASLt needs M > 16 and K, N multiples of 8), so
  no padding kernel is inside the timed region — the padded calls measured earlier charged a
  pad kernel to the baseline at M ≤ 16. For int8 this is stricter than the `cublas` kernel, which
  adds its epilogue as separate torch kernels;
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

from alibi.errors import KernelUnavailable
from alibi.io import atomic
from alibi.kernels import nvcc
from alibi.kernels.cublas import MIN_M, MULTIPLE
from alibi.kernels.registry import get_kernel

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
    graph_ms: float | None = None  # median over the interleaved rounds
    eager_ms: float | None = None
    tops: float | None = None
    ratios: dict[str, float] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)
    l2: str = "warm"               # "warm": operands reused; "cold": rotated over copies larger than L2
    graph_tops: float | None = None
    eager_tops: float | None = None
    graph_ms_spread: tuple[float, float] | None = None  # (min, max) over the rounds
    eager_ms_spread: tuple[float, float] | None = None
    repeats: int = 1
    ratios_eager: dict[str, float] = field(default_factory=dict)


def timer(fn: Callable[[], Any], rep_ms: int) -> float:
    """Median ms per eager call of `fn` (triton.testing.do_bench; plain CUDA events if triton is absent)."""
    try:
        # deferred: keeps triton out of start-up
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
        # deferred: keeps triton out of start-up
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


L2_MODES: tuple[str, ...] = ("warm", "cold")
L2_FALLBACK_BYTES = 128 * 2**20  # when the device does not report its L2 size: larger than any GPU's L2 so far


def rotation_count(operand_bytes: int, l2_bytes: int, l2: str, factor: int = 2) -> int:
    """How many operand copies one timed call rotates over: 1 when warm; when cold, enough that the
    copies together hold at least `factor` × the L2, so no call finds its operands cached."""
    if l2 == "warm":
        return 1
    if l2 != "cold":
        raise ValueError(f"l2 mode {l2!r}; use one of {', '.join(L2_MODES)}")
    return max(2, -(-factor * l2_bytes // max(1, operand_bytes)))


def l2_bytes() -> int:
    """The current CUDA device's L2 size in bytes (`L2_cache_size`), or `L2_FALLBACK_BYTES`."""
    size = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", None)
    return int(size) if size else L2_FALLBACK_BYTES


def prepare_int_mm(a_q: torch.Tensor, w_q: torch.Tensor) -> tuple[Callable[[], torch.Tensor], dict[str, Any]]:
    """The bare `torch._int_mm` baseline with its operands padded once, here, outside any timing.

    cuBLASLt's int8 GEMM wants M > 16 and K, N multiples of 8 (`alibi.kernels.cublas.int_mm_padded`
    pads inside every call); zero rows and columns add nothing to an exact accumulator, so the
    padded product holds the same values. The returned function is one `torch._int_mm` launch.
    """
    M, K = a_q.shape
    N = w_q.shape[0]
    pad_m, pad_k, pad_n = max(0, MIN_M - M), -K % MULTIPLE, -N % MULTIPLE
    a = torch.nn.functional.pad(a_q, (0, pad_k, 0, pad_m)).contiguous()
    w_t = torch.nn.functional.pad(w_q, (0, pad_k, 0, pad_n)).contiguous().t()  # column-major [K,N] ("TN")
    return (lambda: torch._int_mm(a, w_t)), {
        "what": "torch._int_mm accumulator only, on operands padded once before timing",
        "pad_m": pad_m, "pad_k": pad_k, "pad_n": pad_n}


def _copies(ops: dict[str, torch.Tensor], count: int) -> list[dict[str, torch.Tensor]]:
    return [ops] + [{k: v.clone() for k, v in ops.items()} for _ in range(count - 1)]


def rotating(call: Callable[[dict[str, torch.Tensor]], Any], copies: list[dict[str, torch.Tensor]]
             ) -> Callable[[], None]:
    """One function that makes `call` once on each copy in turn (time it, divide by len(copies))."""
    def every_copy() -> None:
        for c in copies:
            call(c)
    return every_copy


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int,
                time_one: Callable[[str, Callable[[], Any]], Any]) -> dict[str, list[Any]]:
    """`time_one(name, fn)` for every fn, `repeats` rounds; round r starts at the r-th fn (rotated order)."""
    names = list(fns)
    out: dict[str, list[Any]] = {n: [] for n in names}
    for r in range(repeats):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            out[name].append(time_one(name, fns[name]))
    return out


def median_and_spread(values: Sequence[float | None]) -> tuple[float | None, tuple[float, float] | None]:
    """Median and (min, max) of the rounds' times; None when any round could not be timed that way."""
    if not values or any(v is None for v in values):
        return None, None
    ordered = sorted(values)  # type: ignore[type-var]
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return float(median), (float(ordered[0]), float(ordered[-1]))


def _prepared(name: str, case: Case, copies: list[dict[str, torch.Tensor]]
              ) -> tuple[Callable[[], Any] | None, Measurement | None, dict[str, Any], Any]:
    """(the timed function over all copies, or None with the row saying why; detail; the kernel)."""
    base = {"kernel": name, "fmt": case.fmt, "M": case.M, "N": case.N, "K": case.K}
    if name == INT_MM:
        prepared = [prepare_int_mm(c["a_q"], c["w_q"]) for c in copies]
        fns = [fn for fn, _ in prepared]
        return (lambda: [fn() for fn in fns]), None, prepared[0][1], None
    kernel = get_kernel(name)
    ok, reason = kernel.available()
    if not ok:
        return None, Measurement(**base, status="unavailable", reason=reason), {}, kernel
    if case.fmt not in kernel.formats:
        return None, Measurement(**base, status="unavailable", reason=f"handles {kernel.formats}, not {case.fmt}"), {}, \
            kernel
    call = lambda c: kernel.scaled_mm(c["a_q"], c["s_a"], c["w_q"], c["s_w"], None, torch.bfloat16)
    return rotating(call, copies), None, {}, kernel


def _measure_case(names: Sequence[str], case: Case, ops: dict[str, torch.Tensor], rep_ms: int, l2: str,
                  repeats: int, l2_size: int) -> list[Measurement]:
    """Every kernel of `names` on `case` in L2 mode `l2`, timed in `repeats` interleaved rounds."""
    operand_bytes = sum(t.numel() * t.element_size() for t in ops.values())
    count = rotation_count(operand_bytes, l2_size, l2)
    copies = _copies(ops, count)
    rows: dict[str, Measurement] = {}
    fns: dict[str, Callable[[], Any]] = {}
    details: dict[str, dict[str, Any]] = {}
    kernels: dict[str, Any] = {}
    for name in names:
        fn, refused, detail, kernel = _prepared(name, case, copies)
        if refused is not None:
            rows[name] = refused
            continue
        try:
            fn()  # first calls: may compile (nvcc, Triton); not timed
            torch.cuda.synchronize()
        except (KernelUnavailable, RuntimeError) as exc:
            rows[name] = Measurement(name, case.fmt, case.M, case.N, case.K, "error",
                                     f"{type(exc).__name__}: {exc}"[:500], l2=l2)
            continue
        fns[name], details[name], kernels[name] = fn, detail, kernel

    failed: dict[str, str] = {}

    def time_one(name: str, fn: Callable[[], Any]) -> tuple[float | None, float | None]:
        if name in failed:
            return None, None
        try:
            return timer(fn, rep_ms) / count, (None if (g := graph_timer(fn, rep_ms)) is None else g / count)
        except (KernelUnavailable, RuntimeError) as exc:
            failed[name] = f"{type(exc).__name__}: {exc}"[:500]
            return None, None

    rounds = interleaved(fns, repeats, time_one)
    for name, times in rounds.items():
        base = {"kernel": name, "fmt": case.fmt, "M": case.M, "N": case.N, "K": case.K}
        if name in failed:
            rows[name] = Measurement(**base, status="error", reason=failed[name], l2=l2)
            continue
        eager_ms, eager_spread = median_and_spread([e for e, _ in times])
        graph_ms, graph_spread = median_and_spread([g for _, g in times])
        detail = dict(details[name])
        last = getattr(kernels[name], "last_run", None) or getattr(kernels[name], "last_config", None)
        if last is not None:
            detail["last_run"] = last if isinstance(last, dict) else asdict(last)
        if count > 1:
            detail["l2_rotation"] = {"copies": count, "operand_bytes": operand_bytes, "l2_bytes": l2_size}
        ms = graph_ms if graph_ms is not None else eager_ms
        rows[name] = Measurement(
            **base, status="ok", ms=ms, timing="graph" if graph_ms is not None else "eager", graph_ms=graph_ms,
            eager_ms=eager_ms, tops=case.ops / (ms * 1e-3) / 1e12, detail=detail, l2=l2,
            graph_tops=None if graph_ms is None else case.ops / (graph_ms * 1e-3) / 1e12,
            eager_tops=case.ops / (eager_ms * 1e-3) / 1e12, graph_ms_spread=graph_spread,
            eager_ms_spread=eager_spread, repeats=repeats)
    del copies
    return [rows[n] for n in names]


def _with_ratios(rows: list[Measurement], baselines: Sequence[str]) -> list[Measurement]:
    """Ratios of TOPS to each baseline on the same shape and L2 mode: `ratios` with both timed the
    same way (graph, else eager), `ratios_eager` from the eager timings."""
    out = []
    for r in rows:
        ratios, ratios_eager = {}, {}
        for b in baselines:
            ref = next((x for x in rows if x.kernel == b and x.fmt == r.fmt and (x.M, x.N, x.K) == (r.M, r.N, r.K)
                        and x.l2 == r.l2 and x.status == "ok"), None)
            if r.status != "ok" or ref is None:
                continue
            if r.graph_ms is not None and ref.graph_ms is not None:
                ratios[b] = round(ref.graph_ms / r.graph_ms, 3)
            else:
                ratios[b] = round(ref.eager_ms / r.eager_ms, 3)  # type: ignore[operator]
            ratios_eager[b] = round(ref.eager_ms / r.eager_ms, 3)  # type: ignore[operator]
        out.append(Measurement(**{**asdict(r), "ratios": ratios, "ratios_eager": ratios_eager}))
    return out


def environment() -> dict[str, Any]:
    """GPU, driver, torch, triton, CUDA, CUTLASS and nvcc versions of this run."""
    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda_runtime_torch": torch.version.cuda, "host": platform.node(),
                           "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        # deferred: keeps triton out of start-up
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
        env["cutlass"] = nvcc.cutlass_version()
        env["nvcc"] = nvcc.nvcc_version(nvcc.find_nvcc())
    except KernelUnavailable as exc:
        env["cutlass"] = env.get("cutlass") or f"unavailable: {exc}"
    return env


def run_bench(int8_kernels: Sequence[str] = INT8_KERNELS, fp8_kernels: Sequence[str] = FP8_KERNELS,
              cases: Sequence[Case] | None = None, rep_ms: int = 100, seed: int = 0,
              progress: Callable[[str], None] | None = None, repeats: int = 3,
              l2_modes: Sequence[str] = L2_MODES) -> dict[str, Any]:
    """Measure every kernel on every case in every L2 mode, `repeats` interleaved rounds each;
    returns the report (schema `alibi.bench/2`, see `write_report` and the module docstring)."""
    if cases is None:
        cases = default_cases("int8") + default_cases("fp8_e4m3")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    for mode in l2_modes:
        rotation_count(1, 1, mode)  # refuses an unknown mode before anything runs
    rows: list[Measurement] = []
    have_cuda = torch.cuda.is_available()
    l2_size = l2_bytes() if have_cuda else None
    for case in cases:
        names = ([INT_MM, *int8_kernels] if case.fmt == "int8" else list(fp8_kernels))
        if not have_cuda:
            rows += [Measurement(n, case.fmt, case.M, case.N, case.K, "unavailable",
                                 "no CUDA GPU here (torch.cuda.is_available() is False)", l2=mode)
                     for mode in l2_modes for n in names]
            continue
        ops = operands(case, seed)
        for mode in l2_modes:
            for m in _measure_case(names, case, ops, rep_ms, mode, repeats, l2_size):
                rows.append(m)
                if progress:
                    what = (f"graph {m.graph_tops or 0:8.1f} eager {m.eager_tops:8.1f} TOPS" if m.tops is not None
                            else f"{m.status}: {m.reason[:80]}")
                    progress(f"{case.fmt:8s} M={case.M:<5d} N={case.N:<5d} K={case.K:<5d} L2 {mode:4s} "
                             f"{m.kernel:22s} {what}")
            torch.cuda.empty_cache()
        del ops
        torch.cuda.empty_cache()
    rows = _with_ratios(rows, [INT_MM, "cublas", "cublaslt-fp8"])
    return {"schema": "alibi.bench/2", "environment": environment(),
            "timer": "triton.testing.do_bench_cudagraph median (graph_ms), triton.testing.do_bench median (eager_ms); "
                     f"median and (min, max) over {repeats} interleaved rounds",
            "rep_ms": rep_ms, "seed": seed, "repeats": repeats, "l2_modes": list(l2_modes), "l2_bytes": l2_size,
            "results": [asdict(r) for r in rows]}


def write_report(report: dict[str, Any], path: str | Path) -> Path:
    """Write the report as JSON, atomically."""
    return atomic.write_text(path, json.dumps(report, indent=2) + "\n")


def format_table(report: dict[str, Any]) -> str:
    """A plain-text table: one line per kernel, shape and L2 mode, with graph and eager TOPS side by
    side, the ratios to the baselines (graph timing, else eager) and each timing's spread."""
    header = (f"{'fmt':8s} {'M':>5s} {'N':>5s} {'K':>5s} {'L2':4s}  {'kernel':22s} {'graph TOPS':>10s} "
              f"{'eager TOPS':>10s}  {'/int_mm':>7s} {'/cublas':>7s} {'/cublaslt-fp8':>13s}  "
              f"{'graph µs (min-max)':>20s} {'eager µs (min-max)':>20s}  note")
    lines = [header]

    def timing(ms: float | None, spread: list[float] | tuple[float, float] | None) -> str:
        if ms is None:
            return f"{'-':>20s}"
        rng = f" ({spread[0] * 1e3:.1f}-{spread[1] * 1e3:.1f})" if spread else ""
        return f"{ms * 1e3:.1f}{rng}".rjust(20)

    for r in report["results"]:
        g_tops = r.get("graph_tops")
        e_tops = r.get("eager_tops")
        g = f"{g_tops:10.1f}" if g_tops is not None else f"{'-':>10s}"
        e = f"{e_tops:10.1f}" if e_tops is not None else f"{'-':>10s}"
        ratio = [f"{r['ratios'][b]:.2f}" if b in r["ratios"] else "-" for b in (INT_MM, "cublas", "cublaslt-fp8")]
        note = "" if r["status"] == "ok" else f"{r['status']}: {r['reason'][:90]}"
        lines.append(f"{r['fmt']:8s} {r['M']:5d} {r['N']:5d} {r['K']:5d} {r.get('l2', 'warm'):4s}  {r['kernel']:22s} "
                     f"{g} {e}  {ratio[0]:>7s} {ratio[1]:>7s} {ratio[2]:>13s}  "
                     f"{timing(r.get('graph_ms'), r.get('graph_ms_spread'))} "
                     f"{timing(r.get('eager_ms'), r.get('eager_ms_spread'))}  {note}")
    return "\n".join(lines)
