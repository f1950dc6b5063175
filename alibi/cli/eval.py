"""`alibi eval perplexity` and `alibi eval generate`: model quality on a pinned prompt set, per kernel."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from alibi.errors import InputError
from alibi.governance.environment import environment_record
from alibi.io import atomic


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, required=True, help="checkpoint folder: dense (bf16) or W8A8")
    p.add_argument("--prompts", type=Path, required=True, help="prompt set folder (`alibi prompts build`)")
    p.add_argument("--kernel", help="kernel for a W8A8 checkpoint's Linears (required there; not for dense)")
    p.add_argument("--device", help="device for the model (default: the kernel's, CPU for dense)")
    p.add_argument("--nondeterministic", action="store_true",
                   help="the libraries' own attention, norms and dense Linears instead of the deterministic runner")
    p.add_argument("--windows", type=int, help="use only the first N windows (default all)")
    p.add_argument("--out", type=Path, help="also write the result as JSON here")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="perplexity and greedy generation on a pinned prompt set")
    es = p.add_subparsers(dest="eval_command", required=True, parser_class=type(p))
    ppl = es.add_parser("perplexity", help="perplexity on the prompt set's windows")
    _common(ppl)
    ppl.set_defaults(func=perplexity)
    gen = es.add_parser("generate", help="greedy continuations of each window's first tokens")
    _common(gen)
    gen.add_argument("--prompt-tokens", type=int, default=64, help="prompt length taken from each window (default 64)")
    gen.add_argument("--new-tokens", type=int, default=32, help="tokens to generate per prompt (default 32)")
    gen.set_defaults(func=generate)


def _say(args: argparse.Namespace, line: str) -> None:
    if not args.quiet:
        print(f"alibi eval {args.eval_command}: {line}", file=sys.stderr, flush=True)


def _window_progress(args: argparse.Namespace, what: str):
    """A per-window progress callback for `alibi.model.evaluate`, or None under --quiet."""
    if args.quiet:
        return None
    return lambda done, total, seconds: _say(args, f"[{done}/{total}] {what} ({seconds:.1f} s)")


def _load(args: argparse.Namespace):
    # deferred: keeps torch out of start-up
    from alibi.model.checkpoint import verified_checkpoint
    from alibi.model.prompts import load_prompt_set, require_tokenizer_match
    from alibi.model.runner import load_model

    if args.out is not None:  # refuse a bad --out before the (slow) model load, not after the work

        if args.out.is_dir():
            raise InputError(f"--out {args.out}: is a folder; name the JSON file to write")
        atomic.refuse_overlap(args.out, {"--model": args.model, "--prompts": args.prompts}, what="--out")
        atomic.check_writable_dir(args.out.parent if str(args.out.parent) else Path("."))
    prompts = load_prompt_set(args.prompts)
    if args.windows is not None and args.windows < 1:
        raise InputError(f"--windows must be positive (got {args.windows})")
    checked = verified_checkpoint(args.model)
    require_tokenizer_match(prompts, args.model)
    start = time.perf_counter()
    lm = load_model(args.model, args.kernel, args.device, deterministic=not args.nondeterministic)
    _say(args, f"loaded {args.model} ({'kernel ' + lm.kernel.name if lm.kernel else 'dense bf16'}, {lm.device}) in "
               f"{time.perf_counter() - start:.1f} s")
    record = {"model": str(args.model), "model_tensors_sha256": checked["tensors_sha256"],
              "prompts": str(args.prompts), "prompts_sha256": prompts.digest,
              "kernel": lm.kernel.name if lm.kernel else None, "device": str(lm.device),
              "execution": lm.execution.as_dict()}
    return lm, prompts, record


def _emit(args: argparse.Namespace, doc: dict) -> None:
    if args.out:
        atomic.write_text(args.out, json.dumps({**doc, "environment": environment_record()}, indent=2,
                                               sort_keys=True, ensure_ascii=False) + "\n")


def perplexity(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    from alibi.model.evaluate import perplexity as run

    lm, prompts, record = _load(args)
    scored = _window_progress(args, f"windows of {prompts.tokens} tokens scored")
    result = run(lm, prompts, args.windows, progress=scored)
    print(f"perplexity {result.perplexity:.4f} over {result.tokens} tokens "
          f"({len(result.per_window)} windows × {prompts.tokens}; {result.seconds:.1f}s) — "
          f"{record['model']} with {record['kernel'] or 'dense bf16'}")
    _emit(args, {**record, **result.as_dict()})
    return 0


def generate(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    from alibi.model.evaluate import greedy_continuations

    lm, prompts, record = _load(args)
    if not 1 <= args.prompt_tokens <= prompts.tokens or args.new_tokens < 1:
        raise InputError(f"--prompt-tokens must be in 1..{prompts.tokens} and --new-tokens positive")
    decode = _decoder(args.model)
    rows = []
    start = time.perf_counter()
    continued = _window_progress(args, f"prompts continued by {args.new_tokens} tokens")
    continuations = greedy_continuations(lm, prompts, args.prompt_tokens, args.new_tokens, args.windows,
                                         progress=continued)
    seconds = time.perf_counter() - start
    for c in continuations:
        prompt_ids = prompts.input_ids[c.window, : c.prompt_tokens].tolist()
        row = {"window": c.window, "prompt_tokens": c.prompt_tokens, "ids": list(c.ids)}
        if decode:
            row["prompt_tail"] = decode(prompt_ids)[-120:]
            row["text"] = decode(list(c.ids))
        rows.append(row)
        print(f"[{c.window}] …{row.get('prompt_tail', '')[-60:]!r} → {row.get('text', list(c.ids))!r}")
    generated = len(continuations) * args.new_tokens
    print(f"generated {len(continuations)} × {args.new_tokens} tokens greedily in {seconds:.1f}s "
          f"({generated / max(seconds, 1e-9):.1f} tokens/s) — {record['model']} with {record['kernel'] or 'dense bf16'}")
    _emit(args, {**record, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "seconds": seconds,
                 "sequences": rows})
    return 0


def _decoder(model_dir: Path):
    try:
        # deferred: keeps tokenizers out of start-up
        from tokenizers import Tokenizer
    except ImportError:
        return None
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        return None
    tok = Tokenizer.from_file(str(path))
    return lambda ids: tok.decode(ids, skip_special_tokens=False)
