"""`alibi matrix`: certify every pair of a kernel set at once (each kernel run once per tile)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from alibi.conform.matrix import run_matrix, to_markdown
from alibi.errors import InputError, one_line
from alibi.governance import build_predicate, treatment_of, write_manifest
from alibi.io import atomic
from alibi.io.limits import check_seed
from alibi.io.typed import to_plain


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("matrix", help="certify every pair of a set of kernels (conformance matrix)",
                       description="Run every pair of the kernels through the conformance pipeline (each kernel's "
                                   "outputs computed once and reused for every pair) and write matrix.json, "
                                   "matrix.md and report.html with a heatmap. Exit 1 when a pair differs where the "
                                   "declared epilogue models do not predict it, or a kernel's own M-invariance or "
                                   "run-to-run check fires.")
    p.add_argument("--kernels", required=True, metavar="A,B,C,...", help="two or more kernels (see 'alibi kernels')")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--tiles", type=Path, help="folder of tile .safetensors files")
    src.add_argument("--synthetic", metavar="PRESET", help="synthetic preset (default: default)")
    p.add_argument("--rows", type=int, help="override the synthetic preset's M (tokens per tile)")
    p.add_argument("--seed", type=int, default=0, help="seed for synthetic tiles (default 0)")
    p.add_argument("--scales", default="real,pow2", help="scale regimes, comma-separated (default real,pow2)")
    p.add_argument("--ulp-threshold", type=int, default=1, help="tolerance of check 6 in ulps (default 1)")
    p.add_argument("--available-only", action="store_true",
                   help="leave out kernels that cannot run here, listing each with its reason (default: exit 3)")
    p.add_argument("--out", type=Path, required=True, help="output folder (matrix.json, matrix.md, report.html)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # deferred: keeps jinja2 and torch out of start-up
    from alibi.conform.pipeline import progress_printer, source_from_dir, source_from_preset, validate_regimes
    from alibi.html import write_report_html
    from alibi.kernels.registry import split_kernel_names
    from alibi.tiles.synthetic import DEFAULT_PRESET

    names = split_kernel_names(args.kernels)
    if len(names) < 2:
        raise InputError(f"--kernels {one_line(args.kernels)!r}: give at least two kernels, comma-separated")
    regimes = validate_regimes(r.strip() for r in args.scales.split(",") if r.strip())
    check_seed(args.seed, "--seed")
    if args.ulp_threshold < 0:
        raise InputError(f"--ulp-threshold must be ≥ 0, got {args.ulp_threshold}")
    atomic.refuse_overlap(args.out, {"--tiles": args.tiles}, what="the matrix folder")
    atomic.check_writable_dir(args.out)
    atomic.check_replaceable(args.out, kind="matrix")  # the matrix replaces the whole folder
    if args.tiles is not None:
        if args.rows is not None:
            raise InputError("--rows applies to --synthetic presets, not to --tiles")
        source = source_from_dir(args.tiles)
    else:
        source = source_from_preset(args.synthetic or DEFAULT_PRESET, seed=args.seed, rows=args.rows)
    if not args.quiet:
        print(f"alibi matrix: {len(names)} kernels on {source.record['label']}, {len(source.tiles)} tiles × "
              f"{len(regimes)} regimes", file=sys.stderr)
    matrix = run_matrix(names, source, regimes, available_only=args.available_only, ulp_threshold=args.ulp_threshold,
                        progress=None if args.quiet else progress_printer())
    # deferred: keeps torch out of start-up
    from alibi.conform.exercised import within_declarations
    from alibi.kernels.registry import get_kernel

    built = {k.name: get_kernel(k.name) for k in matrix.kernels}
    arms = {name: treatment_of(kernel, name) for name, kernel in built.items()}
    with atomic.staged_dir(args.out) as stage:
        (stage / "matrix.json").write_text(matrix.to_json(), encoding="utf-8")
        (stage / "matrix.md").write_text(to_markdown(matrix), encoding="utf-8")
        write_report_html(stage)
        predicate = build_predicate(inputs={"tiles": {**source.resource, "name": "tiles"}},
                                    seed=args.seed if args.tiles is None else None, arms=arms,
                                    parameters={"source": source.record, "kernels": names, "regimes": regimes,
                                                "ulp_threshold": args.ulp_threshold,
                                                "available_only": args.available_only,
                                                "unavailable": to_plain(matrix.unavailable)},
                                    created_at=matrix.created_at)
        write_manifest(stage, "matrix", predicate, files=["matrix.json", "matrix.md", "report.html"])
    counts = {s: sum(1 for c in matrix.cells if c.status == s) for s in ("bitwise", "explained", "unexplained",
                                                                          "not-judged")}
    print(f"alibi matrix: {len(matrix.kernels)} kernels, {len(matrix.cells)} pairs: {counts['bitwise']} bitwise, "
          f"{counts['explained']} explained, {counts['unexplained']} unexplained, {counts['not-judged']} not judged")
    for c in matrix.cells:
        if c.status != "bitwise":
            print(f"  {c.kernel_a} vs {c.kernel_b}: {c.status}" + (f" ({', '.join(c.causes)})" if c.causes else "")
                  + f", {c.n_differing} of {c.n_elements} elements differ"
                  + (f"; not judged: {c.not_judged_because}" if c.not_judged_because else ""))
    for k in matrix.kernels:
        if k.fired:
            print(f"  {k.name}: its own check fired: {', '.join(k.fired)}")
        if (left_out := within_declarations(source, [built[k.name]]).record.get("left_out")) is not None:
            print(f"  pairs with {k.name}: {len(left_out['tiles'])} tiles left out: {left_out['because']}")
    for u in matrix.unavailable:
        print(f"  left out (not available here): {u.name}: {u.reason}")
    print(f"  matrix: {args.out}/matrix.json, matrix.md, report.html, manifest.json")
    return matrix.exit_code
