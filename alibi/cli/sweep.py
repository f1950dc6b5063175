"""`alibi sweep depth|rows`: divergence between two kernels against K, and the per-element rate against M."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from alibi.errors import InputError
from alibi.io import atomic
from alibi.io.progress import progress


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="sweep K (depth) or M (rows) and measure how two kernels' outputs differ")
    sw = p.add_subparsers(dest="sweep_command", required=True, parser_class=type(p))

    d = sw.add_parser("depth", help="fraction and size of differences between two kernels as K grows",
                      description="Per (seed, K): bitwise-differing elements, ulp and relative sizes of the "
                                  "differences, each arm's error against an exact fp64 reference. Writes "
                                  "depth.json, depth.csv and manifest.json to --out.")
    _kernels(d)
    d.add_argument("--format", required=True, choices=("int8", "fp8_e4m3"), help="operand format")
    d.add_argument("--K", default="512,1024,2048,4096,8192,16384,32768", help="reduction depths, comma-separated")
    d.add_argument("--M", type=int, default=256, help="rows (tokens) per tile (default 256)")
    d.add_argument("--N", type=int, default=2048, help="output columns (default 2048)")
    d.add_argument("--seeds", type=int, default=20, help="number of seeds (default 20)")
    d.add_argument("--first-seed", type=int, default=0, help="index of the first seed (default 0)")
    d.add_argument("--nested-prefix", action="store_true",
                   help="draw each seed's operands once at the largest K; smaller K use the leading columns")
    d.add_argument("--fp8-scales", choices=("tensor", "row"),
                   help="fp8 scales: per-tensor 1 (default, the paper's design) or real per-row/per-column")
    d.add_argument("--near-zero", type=float, default=1e-3,
                   help="near-zero floor as a fraction of rms(reference) per tile (default 1e-3)")
    _common(d)
    d.set_defaults(func=run_depth)

    r = sw.add_parser("rows", help="per-element rate of differing outputs at each M (decode regime included)",
                      description="Per M: enough independent tiles to cover --elements output elements; the rate "
                                  "with an exact interval; tests of whether it depends on M. Writes rows.json, "
                                  "rows.csv and manifest.json to --out.")
    _kernels(r)
    r.add_argument("--format", default="int8", choices=("int8", "fp8_e4m3"), help="operand format (default int8)")
    r.add_argument("--M", default="1,4,16,64,256,512,4096", help="rows per kernel call, comma-separated")
    r.add_argument("--K", type=int, default=4096, help="reduction depth (default 4096)")
    r.add_argument("--N", type=int, default=4096, help="output columns (default 4096)")
    r.add_argument("--elements", default="1e8", help="output elements per M, at least (default 1e8)")
    r.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    r.add_argument("--rows-per-block", type=int, default=4096,
                   help="activation rows per operand block, which shares one weight matrix (default 4096)")
    r.add_argument("--confidence", type=float, default=0.95, help="level of the per-M intervals (default 0.95)")
    r.add_argument("--fp8-scales", choices=("tensor", "row"), help="fp8 scales (as for 'sweep depth')")
    _common(r)
    r.set_defaults(func=run_rows)


def _kernels(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kernel-a", required=True, help="first kernel (see 'alibi kernels'; also fp8-sequential:<order>)")
    p.add_argument("--kernel-b", required=True, help="second kernel")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where operands are drawn and the reference and comparisons run (default: the kernels')")
    p.add_argument("--out", type=Path, required=True, help="output folder (replaced only when the sweep completes)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def _int_list(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InputError(f"{option} {text!r}: expected comma-separated integers, e.g. 512,1024,2048") from None
    if not values:
        raise InputError(f"{option}: give at least one value")
    return values


def _count(text: str, option: str) -> int:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value != int(value):
        raise InputError(f"{option} {text!r}: expected a whole number such as 1e8 or 100000000")
    return int(value)


def _progress(args: argparse.Namespace, what: str, unit: str):
    """Per-unit progress on stderr (alibi.io.progress: a bar on a terminal, lines elsewhere, nothing under --quiet)."""
    return progress(f"sweep {what}", quiet=args.quiet, unit=unit)


def run_depth(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    from alibi.sweep.arms import home_device, resolve_pair
    from alibi.sweep.depth import DepthPlan, run_depth_sweep
    from alibi.sweep.output import write_depth_folder

    plan = DepthPlan(args.kernel_a, args.kernel_b, args.format, _int_list(args.K, "--K"), args.M, args.N,
                     args.seeds, args.first_seed, args.nested_prefix, args.fp8_scales, args.near_zero).validate()
    atomic.check_writable_dir(args.out)
    arms = resolve_pair(plan.kernel_a, plan.kernel_b, plan.format,
                        tensorwise_ok=(plan.fp8_scales or "tensor") == "tensor")
    device = home_device(arms, args.device)
    say = _progress(args, "depth", "seed")
    say.note(f"alibi sweep depth: {arms[0].kernel.name} vs {arms[1].kernel.name}, {plan.format}, "
             f"M={plan.M} N={plan.N}, K {','.join(map(str, plan.Ks))}, {plan.seeds} seeds"
             f"{', nested prefixes' if plan.nested_prefix else ''}, operands and reference on {device}")
    sweep = run_depth_sweep(plan, arms, device, say)
    write_depth_folder(sweep, arms, args.out)
    tm = sweep.timing
    print(f"alibi sweep depth: {len(sweep.records)} records in {tm.total:.2f} s "
          f"(kernels {tm.kernel_a + tm.kernel_b:.2f} s, reference {tm.reference:.2f} s, "
          f"{tm.share_outside_kernels:.1%} outside the kernels, {tm.share_outside_kernels_and_reference:.1%} "
          f"outside kernels and reference)")
    for K in sweep.Ks:
        recs = [r for r in sweep.records if r.K == K]
        diff = sum(r.n_differing for r in recs)
        n = sum(r.n for r in recs)
        print(f"  K={K:>6}: {diff} of {n} elements differ ({diff / n:.4g}), max ulp "
              f"{max((r.max_ulp or 0) for r in recs)}")
    print(f"  wrote {args.out}/depth.json, depth.csv, manifest.json")
    return 0


def run_rows(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    from alibi.sweep.arms import home_device, resolve_pair
    from alibi.sweep.output import write_rows_folder
    from alibi.sweep.rows import RowsPlan, run_rows_sweep

    plan = RowsPlan(args.kernel_a, args.kernel_b, args.format, _int_list(args.M, "--M"), args.K, args.N,
                    _count(args.elements, "--elements"), args.seed, args.rows_per_block, args.confidence,
                    args.fp8_scales).validate()
    atomic.check_writable_dir(args.out)
    arms = resolve_pair(plan.kernel_a, plan.kernel_b, plan.format,
                        tensorwise_ok=(plan.fp8_scales or "tensor") == "tensor")
    device = home_device(arms, args.device)
    say = _progress(args, "rows", "M")
    say.note(f"alibi sweep rows: {arms[0].kernel.name} vs {arms[1].kernel.name}, {plan.format}, "
             f"K={plan.K} N={plan.N}, M {','.join(map(str, plan.Ms))}, ≥ {plan.elements} elements per M, on {device}")
    sweep = run_rows_sweep(plan, arms, device, say)
    write_rows_folder(sweep, arms, args.out)
    for p in sweep.points:
        print(f"  M={p.M:>5}: {p.rate.events} of {p.elements} differ ({p.rate.rate * 1e6:.3g} ppm, "
              f"{sweep.confidence:.0%} CI {p.rate.low * 1e6:.3g}–{p.rate.high * 1e6:.3g}), max ulp {p.max_ulp}")
    # deferred: keeps numpy out of start-up
    from alibi.sweep.depth_fits import format_p

    h, tr, ratio = sweep.homogeneity, sweep.trend, sweep.ratio
    g = lambda x: "unbounded" if x is None else f"{x:.3g}"
    print(f"  one rate for all M ({h.status}): χ² {format_p(h.p_chi2)}, exact {format_p(h.p_exact)}; "
          f"rate ∝ M^b ({tr.status}): rate change from M={tr.x_min:g} to {tr.x_max:g} compatible at 90%: "
          f"×{g(tr.factor_low)} … ×{g(tr.factor_high)}; largest ratio between two M compatible at 90%: "
          f"{'×' + g(ratio.max_ratio) if ratio.max_ratio is not None else ratio.status}")
    tm = sweep.timing
    print(f"  {tm.total:.1f} s, {tm.share_outside_kernels:.1%} outside the kernels; wrote {args.out}/rows.json, "
          "rows.csv, manifest.json")
    return 0
