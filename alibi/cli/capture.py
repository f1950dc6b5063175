"""`alibi capture`: record every quantized Linear's operands on one prompt window as tiles.

`alibi capture-overhead` times a forward pass with and without capture and prints the ratio.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from alibi.errors import InputError
from alibi.governance.environment import environment_record
from alibi.io import atomic
from alibi.io.progress import progress


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, required=True, help="W8A8 checkpoint folder (e.g. OUT/w8a8)")
    p.add_argument("--prompts", type=Path, required=True, help="prompt set folder (`alibi prompts build`)")
    p.add_argument("--tokens", type=int, help="tokens of the window to run, i.e. M (default: the whole window)")
    p.add_argument("--window", type=int, default=0, help="which window of the prompt set (default 0)")
    p.add_argument("--kernel", help="kernel the quantized Linears call (default: torch-cpu in the own runner; "
                   "vLLM's own kernel with --engine vllm, where an alibi kernel name swaps it in)")
    p.add_argument("--device", help="device for the model (default: the kernel's)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("capture", help="record each quantized Linear's exact operands as tiles")
    _common(p)
    p.add_argument("--engine", choices=("own", "vllm"), default="own",
                   help="own: the toolkit's runner (default); vllm: a real vLLM engine with alibi's plugin recording "
                        "the operands vLLM's int8 kernel receives (docs/vllm-engine.md)")
    p.add_argument("--out", type=Path, required=True, help="output folder for the tiles and manifest.json")
    p.set_defaults(func=run)
    o = sub.add_parser("capture-overhead", help="benchmark: forward time with capture vs without (ratio)")
    _common(o)
    o.add_argument("--repeats", type=int, default=5, help="timed runs of each variant (default 5)")
    o.add_argument("--out", type=Path, help="also write the result as JSON here")
    o.set_defaults(func=overhead)


def _progress(args: argparse.Namespace):
    """Progress on stderr (alibi.io.progress: a bar on a terminal, lines elsewhere, nothing under --quiet)."""
    return progress(args.command, quiet=args.quiet, unit="stage")


def run(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    from alibi.model.capture import capture_to_folder

    if args.engine == "vllm":
        # deferred: keeps numpy out of start-up
        from alibi.engine.vllm_runs import capture_with_vllm

        if args.device not in (None, "cpu"):
            raise InputError(f"--device {args.device}: --engine vllm runs the engine vLLM was built for (the CPU here)")
        _progress(args).note(f"alibi capture: starting a vLLM engine on {args.model} (about a minute)")
        result = capture_with_vllm(args.model, args.prompts, args.out, tokens=args.tokens, window=args.window,
                                   kernel=args.kernel)
        print(f"captured {len(result.files)} tiles inside vLLM at M={result.tokens} into {result.folder} "
              "(manifest.json pins each; engine.log and engine.json record vLLM's kernel choice)")
        return 0
    result = capture_to_folder(args.model, args.prompts, args.out, tokens=args.tokens, window=args.window,
                               kernel=args.kernel or "torch-cpu", device=args.device, progress=_progress(args))
    print(f"captured {len(result.files)} tiles at M={result.tokens} into {result.folder} (manifest.json pins each)")
    return 0


def overhead(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    from alibi.model.capture import capture_overhead, require_quantized
    from alibi.model.prompts import load_prompt_set
    from alibi.model.runner import load_model

    if args.repeats < 1:  # before anything is loaded or printed
        raise InputError(f"--repeats must be a positive integer (timed runs of each variant), got {args.repeats}")
    require_quantized(args.model)
    prompts = load_prompt_set(args.prompts)
    tokens = prompts.tokens if args.tokens is None else args.tokens
    if not 0 <= args.window < prompts.windows or not 1 <= tokens <= prompts.tokens:
        raise InputError(f"--window/--tokens out of range for {args.prompts} ({prompts.windows}×{prompts.tokens})")
    lm = load_model(args.model, args.kernel or "torch-cpu", args.device)
    ids = prompts.input_ids[args.window, :tokens].reshape(1, -1)
    _progress(args).note(f"alibi {args.command}: timing {args.repeats} forwards of M={tokens} with and without "
                         "capture (after one warm-up each)")
    result = capture_overhead(lm, ids, args.repeats)
    doc = {**asdict(result), "kernel": lm.kernel.name, "device": str(lm.device), "environment": environment_record()}
    print(f"forward M={result.tokens} with {lm.kernel.name}: {result.plain_s:.3f}s plain, {result.capture_s:.3f}s "
          f"with capture (ratio {result.ratio:.3f}), {result.capture_tiles_s:.3f}s incl. CPU tiles "
          f"(ratio {result.ratio_with_tiles:.3f}); CPU time ratio {result.cpu_ratio:.3f}; median of {result.repeats}")
    if args.out:
        atomic.write_text(args.out, json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return 0
