"""Where a plain conformance run's host time goes on the GPU machine (cutlass vs triton, check device cuda): a cProfile
of three plain runs (no torch profiler, whose own bookkeeping would dominate), then the host cost of the pieces of
a tile's preparation and private copies, each with N calls queued before one synchronization.

    PYTHONPATH=. python analysis/h200/host_profile.py PRESET     (e.g. smollm2-135m-full, qwen3-1.7b)
"""

import cProfile
import io
import os
import pstats
import sys
import time

import torch

import alibi.conform.launches as launches
import alibi.conform.pipeline as pipeline
from alibi.conform.judge import ScaleFacts
from alibi.exact.emulator import exact_accumulator
from alibi.kernels.base import operands, pack, private_copy

preset = sys.argv[1]
pair = pipeline.choose_pair("cutlass", "triton")
source = pipeline.source_from_preset(preset, rows=512)
dev = torch.device("cuda")
pipeline.run_conformance(pair, source, device="cuda")
torch.cuda.synchronize()
t0 = time.perf_counter()
pipeline.run_conformance(pair, source, device="cuda")
torch.cuda.synchronize()
print(f"plain run {time.perf_counter() - t0:.4f} s", flush=True)
profile = cProfile.Profile()
profile.enable()
for _ in range(3):
    pipeline.run_conformance(pair, source, device="cuda")
torch.cuda.synchronize()
profile.disable()
text = io.StringIO()
stats = pstats.Stats(profile, stream=text)
stats.sort_stats("tottime").print_stats(45)
stats.sort_stats("cumulative").print_stats(60)
for name in ("prepare_tiles", "pack", "run_unit", "launch", "replay", "_measure_batch", "collect", "verdicts"):
    stats.print_callees(name)
print(text.getvalue())


def cost(name, fn, n=200):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    queued = time.perf_counter()
    torch.cuda.synchronize()
    print(f"{name:44s} host {1e6 * (queued - start) / n:8.1f} us/call", flush=True)


tiles = list(source.tiles)
t = tiles[0]
same_shape = [x for x in tiles if (x.N, x.K) == (t.N, t.K)][:20]
present = {k: v for k, v in operands(t).items() if v is not None}
cost("pack (pinned staging, one tile)", lambda: pack(present, dev))
cost("pinned empty 1 MB", lambda: torch.empty(2**20, dtype=torch.uint8, pin_memory=True))
cost("device empty 1 MB", lambda: torch.empty(2**20, dtype=torch.uint8, device=dev))
pinned = torch.empty(2**20, dtype=torch.uint8, pin_memory=True)
cost("pinned 1 MB .to(cuda, non_blocking)", lambda: pinned.to(dev, non_blocking=True))
pageable = torch.empty(2**20, dtype=torch.uint8)
cost("host copy of 1 MB into pinned memory", lambda: pinned.copy_(pageable))
views = pack(present, dev)
cost("exact_accumulator", lambda: exact_accumulator(views["a_q"], views["w_q"]))
cost("ScaleFacts.of_units, 20 tiles", lambda: ScaleFacts.of_units([(x, x) for x in same_shape]), 50)
cost("prepare_tiles, one tile", lambda: pipeline.prepare_tiles([(t, ("real", "pow2"))], dev), 100)
cost(f"prepare_tiles, {len(same_shape)} tiles of one shape",
     lambda: pipeline.prepare_tiles([(x, ("real", "pow2")) for x in same_shape], dev), 20)
real = pipeline.prepare(t, dev).regimes["real"]
cost("private_copy", lambda: private_copy(real, dev))
cost("sub_tile", lambda: launches.sub_tile(real, launches.sub_batches(real.M)[1]))
out = torch.empty((512, 576), dtype=torch.bfloat16, device=dev)
cost("a .to(dev) that copies nothing", lambda: out.to(dev))
print(f"torch threads {torch.get_num_threads()}, cpu_count {os.cpu_count()}, OMP_NUM_THREADS "
      f"{os.environ.get('OMP_NUM_THREADS')}", flush=True)
big = max(tiles, key=lambda x: x.w_q.numel()).w_q.contiguous()
staging = torch.empty(big.numel(), dtype=torch.int8, pin_memory=True)
mb = big.numel() / 1e6
cost(f"host copy of {mb:.1f} MB pageable into pinned", lambda: staging.copy_(big.view(-1)), 50)
torch.set_num_threads(1)
cost("the same, one thread", lambda: staging.copy_(big.view(-1)), 50)
torch.set_num_threads(os.cpu_count())
cost(f"the same, {os.cpu_count()} threads", lambda: staging.copy_(big.view(-1)), 50)
on_dev = torch.empty_like(staging, device=dev)
cost(f"{mb:.1f} MB pageable -> GPU (copy_, non_blocking)", lambda: on_dev.copy_(big.view(-1), non_blocking=True), 50)
cost(f"{mb:.1f} MB pinned -> GPU (copy_, non_blocking)", lambda: on_dev.copy_(staging, non_blocking=True), 50)
cudart = torch.cuda.cudart()
flat = big.view(-1)


def register() -> None:
    cudart.cudaHostRegister(flat.data_ptr(), flat.numel(), 0)
    cudart.cudaHostUnregister(flat.data_ptr())


cost(f"cudaHostRegister + Unregister of {mb:.1f} MB", register, 20)
small = torch.empty(2**16, dtype=torch.uint8, device=dev)
other = torch.empty_like(small)
cost("64 kB device copy (copy_)", lambda: other.copy_(small), 500)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    other.copy_(small)
cost("replay of a one-copy graph", g.replay, 500)
