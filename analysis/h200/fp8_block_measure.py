"""On the GPU: every block-scaled kernel's schedule read by probe (issue 35), and small recorded outputs for the CPU
tests.

    python analysis/h200/fp8_block_measure.py OUT [--parts identify,record] [--kernels a,b,...] [--shapes MxNxK,...]

Writes OUT/identify.json (per kernel: the association probe and, per shape, the declared schedule, whether it
matched, two runs identical or not, every candidate's differing elements), OUT/recorded-block.safetensors (block
tiles, the probe included, and each kernel's outputs), OUT/summary.txt. A kernel that raises is reported and the
rest go on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from alibi.controls.fp8_block_schedule import identify_block_schedule, random_block_tile
from alibi.io.typed import to_plain
from alibi.kernels.registry import get_kernel
from alibi.tiles.block_probe import association_probe_tile

from fp8_measure import environment  # the sibling script (this folder is on sys.path when a script here runs)

KERNELS = ("cublaslt-fp8-block", "vllm-triton-fp8-block", "vllm-cutlass-fp8-block", "fbgemm-fp8-block",
           "torchao-fp8-block")
# SmolLM2-135M's layers at decode and prefill sizes (K = 576 and N = 192 ragged), DeepSeek-V3-like layers
# (K = 7168, N = 2048 / 576 / 7168), and k > 3n (where older vLLM sources chose stream-K)
SHAPES = ((1, 576, 1536), (16, 192, 576), (256, 1536, 576), (256, 576, 1536), (1, 2048, 7168), (64, 2048, 7168),
          (128, 576, 7168), (32, 7168, 2048), (64, 256, 7168))
RECORD_SHAPES = ((1, 256, 640), (16, 192, 576), (64, 256, 1024), (256, 128, 384))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--parts", default="identify,record")
    p.add_argument("--kernels", default=",".join(KERNELS))
    p.add_argument("--shapes", default="", help="MxNxK,... (default: SHAPES)")
    args = p.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    summary = open(out / "summary.txt", "a")

    def say(line: str) -> None:
        print(line, flush=True)
        summary.write(line + "\n")
        summary.flush()

    say(f"environment: {json.dumps(environment())}")
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s] or list(SHAPES)
    kernels = {}
    for n in (n for n in args.kernels.split(",") if n):
        k = get_kernel(n)
        ok, why = k.available()
        say(f"kernel {n}: {'available' if ok else 'UNAVAILABLE'}: {why}")
        if ok:
            kernels[n] = k
    if "identify" in args.parts:
        doc = {}
        for n, k in kernels.items():
            t0 = time.time()
            try:
                found = identify_block_schedule(k, shapes)
            except Exception as exc:  # noqa: BLE001 - one kernel's failure is reported, the rest go on
                say(f"identify {n}: FAILED {type(exc).__name__}: {str(exc)[:300]}")
                continue
            doc[n] = {**to_plain(found), "ok": found.ok, "evidence": to_plain(k.evidence())}
            pr = found.probe
            read = f"matches {pr.matched}" if pr.applicable else pr.reason[:160]
            say(f"identify {n}: ok {found.ok}; probe {read} (declared {pr.declared}: {pr.declared_matches}); "
                f"{time.time() - t0:.1f} s")
            for r in found.shapes:
                say(f"identify {n} {r.M}x{r.N}x{r.K}: declared {r.declared} matches {r.declared_matches}; runs "
                    f"identical {r.run_to_run_identical}; matched {r.matched[:5]}")
            (out / "identify.json").write_text(json.dumps(doc, indent=1))
    if "record" in args.parts:
        from safetensors.torch import save_file
        tensors = {}
        tiles = [random_block_tile(M, N, K, seed=200 + i, activation_rows=256 if M > 1 else 1)
                 for i, (M, N, K) in enumerate(RECORD_SHAPES)] + [association_probe_tile(0)]
        for t in tiles:
            tag = t.name
            tensors[f"{tag}/a_q"], tensors[f"{tag}/w_q"] = t.a_q.view(torch.uint8), t.w_q.view(torch.uint8)
            tensors[f"{tag}/s_a"], tensors[f"{tag}/s_w"] = t.s_a, t.s_w
            for n, k in kernels.items():
                try:
                    tensors[f"{tag}/{n}/out"] = k.run(t).out
                except Exception as exc:  # noqa: BLE001
                    say(f"record {n} {tag}: {type(exc).__name__}: {str(exc)[:200]}")
        save_file({k: v.contiguous() for k, v in tensors.items()}, out / "recorded-block.safetensors",
                  metadata={"kernels": ",".join(kernels), "gpu": torch.cuda.get_device_name(),
                            "scale_layout": "block:1x128:128x128"})
        say(f"record: {len(tensors)} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
