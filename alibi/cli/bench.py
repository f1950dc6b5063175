"""`alibi bench`: throughput of the GPU kernels side by side (TOPS and ratios), written to JSON."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from alibi import atomic
from alibi.errors import InputError, KernelUnavailable


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure kernel throughput (TOPS) side by side",
                       description="Time the int8 and fp8 kernels on the same operands in one process "
                                   "(triton.testing.do_bench) and report TOPS and ratios to the vendor GEMMs.")
    p.add_argument("--int8", default=None,
                   help="int8 kernels, comma-separated (default: every int8 GPU kernel; empty: none)")
    p.add_argument("--fp8", default=None,
                   help="fp8 kernels, comma-separated (default: every fp8 GPU kernel; empty: none)")
    p.add_argument("--shape", action="append", metavar="M,N,K",
                   help="a shape to measure (repeatable); default M in 1,16,128,512,4096 at N=K=4096 "
                        "and M=4096 at N=K=8192")
    p.add_argument("--rep-ms", type=int, default=100, help="timing budget per measurement in ms (default 100)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds per measurement (default 3; the "
                   "report gives the median and the min-max spread)")
    p.add_argument("--l2", default="warm,cold", help="L2 modes, comma-separated: warm (one operand set), cold "
                   "(operand copies rotated through more than twice the L2); default both")
    p.add_argument("--out", type=Path, default=Path("alibi-bench.json"), help="JSON report (default ./alibi-bench.json)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=run)


def _shapes(specs: list[str] | None) -> list[tuple[int, int, int]] | None:
    if not specs:
        return None
    shapes = []
    for spec in specs:
        try:
            m, n, k = (int(x) for x in spec.split(","))
        except ValueError:
            raise InputError(f"--shape {spec!r}: expected three integers M,N,K, e.g. 512,4096,4096") from None
        if min(m, n, k) < 1:
            raise InputError(f"--shape {spec!r}: M, N and K must be positive")
        shapes.append((m, n, k))
    return shapes


def run(args: argparse.Namespace) -> int:
    import torch

    from alibi.bench import FP8_KERNELS, INT8_KERNELS, Case, default_cases, format_table, run_bench, write_report
    from alibi.kernels import get_kernel

    if args.rep_ms < 1:
        raise InputError(f"--rep-ms must be positive, got {args.rep_ms}")
    if args.repeats < 1:
        raise InputError(f"--repeats must be at least 1, got {args.repeats}")
    l2_modes = [m for m in args.l2.split(",") if m]
    bad = sorted(set(l2_modes) - {"warm", "cold"})
    if bad or not l2_modes:
        raise InputError(f"--l2 {args.l2!r}: expected warm, cold or warm,cold")
    atomic.check_writable_dir(args.out.parent if str(args.out.parent) else Path("."))
    int8 = [k for k in (",".join(INT8_KERNELS) if args.int8 is None else args.int8).split(",") if k]
    fp8 = [k for k in (",".join(FP8_KERNELS) if args.fp8 is None else args.fp8).split(",") if k]
    for name in int8 + fp8:
        get_kernel(name)  # an unknown name is bad input (exit 2) before anything is timed
    shapes = _shapes(args.shape)
    if not torch.cuda.is_available():
        # Every row would read "unavailable": say so once and write no report of nothing.
        raise KernelUnavailable(f"bench: timing kernels needs a CUDA GPU, and torch {torch.__version__} sees none "
                                f"here; nothing was measured or written (run it on a machine with an NVIDIA GPU)")
    cases: list[Case] = []
    if int8:
        cases += default_cases("int8") if shapes is None else [Case("int8", *s) for s in shapes]
    if fp8:
        cases += default_cases("fp8_e4m3") if shapes is None else [Case("fp8_e4m3", *s) for s in shapes]
    report = run_bench(int8, fp8, cases, rep_ms=args.rep_ms, repeats=args.repeats, l2_modes=l2_modes,
                       progress=None if args.quiet else (lambda line: print(line, file=sys.stderr)))
    if not any(r["status"] == "ok" for r in report["results"]):
        reasons = sorted({f"{r['kernel']}: {r['reason']}" for r in report["results"]})
        raise KernelUnavailable(f"none of the requested kernels ran here ({reasons[0]}"
                                + (f"; and {len(reasons) - 1} more" if len(reasons) > 1 else "") + "); nothing written")
    write_report(report, args.out)
    print(format_table(report))
    env = report["environment"]
    print(f"\n{env.get('gpu', 'no GPU')} · driver {env.get('driver')} · torch {env['torch']} · "
          f"triton {env.get('triton')} · CUDA {env.get('cuda_runtime_torch')} · CUTLASS {env.get('cutlass')}")
    print(f"wrote {args.out}")
    return 0
