"""`alibi identify`: name the epilogue model a kernel implements, from its output bits alone."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from alibi.kernels.catalog import check_kernel_name


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("identify", help="which known epilogue model a kernel's output bits match")
    p.add_argument("kernel", help="kernel name (see 'alibi kernels')")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--tiles", type=Path, help="folder of tiles (real, non-power-of-two scales)")
    src.add_argument("--synthetic", metavar="PRESET",
                     help="synthetic preset (default: epilogue-probe-bias, or the output-dtype bias probe for a "
                          "kernel that takes its bias only in the output dtype; an unknown name lists them all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the candidates as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_kernel_name(args.kernel, "kernel")  # a mistyped name is refused before torch loads
    # deferred: keeps torch out of start-up
    from alibi.controls.identify import identify, probe_tiles
    from alibi.kernels.registry import get_kernel
    from alibi.tiles.synthetic import synthetic_tiles
    from alibi.tiles.tile import load_tile_dir

    kernel = get_kernel(args.kernel)
    kernel.require_available()
    if args.tiles:
        tiles = load_tile_dir(args.tiles)
    elif args.synthetic:
        tiles = synthetic_tiles(args.synthetic, seed=args.seed)
    else:
        tiles, which = probe_tiles(kernel, seed=args.seed)
        print(which, file=sys.stderr)
    found = identify(kernel, tiles)
    if args.json:
        print(json.dumps([c.__dict__ for c in found], indent=2))
    else:
        declared = kernel.epilogue.name if kernel.epilogue else "none"
        print(f"{kernel.name} (declares {declared}) on {len(tiles)} tiles:")
        for c in found:
            mark = "MATCH" if c.matches else f"{c.n_differing} differing, max ulp {c.max_ulp}"
            print(f"  {c.model:<28} {mark}")
    return 0 if found and found[0].matches else 1
