"""cuBLASLt's block-scaled schedule at long K (padded K > 2048), shape by shape: `alibi identify`'s block reading
of `cublaslt-fp8-block` on random tiles of several seeds at each shape, and the schedules that reproduce every
output bit of every seed (their intersection). A shape whose intersection is one schedule, with every run
identical, is a candidate for the kernel's `IDENTIFIED_LONG_K`; one with several is left undeclared.

    PYTHONPATH=. python analysis/h200/cublaslt_long_k.py OUT.json [--seeds 4] [--budget 300] [--shapes MxNxK,...]
"""

import argparse
import json
import time

import torch

from alibi.controls.fp8_block_schedule import identify_block_schedule
from alibi.kernels.fp8 import cublaslt_version
from alibi.kernels.registry import get_kernel

SHAPES = ([(1, 2048, 7168), (64, 256, 7168)]  # the two shapes an H100 reading left with several candidates
          + [(M, N, 7168) for N in (256, 2048, 7168) for M in (1, 4, 16, 32, 64, 128) if (M, N) != (64, 256)]
          + [(M, 4096, 4096) for M in (1, 16, 64, 256)])

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--seeds", type=int, default=4)
parser.add_argument("--budget", type=float, default=300.0)
parser.add_argument("--shapes", help="MxNxK,... instead of SHAPES")
args = parser.parse_args()
shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
kernel = get_kernel("cublaslt-fp8-block")
start = time.perf_counter()
rows = []
for M, N, K in shapes:
    if time.perf_counter() - start > args.budget:
        print(f"{M}x{N}x{K}: not read (the budget of {args.budget:.0f} s is spent)", flush=True)
        continue
    matched, identical, declared = [], True, None
    for seed in range(args.seeds):
        shape = identify_block_schedule(kernel, [(M, N, K)], seed=seed).shapes[0]
        matched.append(shape.matched)
        identical &= shape.run_to_run_identical
        declared = shape.declared
    common = sorted(set.intersection(*(set(m) for m in matched)))
    rows.append({"M": M, "N": N, "K": K, "declared": declared, "matched_per_seed": matched, "common": common,
                 "run_to_run_identical": identical})
    print(f"{M}x{N}x{K}: declared {declared}; every seed matched by {common}; runs identical {identical}", flush=True)
doc = {"kernel": kernel.name, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
       "cuda": torch.version.cuda, "cublasLt": cublaslt_version(), "seeds": args.seeds, "shapes": rows,
       "seconds": round(time.perf_counter() - start, 1)}
with open(args.out, "w") as f:
    json.dump(doc, f, indent=1)
