"""`alibi run EXPERIMENT.yaml`: run a study unit by unit into an artifact folder, resumable."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from alibi.conform.report import summary_lines
from alibi.conform.unit_store import unit_files
from alibi.experiment import UNITS_DIR, load_experiment, run_experiment, stderr_progress
from alibi.experiment import __doc__ as FORMAT

_EPILOG = FORMAT.split("An experiment file", 1)[1].split("The runner works", 1)[0]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run", help="run an experiment file (experiments/*.yaml), resumable",
        description="Run a study: every tile under every scale regime, one persisted unit at a time, then the "
                    "report (OUT/report/) and OUT/manifest.json. Exit codes as for conform.",
        epilog="An experiment file" + _EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", type=Path, help="the experiment YAML file")
    p.add_argument("--out", type=Path, default=None, help="artifact folder (default: the file's `out`)")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run in OUT from its last complete unit (a missing or empty OUT, where no "
                        "run.json was written, falls back to a fresh start and says so on one line)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run a pre-registered experiment although the toolkit's sources differ from the git HEAD "
                        "commit (refused otherwise); recorded in run.json and the manifest")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=_run, interrupted=_interrupted)


def _interrupted(args: argparse.Namespace) -> str:
    """What Ctrl-C leaves: the finished units (each written atomically), and the command that continues."""
    out = args.out if args.out is not None else Path(load_experiment(args.experiment).out)
    done = len(unit_files(out / UNITS_DIR))  # not plan.json, not the ledgers
    again = f"alibi run {args.experiment}" + (f" --out {args.out}" if args.out is not None else "") + " --resume"
    return f"{done} finished unit(s) kept in {out / UNITS_DIR}; continue with: {again}"


def _units_line(result) -> str:
    if result.computed_units == 0 and result.resumed_units:
        return (f"  units: all {result.resumed_units} were already complete (nothing computed); "
                "the report was folded again from them")
    if result.resumed_units:
        return f"  units: {result.computed_units} computed now, {result.resumed_units} kept from the interrupted run"
    return f"  units: {result.computed_units} computed"


def _run(args: argparse.Namespace) -> int:
    exp = load_experiment(args.experiment)
    result = run_experiment(exp, args.out, resume=args.resume, progress=None if args.quiet else stderr_progress(),
                            allow_dirty=args.allow_dirty, notice=lambda line: print(line, file=sys.stderr, flush=True))
    print("\n".join(summary_lines(result.report)))
    print(_units_line(result))
    print(f"  artifacts: {result.out}/ (report/report.json, report/report.md, report/junit.xml, report/report.html, manifest.json)")
    return result.exit_code
