"""`alibi conform`: certify a kernel pair on tiles (captured, or a synthetic preset)."""

from __future__ import annotations

import argparse
import shutil
import sys
from contextlib import contextmanager, suppress
from pathlib import Path

from alibi.conform.report import summary_lines, write_reports
from alibi.conform.shard import SourceSpec, parse_devices, require_ray, run_sharded
from alibi.conform.unit_store import discard, unit_files
from alibi.errors import DiskFull, InputError, KernelRaised, one_line
from alibi.governance import build_predicate, treatment_of, write_manifest
from alibi.io import atomic
from alibi.io.limits import check_seed
from alibi.kernels.catalog import check_kernel_name


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("conform", help="certify whether two kernels are interchangeable",
                       description="Run the conformance checks on two kernels. Without kernel flags: cutlass vs "
                                   "triton with CUDA, else the best CPU pair. Without a source: the built-in "
                                   "synthetic preset 'default'.")
    p.add_argument("--kernel-a", help="first kernel (see 'alibi kernels')")
    p.add_argument("--kernel-b", help="second kernel")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--tiles", type=Path, help="folder of tile .safetensors files")
    src.add_argument("--synthetic", metavar="PRESET",
                     help="synthetic preset, e.g. default, smollm2-135m, qwen3-1.7b (an unknown name lists all)")
    p.add_argument("--rows", type=int, help="override the synthetic preset's M (tokens per tile)")
    p.add_argument("--scales", default="real,pow2", help="scale regimes, comma-separated (default real,pow2)")
    p.add_argument("--seed", type=int, default=0, help="seed for synthetic tiles (default 0)")
    p.add_argument("--ulp-threshold", type=int, default=1, help="tolerance of check 6 in ulps (default 1)")
    p.add_argument("--no-invariance", action="store_true", help="skip the M-invariance and run-to-run checks")
    p.add_argument("--strict", action="store_true", help="exit 1 on an inconclusive verdict too")
    p.add_argument("--replay", type=Path, metavar="FLIPS.json",
                   help="a flip analysis of this pair (`alibi analyze flips`): makes check 7 token-level-risk applicable")
    p.add_argument("--flip-threshold", type=float, default=None, metavar="RATE",
                   help="check 7's bound on the teacher-forced flip rate (default 0.05; needs --replay)")
    p.add_argument("--out", type=Path, default=Path("alibi-report"), help="report folder (default ./alibi-report)")
    p.add_argument("--resume", action="store_true",
                   help="continue a killed run into the same --out from the units it finished (same kernels, "
                        "tiles and flags; each stored unit is checked before use; where no plan was kept, the run "
                        "starts afresh and says so)")
    p.add_argument("--verify-units", action="store_true",
                   help="with --resume: recompute every stored unit and refuse one that is not bit-identical")
    shard = p.add_mutually_exclusive_group()
    shard.add_argument("--devices", metavar="LIST",
                       help="shard the units over worker processes, one per device: cuda:0,cuda:1,... or all (every "
                            "visible GPU) or cpu:0,cpu:1,... (that many CPU workers); same report (docs/sharding.md)")
    shard.add_argument("--ray", metavar="ADDRESS",
                       help="shard the units as Ray tasks on the cluster at ADDRESS (local: a Ray started here); "
                            "needs the ray extra and --out on a file system every node shares")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="on a GPU, record each arm's launches once per tile layout in a CUDA graph and replay them "
                        "(kernels that declare their launches replayable; the bits are the same, the report says how "
                        "each arm launched; default on; --no-cuda-graphs launches every unit eagerly)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=run, interrupted=_interrupted)


def _interrupted(args: argparse.Namespace) -> str:
    """What Ctrl-C leaves: no report, and the finished units (each written atomically) for --resume."""
    units = units_dir(args.out)
    done = len(unit_files(units))
    if not (units / "plan.json").is_file():
        return f"no report was written to {args.out}; run the command again"
    return (f"no report was written to {args.out}; {done} finished unit(s) kept in {units}; continue with the same "
            "command and --resume (without it the run starts afresh)")


def units_dir(out: Path) -> Path:
    """Where a run keeps its finished units until the report is in place: a hidden folder beside --out."""
    return out.parent / f".{out.name}.units"


def run(args: argparse.Namespace) -> int:
    check_kernel_name(args.kernel_a, "--kernel-a")  # a mistyped name is refused before torch loads
    check_kernel_name(args.kernel_b, "--kernel-b")
    # Imported here, not at the top: `alibi --help` must not import torch.
    from alibi.conform.pipeline import check_formats, choose_pair, exit_code, source_from_dir, source_from_preset, validate_regimes
    from alibi.conform.exercised import within_declarations
    from alibi.conform.token_risk import DEFAULT_FLIP_THRESHOLD, load_replay
    from alibi.tiles.synthetic import DEFAULT_PRESET

    regimes = validate_regimes(r.strip() for r in args.scales.split(",") if r.strip())
    check_seed(args.seed, "--seed")  # the rule `alibi run` applies to its seed
    check_report_out(args.out, {"--tiles": args.tiles, "--replay": args.replay})
    if args.ulp_threshold < 0:
        raise InputError(f"--ulp-threshold must be ≥ 0, got {args.ulp_threshold}")
    if args.flip_threshold is not None and args.replay is None:
        raise InputError("--flip-threshold bounds the flip rate of a replay: give --replay FLIPS.json too")
    if args.verify_units and not args.resume:
        raise InputError("--verify-units recomputes the units a resumed run reads from disk: give --resume too")
    units = units_dir(args.out)
    # A kill before the plan was written (or after the report replaced the units) leaves nothing to continue:
    # --resume then starts afresh, and says so once every input is checked.
    resume = args.resume and (units / "plan.json").is_file()
    replay = None if args.replay is None else load_replay(
        args.replay, DEFAULT_FLIP_THRESHOLD if args.flip_threshold is None else args.flip_threshold)
    if args.tiles is not None:
        if args.rows is not None:
            raise InputError("--rows applies to --synthetic presets, not to --tiles")
        source = source_from_dir(args.tiles)
    else:
        source = source_from_preset(args.synthetic or DEFAULT_PRESET, seed=args.seed, rows=args.rows)
    pair = choose_pair(args.kernel_a, args.kernel_b)
    source = within_declarations(source, (pair.a, pair.b))  # no fp32-bias probe for a kernel that declares none
    check_formats(pair, source.tiles)  # before any folder is created
    if args.ray is not None:
        require_ray()
    if args.resume and not resume:
        finished = (args.out / "report.json").is_file()
        print(f"alibi conform: --resume fallback: no unfinished run beside {one_line(str(args.out))} (no "
              f"{units.name}/plan.json"
              + ("; it holds a finished report, which the new one replaces" if finished else "")
              + "): starting afresh", file=sys.stderr)
    if not args.quiet:
        print(f"alibi conform: {pair.a.name} vs {pair.b.name} on {source.record['label']}, {len(source.tiles)} "
              f"tiles × {len(regimes)} regimes" + (" (resuming)" if resume else ""), file=sys.stderr)
    parameters = {"regimes": regimes, "ulp_threshold": args.ulp_threshold, "invariance": not args.no_invariance,
                  **({"flip_threshold": replay.bound} if replay is not None else {})}
    plan_parameters = {"replay": None if replay is None else replay.resource()}
    made = [p for p in [args.out.parent, *args.out.parent.parents] if not p.exists()]
    try:
        with _no_debris(units, args.out, fresh=not resume):
            report, parameters = _units_and_report(args, pair, source, regimes, units, resume, replay, parameters,
                                                   plan_parameters)
        # The whole folder is staged and renamed into place once: a kill or a failure leaves the old
        # report (or none), never some of the new files; the finished units go only after that, in one rename
        # (alibi.io.atomic.discard_dir): a kill leaves them whole (resumable) or under a stage name the next run
        # removes.
        written, predicate = _write_report(args, report, source, replay, parameters, pair)
    except KernelRaised as exc:  # exit 4, one line: what raised, and what was kept for --resume
        raise KernelRaised(f"{exc}; {_interrupted(args)}") from None
    except DiskFull:  # exit 2, one line naming --out; a fresh run leaves nothing, a resumed one its units
        raise DiskFull(_out_of_space(args.out, units, made, fresh=not resume)) from None
    discard(units, args.out)
    print("\n".join(summary_lines(report)))
    if replay is not None:
        print(f"  check 7 judged on {replay.path} (sha256 {replay.sha256}), bound {replay.bound:g}")
    print(f"  report: {args.out}/report.json, report.md, junit.xml, report.html, manifest.json")
    return exit_code(report, strict=args.strict)


def _out_of_space(out: Path, units: Path, made: list[Path], fresh: bool) -> str:
    """The line for a run whose file system filled up: a fresh run's units are removed (with the folders it
    created on the way to --out), a resumed run's kept for another --resume."""
    if not fresh:
        return (f"{out}: the file system ran out of space while alibi wrote this run; no report was written and the "
                f"finished units are kept in {units}: free space on that file system, then run the command again "
                "with --resume")
    if units.exists():
        try:
            atomic.discard_dir(units, out)
        except OSError:  # the rename's stage folder may not fit either: remove in place
            shutil.rmtree(units, ignore_errors=True)
    for folder in made:  # innermost first; rmdir refuses a folder something else was put in
        with suppress(OSError):
            folder.rmdir()
    return (f"{out}: the file system ran out of space while alibi wrote this run; nothing was written (the units "
            "computed so far were removed) and no input was changed: free space on that file system, or choose "
            "another --out")


def _write_report(args, report, source, replay, parameters, pair):
    """The report folder at --out, staged and renamed into place once."""
    # deferred: keeps jinja2 out of start-up
    from alibi.html import write_conform_html

    with atomic.staged_dir(args.out) as stage:
        written = [write_conform_html(report, stage), *write_reports(report, stage)]  # report.json stays last
        inputs = {"tiles": {**source.resource, "name": "tiles"}}
        if replay is not None:
            inputs["replay"] = replay.resource()
        predicate = build_predicate(inputs=inputs, seed=report.seed,
                                    arms={"a": treatment_of(pair.a, "a"), "b": treatment_of(pair.b, "b")},
                                    parameters={"source": report.source, **parameters},
                                    created_at=report.created_at)
        write_manifest(stage, "report", predicate, files=[p.name for p in written])
    return written, predicate


@contextmanager
def _no_debris(units: Path, out: Path, fresh: bool):
    """A fresh run that fails before it kept any unit leaves nothing: not the units folder with its plan,
    nor the folders created on the way to --out."""
    made = [p for p in [out.parent, *out.parent.parents] if not p.exists()]
    try:
        yield
    except BaseException:
        if fresh and units.is_dir() and not unit_files(units):
            shutil.rmtree(units, ignore_errors=True)
            for folder in made:  # innermost first; rmdir refuses a folder something else was put in
                with suppress(OSError):
                    folder.rmdir()
        raise


def _units_and_report(args, pair, source, regimes, units, resume, replay, parameters, plan_parameters):
    """Every unit (sharded first when asked, then read back) and the report folded from them."""
    # deferred: keeps torch out of start-up
    from alibi.conform.pipeline import progress_printer, run_conformance

    computed_elsewhere = 0
    if args.devices is not None or args.ray is not None:
        # The shards compute every unit into the units folder; run_conformance below then only reads them
        # (resume=True), so the report is the one this command writes without sharding. The devices go into
        # the manifest's parameters only: report.json and the plan do not depend on them.
        # deferred: keeps torch out of start-up
        from alibi.tiles.synthetic import DEFAULT_PRESET

        if replay is not None:
            replay.require_pair(pair.a.name, pair.b.name)  # refused before the shards work, not after
        spec = (SourceSpec(folder=str(args.tiles)) if args.tiles is not None else
                SourceSpec(preset=args.synthetic or DEFAULT_PRESET, seed=args.seed, rows=args.rows))
        sharded = run_sharded(args.kernel_a, args.kernel_b, spec, regimes, units,
                              None if args.devices is None else parse_devices(args.devices), ray_address=args.ray,
                              ulp_threshold=args.ulp_threshold, invariance=not args.no_invariance,
                              resume=resume, seed=args.seed if args.tiles is None else None,
                              plan_parameters=plan_parameters, source=source, quiet=args.quiet,
                              graphs=args.cuda_graphs)
        parameters["sharding"] = sharded.manifest_record()
        computed_elsewhere = sum(sharded.computed)
        resume = True
        if not args.quiet:
            print(f"alibi conform: {sum(sharded.computed)} units computed by {len(sharded.devices)} shard(s) "
                  f"({sharded.engine}) in {sharded.wall_s:.1f} s; assembling the report", file=sys.stderr)
    report = run_conformance(pair, source, regimes, units_dir=units, resume=resume,
                             seed=args.seed if args.tiles is None else None, ulp_threshold=args.ulp_threshold,
                             invariance=not args.no_invariance, replay=replay,
                             progress=None if args.quiet else progress_printer(),
                             plan_parameters=plan_parameters, verify_units=args.verify_units,
                             computed_elsewhere=computed_elsewhere, graphs=args.cuda_graphs)
    return report, parameters


def check_report_out(out: Path, inputs: dict[str, Path | None]) -> None:
    """Refuse an --out that overlaps an input, cannot be written, or is a folder other than an earlier
    conform report holding only what alibi wrote (the staged report replaces the whole folder)."""
    atomic.refuse_overlap(out, inputs, what="the report folder")
    atomic.check_writable_dir(out)
    atomic.check_replaceable(out, kind="report")
