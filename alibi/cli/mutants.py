"""`alibi mutants`: run the conformance procedure against every mutant of a base kernel (the detection matrix)."""

from __future__ import annotations

import argparse
from pathlib import Path

from alibi.errors import InputError
from alibi.governance import build_predicate, resource, treatment_of
from alibi.io import atomic
from alibi.io.progress import progress


FP8_DEFAULT = "smollm2-135m-fp8"  # an fp8 base's default tiles
FP8_BLOCK_DEFAULT = "smollm2-135m-fp8-block"  # a block-scaled fp8 base's default tiles


def _default_preset(base) -> str | None:
    """The synthetic preset an fp8 base runs on without a tile source; None for an int8 base (the exposing set)."""
    # deferred: keeps torch out of start-up
    from alibi.tiles.tile import BLOCK_FORMAT

    if BLOCK_FORMAT in base.formats:
        # a block-scaled base: one SmolLM2 block (K of 576 and 1536: several scale blocks, a ragged last group)
        return FP8_BLOCK_DEFAULT
    if "int8" not in base.formats and "fp8_e4m3" in base.formats:
        # an fp8 base: one SmolLM2 block in e4m3 (K of 576 and 1536: promotion and split-K faults are observable)
        return FP8_DEFAULT
    return None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mutants", help="which checks catch which deliberately faulty kernel (detection matrix)",
                       description="Run the conformance checks of a base kernel against each of its mutants "
                                   "(mutant:<fault>[@<severity>]:<base>) and write the detection matrix. Without a "
                                   "tile source: the exposing set (tiles on which every fault changes output bits); for an fp8 base, "
                                   f"the {FP8_DEFAULT} preset and the fp8 faults; for a block-scaled fp8 base, the "
                                   f"{FP8_BLOCK_DEFAULT} preset and the block faults.")
    p.add_argument("--base", required=True, help="the int8 kernel to wrap (see 'alibi kernels')")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--tiles", type=Path, help="folder of int8 tile .safetensors files")
    src.add_argument("--synthetic", metavar="PRESET", help="synthetic preset (see 'alibi conform --help')")
    p.add_argument("--rows", type=int, help="override the synthetic preset's M")
    p.add_argument("--seed", type=int, default=0, help="seed of synthetic and exposing tiles (default 0)")
    p.add_argument("--faults", help="comma-separated faults (default: every fault that exists for the base)")
    p.add_argument("--severity", default="one,pct,all",
                   help="comma-separated severities: one, pct (1%%), all, or percentages like 5%% (default one,pct,all)")
    p.add_argument("--scales", default="real,pow2", help="scale regimes, comma-separated (default real,pow2)")
    p.add_argument("--native", action="store_true",
                   help="also run the native fault variants inside the Triton kernel (base triton only)")
    p.add_argument("--out", type=Path, required=True, help="output folder (detection.json, .md, .png, .svg)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=run)


def _list(text: str | None) -> list[str] | None:
    return None if text is None else [x.strip() for x in text.split(",") if x.strip()]


def run(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    from alibi.conform.pipeline import validate_regimes
    from alibi.controls.mutant_matrix import (
        check_tiles,
        plan_rows,
        run_matrix,
        write_matrix,
    )
    from alibi.kernels.registry import get_kernel
    from alibi.tiles.exposing import EXPOSING_TILES, exposing_tiles
    from alibi.tiles.synthetic import synthetic_tiles
    from alibi.tiles.tile import load_tile_dir

    regimes = validate_regimes(_list(args.scales) or [])
    faults, severities = _list(args.faults), _list(args.severity) or []
    if faults is not None and not faults:
        raise InputError("--faults: empty list; name at least one fault (see docs/positive-controls.md)")
    if args.rows is not None and args.synthetic is None:
        raise InputError("--rows applies to --synthetic presets only")
    base = get_kernel(args.base)
    plan_rows(base, args.base, faults, severities, args.native)  # every name and severity checked up front
    base.require_available()
    atomic.check_writable_dir(args.out)
    atomic.refuse_overlap(args.out, {"--tiles": args.tiles}, what="the matrix folder")
    if args.tiles is not None:
        tiles = load_tile_dir(args.tiles)
        source = {"label": f"tiles in {args.tiles}", "kind": "tiles", "path": str(args.tiles), "n_tiles": len(tiles)}
    elif (preset := args.synthetic or _default_preset(base)) is not None:
        tiles = synthetic_tiles(preset, seed=args.seed, M=args.rows)
        source = {"label": f"synthetic preset {preset} (seed {args.seed})", "kind": "synthetic",
                  "preset": preset, "seed": args.seed, "rows": tiles[0].M, "n_tiles": len(tiles)}
    else:
        tiles = exposing_tiles(args.seed)
        source = {"label": f"exposing set ({', '.join(EXPOSING_TILES)}; seed {args.seed})", "kind": "exposing",
                  "tiles": list(EXPOSING_TILES), "seed": args.seed, "n_tiles": len(tiles)}
    check_tiles(base, args.base, tiles)
    say = progress("mutants", quiet=args.quiet, unit="row")
    say.note(f"alibi mutants: {args.base} on {source['label']}, regimes {', '.join(regimes)}")
    matrix = run_matrix(base, args.base, tiles, source=source, faults=faults, severities=severities,
                        regimes=regimes, native=args.native, progress=say)
    inputs = {"tiles": resource("tiles", args.tiles)} if args.tiles is not None else {}
    predicate = build_predicate(inputs=inputs, seed=None if args.tiles is not None else args.seed,
                                arms={"base": treatment_of(base, "base")},
                                parameters={"source": source, "faults": faults, "severities": severities,
                                            "regimes": regimes, "native": args.native},
                                created_at=matrix.created_at)
    write_matrix(matrix, args.out, predicate)
    width = max(len(c.check) for c in matrix.check_summary)
    print(f"alibi mutants: {len(matrix.faults)} rows against {args.base}; null mutant silent: "
          f"{'yes' if matrix.null_silent else 'NO'}; every observable row detected: "
          f"{'yes' if matrix.all_detected else 'NO (' + ', '.join(matrix.undetected_classes) + ')'}")
    print(f"  {'check':<{width}}  hits  misses-on-observable  false-positives")
    for c in matrix.check_summary:
        print(f"  {c.check:<{width}}  {c.hits:>4}  {c.misses_observable:>20}  {c.false_positives:>15}")
    print(f"  matrix: {args.out}/detection.json, detection.md, detection.png, detection.svg, manifest.json")
    return matrix.exit_code
