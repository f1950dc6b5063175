"""Benchmark: the emulator's exact accumulator against a plain fp64 GEMM of the same shape.

Both run in this one process, interleaved, on the same operands; the ratio is what is reported
(throughput of the exact accumulator / throughput of the plain fp64 GEMM, higher is better).

    python analysis/bench_exact_accumulator.py [--out analysis/results/cpu/exact-accumulator/exact_accumulator.json]

The committed result (with a manifest naming the commit) is made from a clean worktree by
`python analysis/remake_cpu_results.py --out DIR exact-accumulator`.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

from alibi.exact.emulator import exact_accumulator
from alibi.io import atomic

SHAPES = [(512, 576, 576), (512, 576, 1536), (512, 1536, 576), (512, 2048, 2048), (256, 6144, 2048)]


def best_of(fn, repeats: int, batch_s: float = 0.3) -> float:
    """Seconds per call: the best of `repeats` batches, each long enough (≥ batch_s) that a coarse
    clock (this VM's ticks every few ms) does not dominate."""
    t0 = time.perf_counter()
    fn()
    per_call = max(time.perf_counter() - t0, 1e-4)
    calls = max(1, int(batch_s / per_call))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="analysis/results/cpu/exact-accumulator/exact_accumulator.json")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    rows = []
    for M, K, N in SHAPES:
        a = torch.randint(-128, 128, (M, K), generator=g, dtype=torch.int8)
        w = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
        a64, w64 = a.double(), w.double()
        exact_accumulator(a, w), a64 @ w64.T  # warm up
        t_exact, t_fp64 = [], []
        for _ in range(args.repeats):  # interleaved, so drifting load affects both sides alike
            t_exact.append(best_of(lambda: exact_accumulator(a, w), 1))
            t_fp64.append(best_of(lambda: a64 @ w64.T, 1))
        t_exact, t_fp64 = min(t_exact), min(t_fp64)
        ratio = t_fp64 / t_exact
        rows.append({"M": M, "K": K, "N": N, "exact_s": t_exact, "fp64_gemm_s": t_fp64,
                     "throughput_ratio_exact_over_fp64": ratio})
        print(f"M={M:5d} K={K:5d} N={N:5d}  exact {t_exact * 1e3:8.2f} ms  fp64 {t_fp64 * 1e3:8.2f} ms  "
              f"ratio {ratio:.3f}")
    result = {"benchmark": "exact accumulator vs plain fp64 GEMM (same process, best of repeats)",
              "machine": {"platform": platform.platform(), "processor": platform.processor(),
                          "cpu_count": torch.get_num_threads(), "torch": torch.__version__,
                          "python": platform.python_version()},
              "shapes": rows, "min_ratio": min(r["throughput_ratio_exact_over_fp64"] for r in rows)}
    atomic.write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(f"min ratio {result['min_ratio']:.3f}; written to {args.out}")


if __name__ == "__main__":
    main()
