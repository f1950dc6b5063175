"""`alibi analyze flips|depth`: statistics over replay arms and depth sweeps (thin over `alibi.tokens.flips` and `alibi.sweep.depth_fits`)."""

from __future__ import annotations

import argparse

from alibi.cli import analyze_depth, analyze_flips


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help="statistics over replay arms (flips) and depth sweeps (depth)")
    an = p.add_subparsers(dest="analyze_command", required=True, parser_class=type(p))

    analyze_flips.register(an)
    analyze_depth.register(an)
