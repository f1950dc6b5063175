"""`alibi variations` and `alibi locate`: is the model run invariant to how it is scheduled, and where
do two runs part (thin over `alibi.tokens.variations` and `alibi.tokens.locate`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from alibi.errors import InputError
from alibi.io import atomic
from alibi.io.progress import progress
from alibi.tokens import locate as lib
from alibi.tokens.setup import check_output


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers, e.g. 2,4") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("variations", help="certify that a token's logits do not depend on batch size, batch "
                       "composition, chunking, prefill vs decode, KV cache, repetition or a restart")
    p.add_argument("--model", type=Path, required=True, help="checkpoint folder (W8A8, or dense without --kernel)")
    p.add_argument("--kernel", help="the kernel of the W8A8 checkpoint's Linears")
    p.add_argument("--prompts", type=Path, required=True, help="prompt set folder (`alibi prompts build`)")
    p.add_argument("--windows", type=int, help="use the first N windows of the set (default: all)")
    p.add_argument("--context", type=int, help="T: tokens before the first compared position (default: half a window)")
    p.add_argument("--positions", type=int, help="P: compared positions per prompt (default: the rest of the window)")
    p.add_argument("--batch-sizes", type=_sizes, help="batch sizes compared with batch 1 (default 2,4 and N+2, at "
                   "least 64 on CUDA: a batch of B ≥ N windows holds every prompt, the first again at the middle and "
                   "last rows, the rest filled by repeating the prompts)")
    p.add_argument("--repeats", type=int, default=3, help="R: runs of the largest batch in one process, compared "
                   "with the first (default 3; 1 leaves the repeat variation out)")
    p.add_argument("--chunk", type=int, default=16, help="C: tokens per chunk of the chunked prefill (default 16)")
    p.add_argument("--device", help="device for the model (default: the kernel's)")
    p.add_argument("--nondeterministic", action="store_true",
                   help="run the libraries' own attention, norms and dense Linears (to measure them)")
    p.add_argument("--no-restart", action="store_true", help="leave out the cold-restart variation (no second process)")
    p.add_argument("--out", type=Path, help="output folder: variations.json, report.md, report.html, manifest.json")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier output at --out")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    # the cold-restart side, started by the command itself in a fresh process
    p.add_argument("--execution", help=argparse.SUPPRESS)
    p.add_argument("--execution-out", type=Path, help=argparse.SUPPRESS)
    p.set_defaults(func=variations)

    loc = sub.add_parser("locate", help="compare two greedy runs bit for bit and name the first diverging module")
    loc.add_argument("run_a", type=Path, help="a run folder of `alibi replay greedy --kernel K` (with --trace to "
                     "name modules)")
    loc.add_argument("run_b", type=Path, help="another run folder over the same prompts")
    loc.add_argument("--out", type=Path, help="also write locate.json into this folder")
    loc.set_defaults(func=locate)


def variations(args: argparse.Namespace) -> int:
    # deferred: keeps jinja2 and torch out of start-up
    from alibi.html import write_report_html
    from alibi.tokens import variations as lib

    if args.execution is not None:
        if args.execution_out is None:
            raise InputError("--execution needs --execution-out FILE")
        lib.run_child_execution(args.model, args.prompts, args.execution_out, kernel=args.kernel,
                                execution=args.execution, windows=args.windows, context=args.context,
                                positions=args.positions, device=args.device,
                                deterministic=not args.nondeterministic)
        return 0
    if args.out is None:
        raise InputError("--out is required: the folder for variations.json, report.md and report.html")
    report = lib.run_variations(args.model, args.prompts, args.out, kernel=args.kernel, windows=args.windows,
                                context=args.context, positions=args.positions, batch_sizes=args.batch_sizes,
                                chunk=args.chunk, repeats=args.repeats, device=args.device, deterministic=not args.nondeterministic,
                                restart=not args.no_restart, overwrite=args.overwrite,
                                progress=progress("variations", quiet=args.quiet, unit="execution"),
                                pages=write_report_html)
    for line in lib.summary_lines(report):
        print(line)
    return 0 if report.holds else 1


def locate(args: argparse.Namespace) -> int:
    result = lib.locate(args.run_a, args.run_b)
    if args.out is not None:
        check_output(args.out, {"run_a": args.run_a, "run_b": args.run_b}, overwrite=False)
        with atomic.staged_dir(args.out) as stage:
            atomic.write_text(Path(stage) / lib.RESULT_FILE, result.to_json())
    for line in lib.summary_lines(result):
        print(line)
    return 0 if result.identical else 1
