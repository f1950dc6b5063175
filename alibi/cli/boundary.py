"""`alibi boundary`: the arithmetic facts of the integer alibi (paper §VI), checked through each int8 kernel."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from alibi.errors import InputError
from alibi.io import atomic


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("boundary", help="check the 2^24, int32, pow2 and bf16-midpoint facts through each int8 kernel",
                       description="Check, through each int8 kernel's own output bits and accumulator: int32→fp32 "
                                   "round trips at ±(2^24−1), ±2^24, ±(2^24+1), ±(2^24+2); exact accumulation up to "
                                   "K=32768; power-of-two commutation (and its failure once a value is subnormal); "
                                   "bf16 rounding at midpoints. Exit 0 when every fact holds, 1 otherwise.")
    p.add_argument("--kernel", action="append", metavar="K",
                   help="an int8 kernel to check (repeatable; default: every int8 kernel, unavailable ones listed)")
    p.add_argument("--out", type=Path, help="write the report (JSON, schema alibi.boundary/v1) to this file")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    from alibi.controls.boundary import run_boundary, summary_lines

    if args.out is not None:
        if args.out.is_dir():
            raise InputError(f"--out {args.out}: is a folder; give a file name such as {args.out}/boundary.json")
        atomic.check_writable_dir(args.out.parent)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    report = run_boundary(args.kernel, progress=None if args.quiet else progress)
    if args.out is not None:
        atomic.write_text(args.out, report.to_json())
    print("\n".join(summary_lines(report)))
    if args.out is not None:
        print(f"  report: {args.out}")
    return report.exit_code
