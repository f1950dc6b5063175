"""`alibi run EXPERIMENT.yaml`: run a study unit by unit into an artifact folder, resumable."""

from __future__ import annotations

import argparse
from pathlib import Path

from alibi.experiment import __doc__ as FORMAT
from alibi.experiment import load_experiment, run_experiment, stderr_progress
from alibi.report import summary_lines

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
                   help="continue an interrupted run in OUT from its last complete unit (a missing OUT starts afresh)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    exp = load_experiment(args.experiment)
    result = run_experiment(exp, args.out, resume=args.resume, progress=None if args.quiet else stderr_progress)
    print("\n".join(summary_lines(result.report)))
    print(f"  units: {result.computed_units} computed, {result.resumed_units} from the interrupted run")
    print(f"  artifacts: {result.out}/ (report/report.json, report/report.md, report/junit.xml, manifest.json)")
    return result.exit_code
