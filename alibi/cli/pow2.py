"""`alibi pow2-rewrite IN OUT --mode M (--keep-weights | --requantize-from DENSE)`: power-of-two weight scales.

A thin shell over `alibi.model.pow2_rewrite` (see it for what the rewrite does and why).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pow2-rewrite", help="rewrite a W8A8 checkpoint's weight scales to powers of two",
        description="Rewrite a compressed-tensors W8A8 checkpoint so that every weight scale is a power of two "
                    "(then the CUTLASS and Triton epilogue orders give the same bits). Everything else is copied "
                    "unchanged; the output appears only when complete, with a manifest.json.")
    p.add_argument("input", type=Path, metavar="IN", help="the W8A8 checkpoint folder (e.g. OUT/w8a8 of `alibi model prepare`)")
    p.add_argument("output", type=Path, metavar="OUT", help="folder for the rewritten checkpoint (must not exist)")
    p.add_argument("--mode", required=True, choices=("nearest", "ceil", "floor"),
                   help="round log2 of each scale to nearest, up (ceil) or down (floor)")
    policy = p.add_mutually_exclusive_group(required=True)
    policy.add_argument("--keep-weights", action="store_true",
                        help="change only the scales (each channel's effective weights move by new/old: "
                             "a different, usually much worse model)")
    policy.add_argument("--requantize-from", type=Path, metavar="DENSE_DIR",
                        help="re-derive the int8 weights under the new scales from this dense (bf16) checkpoint, "
                             "e.g. OUT/bf16 of `alibi model prepare` (recommended, with --mode ceil)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it is an existing checkpoint folder")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    from alibi.model.pow2_rewrite import pow2_rewrite, summary_lines

    result = pow2_rewrite(args.input, args.output, args.mode, requantize_from=args.requantize_from,
                          overwrite=args.overwrite)
    print("\n".join(summary_lines(result)))
    return 0
