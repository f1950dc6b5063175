"""What the garbage collector does during warm plain conformance runs on the GPU (cutlass vs triton): per run, its full
passes (seconds, objects collected), and then, over one run with gc.DEBUG_SAVEALL, the cyclic garbage the run left
(objects by type, tensors and their bytes by device).

    PYTHONPATH=. python analysis/h200/gc_census.py (--synthetic PRESET | --tiles DIR) [RUNS]
"""

import collections
import gc
import sys
import time

import torch

import alibi.conform.pipeline as pipeline

kind, value = sys.argv[1:3]
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 5
source = pipeline.source_from_preset(value, rows=512) if kind == "--synthetic" else pipeline.source_from_dir(value)
pair = pipeline.choose_pair("cutlass", "triton")
passes: list[tuple[int, float, int]] = []
started: list[float] = []


def timed(phase: str, info: dict) -> None:
    if phase == "start":
        started.append(time.perf_counter())
    else:
        passes.append((info["generation"], time.perf_counter() - started.pop(), info["collected"]))


pipeline.run_conformance(pair, source, device="cuda")
torch.cuda.synchronize()
print(f"objects tracked after the warm-up: {len(gc.get_objects())}")
gc.callbacks.append(timed)
for r in range(runs):
    passes.clear()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    pipeline.run_conformance(pair, source, device="cuda")
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    full = [(s, c) for g, s, c in passes if g == 2]
    print(f"run {r + 1}: wall {wall:.4f} s; passes by generation "
          f"{dict(collections.Counter(g for g, _, _ in passes))}; full passes {[(round(s, 4), c) for s, c in full]}; "
          f"young passes {sum(s for g, s, _ in passes if g < 2):.4f} s", flush=True)
gc.callbacks.remove(timed)
gc.collect()
gc.set_debug(gc.DEBUG_SAVEALL)
pipeline.run_conformance(pair, source, device="cuda")
torch.cuda.synchronize()
t0 = time.perf_counter()
gc.collect()
print(f"collect after a run (saving all): {time.perf_counter() - t0:.4f} s; garbage objects {len(gc.garbage)}")
print("by type:", collections.Counter(type(o).__name__ for o in gc.garbage).most_common(30))
tensors = [o for o in gc.garbage if isinstance(o, torch.Tensor)]
bytes_by = collections.Counter()
for t in tensors:
    bytes_by[str(t.device)] += t.untyped_storage().nbytes()
print(f"tensors {len(tensors)}; storage bytes by device {dict(bytes_by)}")
frames = [o for o in gc.garbage if type(o).__name__ == "frame"]
print("frames:", collections.Counter(f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_code.co_name}"
                                     for f in frames).most_common(15))
gc.set_debug(0)
gc.garbage.clear()
