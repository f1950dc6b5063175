"""`alibi analyze flips ARM_A ARM_B --out DIR`: join two replay arms and the margin-to-flip statistics."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from alibi.cli.replay import require_scikit_learn


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the `flips` subcommand."""
    p = sub.add_parser(
        "flips", help="flip rate of two replay arms and how well arm A's margin predicts the flips",
        description="Join two teacher-forced arms on (window, position) and write flips.json, flips.md and a "
                    "manifest to --out. An arm is a folder written by `alibi replay teacher-forced`, or a .json "
                    "file in the per-prompt list or manifest-envelope shape other tools publish (docs/flips.md). "
                    "Exit 0 written, 1 the identity contract fails (the field is named), 2 bad input.")
    p.add_argument("arm_a", type=Path, help="arm A (its margin is the predictor)")
    p.add_argument("arm_b", type=Path, help="arm B")
    p.add_argument("--out", type=Path, required=True, help="output folder (replaced as a whole, once complete)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0; recorded)")
    p.add_argument("--bootstrap", type=int, default=None, metavar="B",
                   help="bootstrap replicates for each CI90 (default 5000)")
    p.add_argument("--allow-unverified", action="store_true",
                   help="proceed when the identity contract fails or cannot be checked (recorded in the output)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    require_scikit_learn("analyze flips")
    # deferred: keeps torch out of start-up
    from alibi.tokens.flips import (
        DEFAULT_BOOTSTRAP,
        FLIPS_FILE,
        SUMMARY_FILE,
        analyze_flips,
        summary_lines,
    )

    def say(message: str) -> None:
        print(f"alibi analyze flips: {message}", file=sys.stderr, flush=True)

    fa = analyze_flips(args.arm_a, args.arm_b, args.out, seed=args.seed,
                       bootstrap=DEFAULT_BOOTSTRAP if args.bootstrap is None else args.bootstrap,
                       allow_unverified=args.allow_unverified, progress=None if args.quiet else say)
    print("\n".join(summary_lines(fa)))
    print(f"  written: {args.out}/{FLIPS_FILE}, {SUMMARY_FILE}, manifest.json")
    return 0
