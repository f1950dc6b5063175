"""The wall time of plain `run_conformance` runs (no stage timer), measured the same way for any commit: the one figure
both sides of a before/after comparison can give, whatever their own `alibi bench conform` reports (a commit before
bench-conform/v2 timed staged runs only). Runs the code on PYTHONPATH: two warm-up runs of the whole source (the
first's wall printed too; the second replays each CUDA graph a first time, which uploads it), then REPEATS runs of
the whole source, each between two synchronizations of the GPU; prints one line, with the garbage collector's full
passes during the timed runs (count and seconds: a full pass walks every object the process holds).

    PYTHONPATH=SRC python analysis/h200/wall_conform.py KERNEL_A KERNEL_B DEVICE REPEATS (--synthetic PRESET | --tiles DIR)

ALIBI_GRAPHS=1 / 0 passes graphs=True / False to code that has CUDA-graph launches (alibi.conform.launches); unset,
or for code without them, the code's own default runs.
"""

import gc
import inspect
import os
import statistics
import sys
import time

import torch

from alibi.conform.pipeline import (
    choose_pair,
    run_conformance,
    source_from_dir,
    source_from_preset,
)

kernel_a, kernel_b, device, repeats, kind, value = sys.argv[1:7]
source = source_from_preset(value, rows=512) if kind == "--synthetic" else source_from_dir(value)
pair = choose_pair(kernel_a, kernel_b)
graphs = inspect.signature(run_conformance).parameters.get("graphs")  # None: code without CUDA-graph launches
asked = os.environ.get("ALIBI_GRAPHS") or None  # empty: unset
options = {} if graphs is None or asked is None else {"graphs": asked == "1"}
replayed = graphs is not None and options.get("graphs", graphs.default)
torch.cuda.synchronize()
t0 = time.perf_counter()
run_conformance(pair, source, device=device, **options)
torch.cuda.synchronize()
warmup = time.perf_counter() - t0
run_conformance(pair, source, device=device, **options)  # a CUDA graph's first replay uploads it: once per process
torch.cuda.synchronize()
full_passes: list[float] = []
started: list[float] = []


def timed_full_passes(phase: str, info: dict) -> None:
    if info["generation"] != 2:
        return
    if phase == "start":
        started.append(time.perf_counter())
    else:
        full_passes.append(time.perf_counter() - started.pop())


gc.callbacks.append(timed_full_passes)
walls = []
for _ in range(int(repeats)):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    report = run_conformance(pair, source, device=device, **options)
    torch.cuda.synchronize()
    walls.append(time.perf_counter() - t0)
elements = sum(u.n_elements for u in report.tiles)
median = statistics.median(walls)
print(f"plain wall: {len(report.tiles)} units, {elements:,} elements, median {median:.4f} s, "
      f"{elements / median / 1e6:.1f} M el/s over {repeats} runs ({', '.join(f'{w:.4f}' for w in walls)}); "
      f"warm-up {warmup:.4f} s" + ("; CUDA-graph launches" if replayed else "")
      + f"; gc full passes {len(full_passes)}, {sum(full_passes):.4f} s")
