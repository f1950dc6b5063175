"""Where a plain conformance run's wall goes, without a profiler: the host's own time in each step of the pipeline
(exclusive of the steps it calls), from perf_counter around each step and no synchronization added, over warm plain
runs on the GPU (cutlass vs triton, check device cuda, CUDA graphs). A run is bound by the host where the steps'
time adds up to its wall; the collect step's time is mostly the host waiting for the device (its one read back).

    PYTHONPATH=. python analysis/h200/host_timeline.py (--synthetic PRESET | --tiles DIR) [RUNS]

HOST_TIMELINE_ROWS: the preset's rows (default 512); HOST_TIMELINE_PAIR ("A B") and HOST_TIMELINE_DEVICE (cpu) give a
smoke run without a GPU.
"""

import collections
import functools
import gc
import os
import statistics
import sys
import time

import torch

import alibi.conform.judge as judge
import alibi.conform.judge_graphs as judge_graphs
import alibi.conform.launches as launches
import alibi.conform.pipeline as pipeline
import alibi.kernels.base as base

kind, value = sys.argv[1:3]
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 10
rows = int(os.environ.get("HOST_TIMELINE_ROWS", 512))
source = pipeline.source_from_preset(value, rows=rows) if kind == "--synthetic" else pipeline.source_from_dir(value)
pair = pipeline.choose_pair(*os.environ.get("HOST_TIMELINE_PAIR", "cutlass triton").split())
device = torch.device(os.environ.get("HOST_TIMELINE_DEVICE", "cuda"))  # cpu: a smoke test of the script


def synchronize() -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()

own: collections.Counter = collections.Counter()
calls: collections.Counter = collections.Counter()
inside: list[float] = []  # the time spent in wrapped steps called by the step on top, per level


def timed(name, fn):
    @functools.wraps(fn)
    def step(*args, **kwargs):
        inside.append(0.0)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = time.perf_counter() - t0
            own[name] += spent - inside.pop()
            calls[name] += 1
            if inside:
                inside[-1] += spent
    return step


def wrap(owner, attr, name=None, *also):
    """`owner.attr` timed under `name`; the same wrapper put in place of the name in each module of `also`."""
    raw = owner.__dict__[attr]
    if isinstance(raw, classmethod):
        setattr(owner, attr, classmethod(timed(name or attr, raw.__func__)))
        return
    wrapped = timed(name or attr, raw)
    setattr(owner, attr, wrapped)
    for module in also:
        setattr(module, attr, wrapped)


wrap(pipeline, "prepare_tiles")
wrap(base, "pack", "pack (staging, transfer)", pipeline)
# the exact reference: one GEMM per tile, or per group of tiles where the pipeline batches them
wrap(pipeline, "exact_accumulators" if "exact_accumulators" in vars(pipeline) else "exact_accumulator")
wrap(pipeline, "pow2_round")
wrap(judge.ScaleFacts, "of_units", "ScaleFacts.of_units")
wrap(pipeline, "run_unit")
wrap(launches, "arm_launches", "arm_launches (eager)")
wrap(launches.ArmGraph, "replay", "ArmGraph.replay")
wrap(judge, "batch_inputs")
wrap(judge.BatchLayout, "of", "BatchLayout.of")
wrap(judge_graphs.JudgeGraphs, "measure", "JudgeGraphs.measure")
wrap(judge.Measurement, "collect", "collect (waits for the device)")
wrap(judge.Measurement, "verdicts")
wrap(pipeline, "summarize")
wrap(pipeline, "environment")

pipeline.run_conformance(pair, source, device=device)
pipeline.run_conformance(pair, source, device=device)  # the graphs' first replays
synchronize()


def allocations() -> tuple[int, int, int]:
    """The collector's full passes, the device's memory segments allocated (cudaMalloc) and the host's pinned
    blocks allocated (cudaHostAlloc), so far in this process."""
    if device.type != "cuda":
        return gc.get_stats()[2]["collections"], 0, 0
    return (gc.get_stats()[2]["collections"], torch.cuda.memory_stats().get("segment.all.allocated", 0),
            torch.cuda.host_memory_stats().get("num_host_alloc", 0))


walls, per_run, grown = [], [], []
for _ in range(runs):
    own.clear()
    calls.clear()
    synchronize()
    before = allocations()
    t0 = time.perf_counter()
    report = pipeline.run_conformance(pair, source, device=device)
    synchronize()
    walls.append(time.perf_counter() - t0)
    grown.append(tuple(b - a for a, b in zip(before, allocations(), strict=True)))
    per_run.append((dict(own), dict(calls)))
units = len(report.tiles)
print(f"{value}: {units} units, {runs} warm plain runs, walls (s): {', '.join(f'{w:.4f}' for w in walls)}; "
      f"median {statistics.median(walls):.4f}")
steps = sorted({k for o, _ in per_run for k in o}, key=lambda k: -statistics.median(o.get(k, 0) for o, _ in per_run))
print(f"{'step (host time, its own)':40s} {'median ms':>10s} {'calls':>6s} {'us/call':>8s}")
for k in steps:
    ms = statistics.median(1e3 * o.get(k, 0.0) for o, _ in per_run)
    n = per_run[-1][1].get(k, 0)
    print(f"{k:40s} {ms:10.3f} {n:6d} {1e3 * ms / max(n, 1):8.1f}")
top = statistics.median(1e3 * sum(o.values()) for o, _ in per_run)
print("per run: wall s; full collector passes, device segments and pinned host blocks allocated; then the steps "
      "that took over 1 ms more than their median")
medians = {k: statistics.median(o.get(k, 0.0) for o, _ in per_run) for k in steps}
for wall, (o, _), (passes, segments, pinned) in zip(walls, per_run, grown, strict=True):
    slower = {k: 1e3 * (o.get(k, 0.0) - medians[k]) for k in steps if o.get(k, 0.0) - medians[k] > 1e-3}
    print(f"  {wall:.4f}  gc {passes}  segments {segments}  pinned {pinned}  "
          + ", ".join(f"{k} +{ms:.1f} ms" for k, ms in slower.items()))
print(f"{'the steps above':40s} {top:10.3f}; the rest of the run (run_conformance's own, unwrapped code) "
      f"{1e3 * statistics.median(walls) - top:.3f} ms")
