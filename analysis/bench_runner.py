"""Runner forward throughput: the deterministic (batch-invariant) mode against the libraries' defaults.

Both modes run in one process on the same checkpoint, kernel and prompts, interleaved repeat by
repeat so that a drift of the machine cannot pass for a difference between them:

    python analysis/bench_runner.py --model W8A8 --kernel cutlass --prompts experiments/prompts/wikipedia-64x512 \\
        --batch 64 --prompt-tokens 128 --new-tokens 64 --repeats 3 --out bench-runner.json

Timed: a greedy generation of B prompts (one prefill of B×T tokens, then G decode steps of B rows
each, KV cache), eager PyTorch, with CUDA synchronised around each phase; the model load and the
first (warm-up) generation are not timed. Reported per mode: median prefill ms, median ms per
decode step, decode tokens/s, and the ratio deterministic/native (the cost of determinism). No
CUDA graphs: transformers' dynamic KV cache changes shape every step, so both modes run eagerly,
as the runner does. Weights and activations do not fit in L2 (SmolLM2's 135 M parameters alone
are 135 MB in int8), so every step reads them from HBM.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_generation(lm, ids: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    """(prefill seconds, mean seconds per decode step) of one greedy generation of ids [B, T]."""
    dev = lm.device
    with torch.inference_mode():
        _sync(dev)
        t0 = time.perf_counter()
        out = lm.model(input_ids=ids.to(dev), use_cache=True)
        nxt = out.logits[:, -1].float().argmax(dim=-1, keepdim=True)
        _sync(dev)
        t1 = time.perf_counter()
        for _ in range(new_tokens - 1):
            out = lm.model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
            nxt = out.logits[:, -1].float().argmax(dim=-1, keepdim=True)
        _sync(dev)
        t2 = time.perf_counter()
    return t1 - t0, (t2 - t1) / max(new_tokens - 1, 1)


def profile_decode(lm, ids: torch.Tensor, steps: int = 4) -> str:
    """torch.profiler's table (by self CPU time) of `steps` decode steps after a prefill, with the
    number of kernel launches per step: where a mode's time goes, op by op."""
    from torch.profiler import ProfilerActivity, profile

    dev = lm.device
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with torch.inference_mode():
        out = lm.model(input_ids=ids.to(dev), use_cache=True)
        nxt = out.logits[:, -1].float().argmax(dim=-1, keepdim=True)
        _sync(dev)
        with profile(activities=activities) as prof:
            for _ in range(steps):
                out = lm.model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
                nxt = out.logits[:, -1].float().argmax(dim=-1, keepdim=True)
            _sync(dev)
    events = prof.key_averages()
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx",
                                                         "cudaLaunchKernelExC"))
    return (f"kernel launches per decode step: {launches / steps:.0f}\n"
            + events.table(sort_by="self_cpu_time_total", row_limit=30))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--kernel", required=True)
    p.add_argument("--prompts", type=Path, required=True)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--profile", type=Path, help="also write torch.profiler's op table of a few decode steps per mode here")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.batch < 1 or args.new_tokens < 2:
        print("bench_runner: --repeats and --batch must be ≥ 1, --new-tokens ≥ 2", file=sys.stderr)
        return 2

    from alibi.governance.environment import environment_record, toolkit_record
    from alibi.model.prompts import load_prompt_set
    from alibi.model.runner import load_model

    ids = load_prompt_set(args.prompts).input_ids[: args.batch, : args.prompt_tokens]
    models = {"native": load_model(args.model, args.kernel, args.device, deterministic=False),
              "deterministic": load_model(args.model, args.kernel, args.device, deterministic=True)}
    # The torch flags are process-wide: each mode's are set again before it runs.
    from alibi.model.execution import _set_library_flags

    times: dict[str, list[tuple[float, float]]] = {m: [] for m in models}
    for r in range(args.repeats + 1):
        for mode, lm in models.items():
            _set_library_flags(mode == "deterministic")
            t = time_generation(lm, ids, args.new_tokens)
            if r > 0:  # repeat 0 warms up (kernel compilation, allocator)
                times[mode].append(t)
    if args.profile:
        tables = []
        for mode, lm in models.items():
            _set_library_flags(mode == "deterministic")
            tables.append(f"== {mode}: {lm.execution.as_dict()}\n{profile_decode(lm, ids)}")
        args.profile.write_text("\n\n".join(tables) + "\n")
    rows = {}
    for mode, ts in times.items():
        prefill = statistics.median(t[0] for t in ts)
        step = statistics.median(t[1] for t in ts)
        rows[mode] = {"prefill_ms": round(prefill * 1e3, 3), "decode_ms_per_step": round(step * 1e3, 3),
                      "decode_tokens_per_s": round(ids.shape[0] / step, 1), "execution": models[mode].execution.as_dict()}
    doc = {"schema": "alibi-bench-runner/v1", "kernel": args.kernel, "batch": int(ids.shape[0]),
           "prompt_tokens": int(ids.shape[1]), "new_tokens": args.new_tokens, "repeats": args.repeats,
           "device": str(models["native"].device), "modes": rows,
           "decode_cost_ratio": round(rows["deterministic"]["decode_ms_per_step"] / rows["native"]["decode_ms_per_step"], 4),
           "prefill_cost_ratio": round(rows["deterministic"]["prefill_ms"] / rows["native"]["prefill_ms"], 4),
           "timing": "eager, CUDA synchronised around each phase, medians over repeats, modes interleaved; "
                     "warm-up generation excluded; no CUDA graphs (dynamic KV cache)",
           "toolkit": toolkit_record(), "environment": environment_record()}
    args.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(json.dumps({k: doc[k] for k in ("device", "batch", "decode_cost_ratio", "prefill_cost_ratio")}), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
