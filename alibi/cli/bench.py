"""`alibi bench`: throughput of the GPU kernels side by side (TOPS and ratios), of the conformance pipeline
(`bench conform`) and of the model runner (`bench runner`), written to JSON."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from alibi.conform.bench import bench_conform, format_table
from alibi.errors import InputError, KernelUnavailable
from alibi.io import atomic


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure kernel throughput (TOPS) side by side",
                       description="Time the int8 and fp8 kernels on the same operands in one process "
                                   "(triton.testing.do_bench) and report TOPS and ratios to the vendor GEMMs.")
    p.add_argument("--int8", default=None,
                   help="int8 kernels, comma-separated (default: every int8 GPU kernel; empty: none)")
    p.add_argument("--fp8", default=None,
                   help="fp8 kernels, comma-separated (default: every fp8 GPU kernel; empty: none)")
    p.add_argument("--shape", action="append", metavar="M,N,K",
                   help="a shape to measure (repeatable); default M in 1,16,128,512,4096 at N=K=4096 "
                        "and M=4096 at N=K=8192")
    p.add_argument("--rep-ms", type=int, default=100, help="timing budget per measurement in ms (default 100)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds per measurement (default 3; the "
                   "report gives the median and the min-max spread)")
    p.add_argument("--l2", default="warm,cold", help="L2 modes, comma-separated: warm (one operand set), cold "
                   "(operand copies rotated through more than twice the L2); default both")
    p.add_argument("--out", type=Path, default=Path("alibi-bench.json"), help="JSON report (default ./alibi-bench.json)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=run)
    what = p.add_subparsers(dest="bench_what", metavar="conform|runner", required=False)
    c = what.add_parser("conform", help="time the conformance pipeline itself, split by stage",
                        description="Run `alibi conform`'s pipeline in one process: once to warm up, then REPEATS "
                                    "plain runs (the wall time and throughput reported) and REPEATS staged runs "
                                    "(wall time split into kernels, exact reference, checks and I/O), per check "
                                    "device. Default: the Qwen3-1.7B preset at M = 512.")
    c.add_argument("--kernel-a", help="first kernel (default: the default conform pair)")
    c.add_argument("--kernel-b", help="second kernel")
    src = c.add_mutually_exclusive_group()
    src.add_argument("--tiles", type=Path, help="folder of tile .safetensors files")
    src.add_argument("--synthetic", metavar="PRESET", default=None, help="synthetic preset (default qwen3-1.7b)")
    c.add_argument("--rows", type=int, help="M of the synthetic preset (default 512)")
    c.add_argument("--repeats", type=int, default=3, help="plain and staged runs per check device (default 3 of each; medians are reported)")
    c.add_argument("--check-devices", default=None,
                   help="where the reference and checks run, comma-separated: cuda, cpu (default: cuda,cpu with a "
                        "GPU, else cpu)")
    c.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="replay each GPU arm's launches from CUDA graphs, as `alibi conform` does (default on; "
                        "--no-cuda-graphs: every launch eager)")
    c.add_argument("--out", type=Path, default=Path("alibi-bench-conform.json"), help="JSON result")
    c.add_argument("--quiet", action="store_true", help="no progress lines")
    c.set_defaults(func=run_conform)
    r = what.add_parser("runner", help="time the model runner: prefill and decode steps, eager and CUDA graphs",
                        description="Load the model once per execution mode and time greedy decoding on the same token "
                                    "ids: the prefill, and a decode step eagerly and (on CUDA) replaying CUDA graphs, "
                                    "whose tokens and logit bits are checked against eager's first. What a greedy "
                                    "study or `alibi variations` will cost, before running it.")
    r.add_argument("--model", type=Path, required=True, help="checkpoint folder")
    r.add_argument("--kernel", help="the kernel of the quantized Linears (none for a dense checkpoint)")
    r.add_argument("--device", help="device for the model (default: the kernel's)")
    r.add_argument("--prompts", type=Path, help="prompt set whose windows fill the batch, repeated in order (default: "
                   "token ids drawn from the vocabulary with a fixed seed)")
    r.add_argument("--batch", type=int, default=64, help="prompts per batch (default 64)")
    r.add_argument("--prompt-tokens", type=int, default=64, help="tokens per prompt (default 64)")
    r.add_argument("--new-tokens", type=int, default=32, help="decode steps timed per call (default 32, at least 2)")
    r.add_argument("--repeats", type=int, default=3, help="timed calls per measurement (default 3; medians reported)")
    r.add_argument("--modes", default="deterministic,native",
                   help="execution modes, comma-separated: deterministic, native (default both)")
    r.add_argument("--out", type=Path, default=Path("alibi-bench-runner.json"), help="JSON result")
    r.add_argument("--quiet", action="store_true", help="no progress lines")
    r.set_defaults(func=run_runner)


def _check_result_file(out: Path, inputs: dict[str, Path | None]) -> None:
    """Refuse, before any work, an --out that would overwrite an input, sits in an unwritable folder or is a folder."""
    atomic.refuse_overlap(out, inputs, what="the bench result")
    atomic.check_writable_dir(out.parent)
    if out.is_dir():
        raise InputError(f"--out {out}: is a folder; name the JSON file to write")


def run_runner(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    from alibi.model.runner_bench import MODES, bench_runner, format_table

    for flag, value, least in (("--batch", args.batch, 1), ("--prompt-tokens", args.prompt_tokens, 1),
                               ("--new-tokens", args.new_tokens, 2), ("--repeats", args.repeats, 1)):
        if value < least:
            raise InputError(f"{flag} must be at least {least}, got {value}")
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    bad = sorted(set(modes) - set(MODES))
    if bad or not modes:
        raise InputError(f"--modes {args.modes!r}: expected deterministic, native or both, comma-separated")
    _check_result_file(args.out, {"--model": args.model, "--prompts": args.prompts})
    say = None if args.quiet else (lambda line: print(f"  {line}", file=sys.stderr))
    result = bench_runner(args.model, args.kernel, device=args.device, prompts=args.prompts, batch=args.batch,
                          prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens, repeats=args.repeats,
                          modes=modes, progress=say)
    atomic.write_text(args.out, result.to_json())
    print(format_table(result))
    print(f"  wrote {args.out}")
    return 1 if result.graphs_change_bits else 0


def run_conform(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    import torch

    # deferred: keeps torch out of start-up
    from alibi.conform.pipeline import choose_pair, source_from_dir, source_from_preset

    if args.repeats < 1:
        raise InputError(f"--repeats must be at least 1, got {args.repeats}")
    devices = [d.strip() for d in (args.check_devices or ("cuda,cpu" if torch.cuda.is_available() else "cpu")).split(",")
               if d.strip()]
    bad = sorted(set(devices) - {"cuda", "cpu"})
    if bad or not devices:
        raise InputError(f"--check-devices: {', '.join(bad) or 'empty'} not understood; use cuda and/or cpu")
    if "cuda" in devices and not torch.cuda.is_available():
        raise KernelUnavailable("--check-devices cuda: no CUDA GPU here (torch.cuda.is_available() is False)")
    _check_result_file(args.out, {"--tiles": args.tiles})
    if args.tiles is not None:
        if args.rows is not None:
            raise InputError("--rows applies to --synthetic presets, not to --tiles")
        source = source_from_dir(args.tiles)
    else:
        source = source_from_preset(args.synthetic or "qwen3-1.7b", seed=0, rows=512 if args.rows is None else args.rows)
    pair = choose_pair(args.kernel_a, args.kernel_b)
    say = None if args.quiet else (lambda line: print(f"  {line}", file=sys.stderr))
    result = bench_conform(pair, source, devices=devices, repeats=args.repeats, progress=say, graphs=args.cuda_graphs)
    atomic.write_text(args.out, result.to_json())
    print(format_table(result))
    print(f"  wrote {args.out}")
    return 0 if result.identical_results else 1


def _shapes(specs: list[str] | None) -> list[tuple[int, int, int]] | None:
    if not specs:
        return None
    shapes = []
    for spec in specs:
        try:
            m, n, k = (int(x) for x in spec.split(","))
        except ValueError:
            raise InputError(f"--shape {spec!r}: expected three integers M,N,K, e.g. 512,4096,4096") from None
        if min(m, n, k) < 1:
            raise InputError(f"--shape {spec!r}: M, N and K must be positive")
        shapes.append((m, n, k))
    return shapes


def run(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    import torch

    # deferred: keeps torch out of start-up
    from alibi.kernels.bench import FP8_KERNELS, INT8_KERNELS, Case, default_cases, format_table, run_bench, write_report
    from alibi.kernels.registry import get_kernel

    if args.rep_ms < 1:
        raise InputError(f"--rep-ms must be positive, got {args.rep_ms}")
    if args.repeats < 1:
        raise InputError(f"--repeats must be at least 1, got {args.repeats}")
    l2_modes = [m for m in args.l2.split(",") if m]
    bad = sorted(set(l2_modes) - {"warm", "cold"})
    if bad or not l2_modes:
        raise InputError(f"--l2 {args.l2!r}: expected warm, cold or warm,cold")
    atomic.check_writable_dir(args.out.parent if str(args.out.parent) else Path("."))
    int8 = [k for k in (",".join(INT8_KERNELS) if args.int8 is None else args.int8).split(",") if k]
    fp8 = [k for k in (",".join(FP8_KERNELS) if args.fp8 is None else args.fp8).split(",") if k]
    for name in int8 + fp8:
        get_kernel(name)  # an unknown name is bad input (exit 2) before anything is timed
    shapes = _shapes(args.shape)
    if not torch.cuda.is_available():
        # Every row would read "unavailable": say so once and write no report of nothing.
        raise KernelUnavailable(f"bench: timing kernels needs a CUDA GPU, and torch {torch.__version__} sees none "
                                f"here; nothing was measured or written (run it on a machine with an NVIDIA GPU)")
    cases: list[Case] = []
    if int8:
        cases += default_cases("int8") if shapes is None else [Case("int8", *s) for s in shapes]
    if fp8:
        cases += default_cases("fp8_e4m3") if shapes is None else [Case("fp8_e4m3", *s) for s in shapes]
    report = run_bench(int8, fp8, cases, rep_ms=args.rep_ms, repeats=args.repeats, l2_modes=l2_modes,
                       progress=None if args.quiet else (lambda line: print(line, file=sys.stderr)))
    if not any(r["status"] == "ok" for r in report["results"]):
        reasons = sorted({f"{r['kernel']}: {r['reason']}" for r in report["results"]})
        raise KernelUnavailable(f"none of the requested kernels ran here ({reasons[0]}"
                                + (f"; and {len(reasons) - 1} more" if len(reasons) > 1 else "") + "); nothing written")
    write_report(report, args.out)
    print(format_table(report))
    env = report["environment"]
    print(f"\n{env.get('gpu', 'no GPU')} · driver {env.get('driver')} · torch {env['torch']} · "
          f"triton {env.get('triton')} · CUDA {env.get('cuda_runtime_torch')} · CUTLASS {env.get('cutlass')}")
    print(f"wrote {args.out}")
    return 0
