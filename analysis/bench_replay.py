"""Benchmark: teacher-forced replay throughput, and its cost over a plain forward pass.

In one process, on one model and kernel, over the same windows of a prompt set:

- *forward*: `LoadedModel.logits` of tokens 0 … T+P−1 of each window (what any evaluation pays);
- *replay*: `alibi.tokens.teacher_forced.replay_windows` over the same tokens — the same forward
  plus scoring the P rows (log-softmax, top-1/top-2, margin), moving them to the host and the
  sha256 of every scored fp32 logit row.

Each is timed `--repeats` times, interleaved (forward, replay, forward, replay, …) after one
warm-up of each, synchronizing CUDA around every timed run; the medians are reported with the
replay throughput in scored positions per second and `ratio` = replay / forward time (the goal
is ≤ 1.2), and the same in process CPU time (`cpu_ratio`: all threads, which a machine shared
with other jobs distorts less than wall time). Prints one JSON object (and writes it to `--out` if given).

    python analysis/bench_replay.py --model MODEL_DIR --kernel torch-cpu --prompts SET \\
        [--windows 8] [--context 256] [--positions 256] [--repeats 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from alibi.governance.environment import environment_record
from alibi.io import atomic
from alibi.model.prompts import load_prompt_set
from alibi.model.runner import load_model
from alibi.tokens.setup import resolve_span
from alibi.tokens.teacher_forced import RowHasher, replay_windows

GOAL_RATIO = 1.2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--kernel")
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--context", type=int)
    ap.add_argument("--positions", type=int)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    prompts = load_prompt_set(args.prompts)
    span = resolve_span(prompts, args.windows, args.context, args.positions, args.prompts)
    lm = load_model(args.model, args.kernel, args.device)
    ids = prompts.input_ids
    hasher = RowHasher()

    def sync() -> None:
        if lm.device.type == "cuda":
            torch.cuda.synchronize()

    def forward() -> None:
        for w in span.windows:
            lm.logits(ids[w, : span.fed].reshape(1, -1))

    def replay() -> None:
        replay_windows(lm, ids, span, hasher=hasher)

    def timed(fn) -> tuple[float, float]:
        sync()
        t, c = time.perf_counter(), time.process_time()
        fn()
        sync()
        return time.perf_counter() - t, time.process_time() - c

    timed(forward), timed(replay)  # warm-up: kernel compilation, allocator, thread pool
    runs: dict[str, list[float]] = {"forward": [], "replay": []}
    cpu: dict[str, list[float]] = {"forward": [], "replay": []}
    for _ in range(args.repeats):
        for key, fn in (("forward", forward), ("replay", replay)):
            wall, proc = timed(fn)
            runs[key].append(wall)
            cpu[key].append(proc)
    hasher.close()
    forward_s, replay_s = statistics.median(runs["forward"]), statistics.median(runs["replay"])
    cpu_forward_s, cpu_replay_s = statistics.median(cpu["forward"]), statistics.median(cpu["replay"])
    scored = len(span.windows) * span.positions
    doc = {
        "benchmark": "teacher-forced replay vs plain forward",
        "kernel": lm.kernel.name if lm.kernel is not None else None, "device": str(lm.device),
        "windows": len(span.windows), "context": span.context, "positions": span.positions,
        "fed_tokens": span.fed, "scored_positions": scored, "repeats": args.repeats,
        "forward_s": round(forward_s, 4), "replay_s": round(replay_s, 4),
        "forward_runs_s": [round(x, 4) for x in runs["forward"]], "replay_runs_s": [round(x, 4) for x in runs["replay"]],
        "replay_positions_per_s": round(scored / replay_s, 1),
        "forward_tokens_per_s": round(len(span.windows) * span.fed / forward_s, 1),
        "ratio": round(replay_s / forward_s, 4), "goal_ratio": GOAL_RATIO,
        "cpu_forward_s": round(cpu_forward_s, 4), "cpu_replay_s": round(cpu_replay_s, 4),
        "cpu_ratio": round(cpu_replay_s / cpu_forward_s, 4),
        "goal_met": replay_s / forward_s <= GOAL_RATIO,
        "environment": environment_record(),
    }
    text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    if args.out:
        atomic.write_text(args.out, text)
    print(text, end="")


if __name__ == "__main__":
    main()
