"""`alibi analyze depth`: fit depth sweeps (four models, held-out ranking, stability) and draw the figures."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from alibi.errors import InputError
from alibi.io import atomic
from alibi.io.limits import MAX_BOOTSTRAP, check_count


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("depth", help="fit the fraction differing against K; figures of depth and rows sweeps",
                       description="Fit constant, power-law, square-root and generalized saturation models to each "
                                   "SWEEP (a folder from 'alibi sweep depth', its depth.json, or a CSV with columns "
                                   "seed,K,frac_differ[,n,n_differing]); writes fits.json, fits.md, depth.png/svg "
                                   "(and rows.png/svg with --rows) and manifest.json to --out.")
    p.add_argument("sweeps", nargs="+", type=Path, metavar="SWEEP", help="depth sweep folder, JSON or CSV (several: one figure)")
    p.add_argument("--rows", type=Path, help="a rows sweep (folder from 'alibi sweep rows' or its rows.json) to plot too")
    p.add_argument("--bootstrap", type=int, default=1000, help="seed-bootstrap resamples B (default 1000)")
    p.add_argument("--bootstrap-seed", type=int, default=0, help="seed of the bootstrap generator (default 0)")
    p.add_argument("--out", type=Path, required=True, help="output folder (replaced only when complete)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    from alibi.sweep.analysis import analyze
    from alibi.sweep.output import write_analysis_folder
    from alibi.sweep.records import read_depth_input, read_rows_sweep

    if args.bootstrap < 0:
        raise InputError(f"--bootstrap must be ≥ 0 resamples, got {args.bootstrap}")
    check_count(args.bootstrap, "--bootstrap", MAX_BOOTSTRAP, "resamples")
    if args.bootstrap_seed < 0:
        raise InputError(f"--bootstrap-seed must be ≥ 0, got {args.bootstrap_seed}")
    inputs = {f"SWEEP {p}": p for p in args.sweeps} | ({"--rows": args.rows} if args.rows else {})
    for path in inputs.values():
        if not path.exists():
            raise InputError(f"{path}: no such file or folder")
    atomic.refuse_overlap(args.out, inputs, "--out")
    atomic.check_writable_dir(args.out)
    sweeps = [read_depth_input(p) for p in args.sweeps]
    rows = read_rows_sweep(args.rows) if args.rows else None
    say = None if args.quiet else (lambda line: print(f"alibi analyze depth: {line}", file=sys.stderr, flush=True))
    analysis = analyze(sweeps, rows, None if args.rows is None else str(args.rows), bootstrap=args.bootstrap,
                       bootstrap_seed=args.bootstrap_seed, progress=say)
    written = write_analysis_folder(analysis, [s.data for s in sweeps], args.sweeps, args.rows, args.out)
    for fits in analysis.analyses:
        print(fits.statement)
    print(f"  wrote {args.out}/" + ", ".join(written))
    return 0
