"""`alibi identify`: name the epilogue model a kernel implements, from its output bits alone."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from alibi.errors import InputError
from alibi.io.typed import to_plain
from alibi.kernels.catalog import check_kernel_name


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("identify", help="which known epilogue model a kernel's output bits match (exit 1 when its "
                                        "declared model is not among them)")
    p.add_argument("kernel", help="kernel name (see 'alibi kernels')")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--tiles", type=Path, help="folder of tiles (real, non-power-of-two scales)")
    src.add_argument("--synthetic", metavar="PRESET",
                     help="synthetic preset (default: epilogue-probe-bias, or the output-dtype bias probe for a "
                          "kernel that takes its bias only in the output dtype; an unknown name lists them all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the candidates as JSON")
    p.add_argument("--shape", action="append", metavar="MxNxK",
                   help="fp8 kernels: a shape at which to read the accumulation schedule (repeatable; default "
                        f"{', '.join(DEFAULT_FP8_SHAPES)}; block-scaled kernels: {', '.join(DEFAULT_BLOCK_SHAPES)})")
    p.set_defaults(func=run)


DEFAULT_FP8_SHAPES = ("1x576x1536", "64x256x1024", "256x1536x576", "16x128x4096")
# block-scaled kernels: SmolLM2 decode and prefill shapes (ragged K and N), and a DeepSeek-like K = 7168 with k > 3n
DEFAULT_BLOCK_SHAPES = ("1x576x1536", "16x192x576", "256x1536x576", "64x256x7168")


def parse_shape(text: str) -> tuple[int, int, int]:
    try:
        M, N, K = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise InputError(f"--shape {text!r}: expected MxNxK, e.g. 64x256x1024") from None
    if min(M, N, K) < 1 or K < 64:
        raise InputError(f"--shape {text!r}: M, N ≥ 1 and K ≥ 64 (the probe needs two steps of 32)")
    return M, N, K


def run_fp8(args: argparse.Namespace, kernel) -> int:
    """Read an fp8 kernel's accumulation schedule at each shape and check its declaration bit for bit."""
    # deferred: keeps torch out of start-up
    from alibi.controls.fp8_schedule import identify_schedule

    shapes = [parse_shape(s) for s in (args.shape or DEFAULT_FP8_SHAPES)]
    found = identify_schedule(kernel, shapes, seed=args.seed)
    if args.json:
        print(json.dumps([to_plain(r) for r in found], indent=2))
    else:
        for r in found:
            b = r.reading.boundaries
            seen = "none" if not b else f"{len(b)} at k = {', '.join(map(str, b[:8]))}{', ...' if len(b) > 8 else ''}"
            print(f"{kernel.name} at M={r.M} N={r.N} K={r.K}: chain boundaries {seen}"
                  + (f"; on some output tiles only: {list(r.reading.partial)[:8]}" if r.reading.partial else ""))
            print(f"  declares {r.declared or 'no schedule'}: "
                  f"{'MATCH (boundaries and every output bit of a random tile)' if r.declared_matches else 'NO MATCH'}")
            others = [c for c in r.matched if c != r.declared]
            if others:
                print(f"  also consistent here: {', '.join(others[:6])}{' ...' if len(others) > 6 else ''}")
    return 0 if found and all(r.declared_matches for r in found) else 1


def run_fp8_block(args: argparse.Namespace, kernel) -> int:
    """Read a block-scaled kernel's promotion from the association probe and each shape's random tile; exit 1 unless
    its declared block schedule matches every bit where it is checked (alibi.controls.fp8_block_schedule)."""
    # deferred: keeps torch out of start-up
    from alibi.controls.fp8_block_schedule import identify_block_schedule

    shapes = [parse_shape(s) for s in (args.shape or DEFAULT_BLOCK_SHAPES)]
    found = identify_block_schedule(kernel, shapes, seed=args.seed)
    if args.json:
        print(json.dumps(to_plain(found), indent=2))
    else:
        p = found.probe
        if p.applicable:
            verdict = "" if p.declared_matches is None else (" (declared MATCH)" if p.declared_matches else
                                                             " (declared NO MATCH)")
            print(f"{kernel.name} on the {p.reason}: matches {', '.join(p.matched) or 'no candidate'}{verdict}")
        else:
            print(f"{kernel.name}: association probe not applicable ({p.reason})")
        for r in found.shapes:
            if r.declared_matches is None:
                state = "declared nondeterministic: not checked bit for bit" if r.declared else "declares no schedule"
            else:
                state = "MATCH (every output bit of a random tile)" if r.declared_matches else "NO MATCH"
            print(f"{kernel.name} at M={r.M} N={r.N} K={r.K}: declares {r.declared or 'none'}: {state}; two runs "
                  f"{'identical' if r.run_to_run_identical else 'DIFFER (nondeterministic reduction)'}")
            others = [c for c in r.matched if c != r.declared]
            if others:
                print(f"  consistent here: {', '.join(others[:6])}{' ...' if len(others) > 6 else ''}")
            elif not r.matched:
                best = min(r.candidates, key=lambda c: c.n_differing)
                print(f"  no candidate matches; closest {best.schedule} ({best.n_differing} of {best.n_elements} differ)")
    return 0 if found.ok else 1


def run(args: argparse.Namespace) -> int:
    check_kernel_name(args.kernel, "kernel")  # a mistyped name is refused before torch loads
    # deferred: keeps torch out of start-up
    from alibi.controls.identify import declared_candidate, declared_matches, identify, probe_tiles
    from alibi.kernels.registry import get_kernel
    from alibi.tiles.synthetic import synthetic_tiles
    from alibi.tiles.tile import BLOCK_FORMAT, load_tile_dir

    kernel = get_kernel(args.kernel)
    kernel.require_available()
    if BLOCK_FORMAT in kernel.formats:
        return run_fp8_block(args, kernel)
    if "int8" not in kernel.formats and "fp8_e4m3" in kernel.formats:
        return run_fp8(args, kernel)
    if args.shape:
        raise InputError(f"--shape applies to fp8 kernels; {kernel.name} takes {', '.join(kernel.formats)}")
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
    if declared_matches(kernel, tiles, found) is False:  # it implements something, but not what it declares
        matching = [c.model for c in found if c.matches]
        print(f"alibi identify: {kernel.name} declares {declared_candidate(kernel, tiles)}, which does not match its "
              f"output bits ({'they match ' + ', '.join(matching) if matching else 'no known model matches them'}): "
              "its declaration is wrong", file=sys.stderr)
        return 1
    return 0 if found and found[0].matches else 1
