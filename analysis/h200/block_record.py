"""Record block kernels' outputs on random block tiles, for fitting their schedules on the CPU
(`analysis/fit_block_schedule.py`).

    PYTHONPATH=. python analysis/h200/block_record.py OUT.safetensors --kernel cublaslt-fp8-block \
        [--shapes MxNxK,...] [--seeds 4]

Each shape and seed: `random_block_tile(M, N, K, seed)` (built on the CPU from its seed, so the fit rebuilds it),
run through the kernel twice in bf16 (the dtype users run; the two runs must agree) and once in fp32 where the
kernel writes it (its raw scaled accumulator: a much sharper reading; a kernel may pick another algorithm for
another output dtype, which the fit tells by checking its answer on the bf16 outputs too). Keys `MxNxK/seed/bf16`,
`MxNxK/seed/fp32`; the metadata names the GPU, the versions and what was refused.
"""

import argparse
import json
import time

import torch
from safetensors.torch import save_file

from alibi.controls.fp8_block_schedule import random_block_tile
from alibi.kernels.fp8 import cublaslt_version
from alibi.kernels.registry import get_kernel

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--kernel", required=True)
parser.add_argument("--shapes", required=True, help="MxNxK,...")
parser.add_argument("--seeds", type=int, default=4)
args = parser.parse_args()
kernel = get_kernel(args.kernel)
ok, why = kernel.available()
if not ok:
    raise SystemExit(f"block_record.py: {args.kernel} is not available here: {why}")
kernel.out_dtypes = (*kernel.out_dtypes, torch.float32)  # this script only: ask for the raw fp32 output too
shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
tensors, notes, start = {}, {}, time.perf_counter()
for M, N, K in shapes:
    for seed in range(args.seeds):
        tile = random_block_tile(M, N, K, seed)
        a_q, s_a, w_q, s_w = (x.cuda() for x in (tile.a_q, tile.s_a, tile.w_q, tile.s_w))
        bf16 = kernel.scaled_mm(a_q, s_a, w_q, s_w, None, torch.bfloat16)
        again = kernel.scaled_mm(a_q, s_a, w_q, s_w, None, torch.bfloat16)
        key = f"{M}x{N}x{K}/{seed}"
        tensors[f"{key}/bf16"] = bf16.cpu().contiguous()
        if not torch.equal(bf16.view(torch.int16), again.view(torch.int16)):
            notes[key] = "two bf16 runs differ"
        try:
            tensors[f"{key}/fp32"] = kernel.scaled_mm(a_q, s_a, w_q, s_w, None, torch.float32).cpu().contiguous()
        except Exception as exc:  # noqa: BLE001 - recorded: the fit then reads bf16 alone
            notes[f"{key}/fp32"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    print(f"{M}x{N}x{K}: {args.seeds} seeds, {time.perf_counter() - start:.1f} s", flush=True)
meta = {"kernel": kernel.name, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "cuda": str(torch.version.cuda), "cublasLt": str(cublaslt_version()), "seeds": str(args.seeds),
        "tiles": "alibi.controls.fp8_block_schedule.random_block_tile(M, N, K, seed)", "notes": json.dumps(notes)}
save_file(tensors, args.out, metadata=meta)
print(json.dumps({**meta, "records": len(tensors)}))
