"""`alibi replay teacher-forced|greedy|prefill-vs-decode`: from layer differences to tokens (thin over `alibi.tokens`)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from alibi.errors import InputError
from alibi.io.progress import progress


def _inputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, required=True, help="checkpoint folder (W8A8, or dense without --kernel)")
    p.add_argument("--prompts", type=Path, required=True, help="prompt set folder (`alibi prompts build`)")
    p.add_argument("--windows", type=int, help="use the first N windows of the set (default: all)")
    p.add_argument("--device", help="device for the model (default: the kernel's)")
    p.add_argument("--out", type=Path, required=True, help="output folder (written atomically)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier replay output at --out")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--nondeterministic", action="store_true",
                   help="run attention, norms and dense Linears the libraries' own way instead of the batch-invariant "
                        "deterministic runner (recorded in the manifest; for measuring the libraries)")


def _span(p: argparse.ArgumentParser, positions_default: str) -> None:
    p.add_argument("--context", type=int, help="T: tokens of context before the first position (default: half a window)")
    p.add_argument("--positions", type=int, help=f"P: positions per window ({positions_default})")


def require_scikit_learn(what: str) -> None:
    """InputError before any work when scikit-learn, which the flip analysis needs, is not installed (a run of
    both arms must not end, after the model ran, in an ImportError)."""
    if importlib.util.find_spec("sklearn") is None:
        raise InputError(f"{what} needs scikit-learn, which is not installed: pip install 'integer-alibi[analysis]' "
                         "(or run each arm alone with --kernel K --arm a|b, and `alibi analyze flips` where it is)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="teacher-forced replay, greedy agreement, prefill vs decode")
    rs = p.add_subparsers(dest="replay_command", required=True, parser_class=type(p))

    tf = rs.add_parser("teacher-forced", help="score pinned text position by position with one kernel "
                       "(or two, each in a fresh process, then `alibi analyze flips`)")
    _inputs(tf)
    _span(tf, "default: the rest of the window")
    tf.add_argument("--kernel", help="the kernel of this arm (one arm per process)")
    tf.add_argument("--arm", help="this arm's label in the manifest (default: the kernel's name)")
    tf.add_argument("--kernel-a", help="both arms: kernel of arm a (with --kernel-b)")
    tf.add_argument("--kernel-b", help="both arms: kernel of arm b (with --kernel-a)")
    tf.add_argument("--prereg", type=Path, metavar="DIR",
                    help="the locked protocol folder (`alibi prereg lock`) this replay is measured under: refused unless "
                         "locked and unchanged; its lock and amendment-head hashes go into every manifest "
                         "(predicate.protocol), and an amendment while the replay runs leaves nothing written")
    tf.add_argument("--engine", choices=("own", "vllm"), default="own",
                    help="own: the toolkit's runner (default); vllm: a real vLLM engine, scored from its prompt_logprobs, "
                         "where --kernel vllm is vLLM's own linear kernel and any alibi kernel name is swapped in for "
                         "it by alibi's plugin (docs/vllm-engine.md)")
    tf.set_defaults(func=teacher_forced)

    gr = rs.add_parser("greedy", help="greedy continuations per arm, each arm twice in fresh processes")
    _inputs(gr)
    gr.add_argument("--prompt-tokens", type=int, required=True, help="T: prompt tokens taken from each window")
    gr.add_argument("--new-tokens", type=int, required=True, help="G: tokens generated per prompt")
    gr.add_argument("--batch-size", type=int, default=1, help="prompts per batch (default 1; same for both arms)")
    gr.add_argument("--kernel-a", help="kernel of arm a (with --kernel-b)")
    gr.add_argument("--kernel-b", help="kernel of arm b (with --kernel-a)")
    gr.add_argument("--runs", type=int, default=2, help="fresh-process runs per arm (default 2)")
    gr.add_argument("--kernel", help="one run of one arm in this process (what the two-arm form starts)")
    gr.add_argument("--arm", help="with --kernel: this run's arm label (default: the kernel's name)")
    gr.add_argument("--run-index", type=int, default=1, help="with --kernel: which run of the arm this is")
    gr.add_argument("--trace", action="store_true", help="also write trace.pt per run: every module's output "
                    "digests, for `alibi locate RUN_A RUN_B`")
    gr.add_argument("--decode", choices=("auto", "eager", "cuda-graphs"), default="auto",  # greedy.DECODINGS
                    help="cuda-graphs: decode by replaying one CUDA graph per batch size and cache bucket (the same "
                         "tokens and logit bits as eager decoding in the deterministic runner; a kernel that cannot be "
                         "captured decodes eagerly, named in the manifest); eager: one launch per op; auto (default): "
                         "CUDA graphs on a CUDA device, eager on the CPU and with --trace")
    gr.add_argument("--engine", choices=("own", "vllm"), default="own",
                    help="vllm: every run a cold start of a real vLLM engine (--kernel-a vllm is vLLM's own kernel; an "
                         "alibi kernel name is swapped in by alibi's plugin)")
    gr.set_defaults(func=greedy)

    pd = rs.add_parser("prefill-vs-decode", help="one arm: prefill logits vs incremental decoding, bitwise, "
                       "with the first differing module per position")
    _inputs(pd)
    _span(pd, "default 64, or the rest of the window if shorter")
    pd.add_argument("--kernel", help="the kernel of the W8A8 checkpoint's Linears")
    pd.set_defaults(func=prefill_vs_decode)


def teacher_forced(args: argparse.Namespace) -> int:
    pair = args.kernel_a is not None or args.kernel_b is not None
    if pair:
        if args.kernel is not None or args.arm is not None:
            raise InputError("--kernel/--arm run one arm; --kernel-a/--kernel-b run both: give one form, not both")
        if args.kernel_a is None or args.kernel_b is None:
            raise InputError("--kernel-a and --kernel-b go together: name both arms' kernels")
        require_scikit_learn("replay teacher-forced --kernel-a/--kernel-b (its flip analysis)")
    if args.engine == "vllm":
        if args.prereg is not None:
            raise InputError("--prereg is recorded by the own runner's replay (--engine own); a vLLM replay does not "
                             "record a protocol yet: run it without --prereg")
        return _teacher_forced_vllm(args, pair)
    if pair:
        # deferred: keeps torch out of start-up
        from alibi.tokens.teacher_forced import run_pair

        code = run_pair(args.model, args.prompts, args.out, kernel_a=args.kernel_a, kernel_b=args.kernel_b,
                        windows=args.windows, context=args.context, positions=args.positions, device=args.device,
                        overwrite=args.overwrite, quiet=args.quiet, deterministic=not args.nondeterministic,
                        prereg=args.prereg)
        if code == 0:
            # deferred: keeps torch out of start-up
            from alibi.tokens.flips import read_flips

            fa = read_flips(args.out / "flips")
            print(f"teacher-forced: {args.kernel_a} (arm-a) vs {args.kernel_b} (arm-b): {fa.n_flips} flips in "
                  f"{fa.n_positions} positions; {args.out / 'flips'}")
        return code
    # deferred: keeps torch out of start-up
    from alibi.tokens.teacher_forced import run_teacher_forced

    arm = run_teacher_forced(args.model, args.prompts, args.out, kernel=args.kernel, windows=args.windows,
                             context=args.context, positions=args.positions, arm=args.arm, device=args.device,
                             overwrite=args.overwrite, deterministic=not args.nondeterministic,
                             progress=progress("teacher-forced", quiet=args.quiet, unit="window"), prereg=args.prereg)
    print(f"teacher-forced: {len(arm.records)} positions ({len(arm.windows)} windows × {arm.positions} after "
          f"{arm.context} tokens) with {arm.kernel or 'the dense model'} → {args.out}")
    return 0


def _teacher_forced_vllm(args: argparse.Namespace, pair: bool) -> int:
    # deferred: keeps numpy out of start-up
    from alibi.engine import vllm_runs

    if args.device not in (None, "cpu") or args.nondeterministic:
        raise InputError("--device and --nondeterministic configure the own runner; --engine vllm runs vLLM as it is")
    if pair:
        vllm_runs.pair_with_vllm(args.model, args.prompts, args.out, kernel_a=args.kernel_a, kernel_b=args.kernel_b,
                                 windows=args.windows, context=args.context, positions=args.positions,
                                 overwrite=args.overwrite, quiet=args.quiet)
        print(f"teacher-forced inside vLLM: {args.kernel_a} (arm-a) vs {args.kernel_b} (arm-b), flips in "
              f"{args.out / 'flips'}")
        return 0
    if args.kernel is None:
        raise InputError("--engine vllm: name the arm's kernel: --kernel vllm (vLLM's own) or an alibi kernel to swap in")
    arm = vllm_runs.teacher_forced_with_vllm(args.model, args.prompts, args.out, kernel=args.kernel,
                                             windows=args.windows, context=args.context, positions=args.positions,
                                             arm=args.arm, overwrite=args.overwrite)
    print(f"teacher-forced inside vLLM: {len(arm.records)} positions ({len(arm.windows)} windows × {arm.positions} "
          f"after {arm.context} tokens) with {arm.kernel or 'vLLM'} → {args.out}")
    return 0


def greedy(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    from alibi.tokens import greedy as lib

    if args.kernel_a is not None or args.kernel_b is not None:
        if args.kernel is not None or args.arm is not None:
            raise InputError("--kernel/--arm make one run of one arm; --kernel-a/--kernel-b compare two: give one form")
        if args.kernel_a is None or args.kernel_b is None:
            raise InputError("--kernel-a and --kernel-b go together: name both arms' kernels")
        if args.engine == "vllm":
            return _greedy_vllm(args)
        result = lib.run_agreement(args.model, args.prompts, args.out, kernel_a=args.kernel_a,
                                   kernel_b=args.kernel_b, prompt_tokens=args.prompt_tokens,
                                   new_tokens=args.new_tokens, windows=args.windows, batch_size=args.batch_size,
                                   runs=args.runs, device=args.device, overwrite=args.overwrite, quiet=args.quiet,
                                   deterministic=not args.nondeterministic, trace=args.trace,
                                   decode=args.decode)
        if isinstance(result, int):
            return result
        for line in lib.summary_lines(result):
            print(line)
        return 0
    if args.kernel is None and args.arm is not None:
        raise InputError("--arm labels a run of --kernel; name the kernel (or use --kernel-a/--kernel-b)")
    if args.engine == "vllm":
        raise InputError("--engine vllm compares two arms: give --kernel-a and --kernel-b (vllm = vLLM's own kernel)")
    run = lib.run_greedy_arm(args.model, args.prompts, args.out, kernel=args.kernel, arm=args.arm,
                             run_index=args.run_index, prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens,
                             windows=args.windows, batch_size=args.batch_size, device=args.device,
                             overwrite=args.overwrite, progress=progress("greedy", quiet=args.quiet, unit="prompt"),
                             deterministic=not args.nondeterministic, trace=args.trace, decode=args.decode)
    print(f"greedy: {len(run.sequences)} prompts × {run.new_tokens} new tokens with {run.kernel or 'the dense model'} "
          f"(batch {run.batch_size}, {run.seconds:.1f}s) → {args.out}")
    return 0


def _greedy_vllm(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    from alibi.engine.vllm_runs import greedy_agreement_with_vllm
    from alibi.tokens.greedy import summary_lines

    if args.device not in (None, "cpu") or args.nondeterministic or args.trace or args.batch_size != 1 \
            or args.decode != "auto":
        raise InputError("--device, --nondeterministic, --trace, --batch-size and --decode configure the own "
                         "runner; --engine vllm runs vLLM as it is (it batches the prompts itself)")
    result = greedy_agreement_with_vllm(args.model, args.prompts, args.out, kernel_a=args.kernel_a,
                                        kernel_b=args.kernel_b, prompt_tokens=args.prompt_tokens,
                                        new_tokens=args.new_tokens, windows=args.windows, runs=args.runs,
                                        overwrite=args.overwrite)
    for line in summary_lines(result):
        print(line)
    return 0


def prefill_vs_decode(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    from alibi.tokens.prefill_decode import run_prefill_vs_decode, summary_lines

    result = run_prefill_vs_decode(args.model, args.prompts, args.out, kernel=args.kernel, windows=args.windows,
                                   context=args.context, positions=args.positions, device=args.device,
                                   overwrite=args.overwrite, deterministic=not args.nondeterministic,
                                   progress=progress("prefill-vs-decode", quiet=args.quiet, unit="window"))
    for line in summary_lines(result):
        print(line)
    return 0
