"""On the GPU: every fp8 kernel's schedule read by probe at the matrix's shapes, small recorded outputs for the CPU
tests, and the committed depth sweep re-read with the model (issue 34). The step itself: `alibi probe fp8-mma`.

    python analysis/h200/fp8_measure.py OUT [--parts identify,record,depth] [--kernels a,b,...] [--identify a,b,...]

Writes OUT/identify.json (per kernel and shape: boundaries read, declared schedule,
matching candidates), OUT/recorded.safetensors (random tiles and each kernel's outputs and exposed accumulators),
OUT/depth.json, OUT/summary.txt.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from alibi.controls.fp8_schedule import identify_schedule, random_fp8_tile
from alibi.io.typed import to_plain
from alibi.kernels.fp8 import cublaslt_version
from alibi.kernels.registry import get_kernel

KERNELS = ("cutlass-fp8", "triton-fp8", "cublaslt-fp8", "cublaslt-fp8-tensorwise", "vllm-cutlass-fp8", "fbgemm-fp8-row")
SMOLLM2 = ((576, 576), (192, 576), (1536, 576), (576, 1536))
SHAPES = ([(256, N, K) for N, K in SMOLLM2] + [(32, 576, 1536), (1, 576, 1536), (16, 256, 8192), (64, 128, 16384),
          (128, 1024, 4096)])
RECORD_SHAPES = ((1, 64, 256), (16, 96, 544), (64, 128, 1024), (128, 64, 2048))


def environment() -> dict:
    import triton
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "triton": triton.__version__, "cublasLt": cublaslt_version()}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--parts", default="identify,record,depth")
    p.add_argument("--kernels", default=",".join(KERNELS))
    p.add_argument("--identify", default="", help="the kernels whose schedule is read (default: every kernel)")
    args = p.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    summary = open(out / "summary.txt", "a")

    def say(line: str) -> None:
        print(line, flush=True)
        summary.write(line + "\n")
        summary.flush()

    env = environment()
    say(f"environment: {json.dumps(env)}")
    names = [n for n in args.kernels.split(",") if n]
    kernels = {}
    for n in names:
        k = get_kernel(n)
        ok, why = k.available()
        say(f"kernel {n}: {'available' if ok else 'UNAVAILABLE'}: {why}")
        if ok:
            kernels[n] = k
    if "identify" in parts:
        t0 = time.time()
        doc = {}
        chosen = [n for n in args.identify.split(",") if n] or list(kernels)
        for n, k in ((n, k) for n, k in kernels.items() if n in chosen):
            rows = []
            for shape in SHAPES:
                try:
                    r = identify_schedule(k, [shape])[0]
                except Exception as exc:  # noqa: BLE001
                    say(f"identify {n} {shape}: FAILED {type(exc).__name__}: {str(exc)[:300]}")
                    continue
                rows.append(to_plain(r))
                say(f"identify {n} {shape}: boundaries {list(r.reading.boundaries)[:12]}"
                    f"{'...' if len(r.reading.boundaries) > 12 else ''} ({len(r.reading.boundaries)}) partial "
                    f"{list(r.reading.partial)[:6]}; declared {r.declared} matches {r.declared_matches}; "
                    f"matched {r.matched[:4]}; "
                    + "; ".join(f"{c.schedule}: {c.n_differing}" for c in r.candidates if c.schedule == r.declared))
            doc[n] = rows
        (out / "identify.json").write_text(json.dumps(doc, indent=1))
        say(f"identify: {time.time() - t0:.1f} s")
    if "record" in parts:
        from safetensors.torch import save_file
        tensors = {}
        for i, (M, N, K) in enumerate(RECORD_SHAPES):
            for dtype in (torch.bfloat16, torch.float16):
                t = random_fp8_tile(M, N, K, seed=100 + i, out_dtype=dtype)
                tag = f"{M}x{N}x{K}-{str(dtype)[6:]}"
                tensors[f"{tag}/a_q"] = t.a_q.view(torch.uint8)
                tensors[f"{tag}/w_q"] = t.w_q.view(torch.uint8)
                tensors[f"{tag}/s_a"], tensors[f"{tag}/s_w"] = t.s_a, t.s_w
                for n, k in kernels.items():
                    try:
                        got = k.run(t, accumulator=True)
                    except Exception as exc:  # noqa: BLE001
                        say(f"record {n} {tag}: {type(exc).__name__}: {str(exc)[:200]}")
                        continue
                    tensors[f"{tag}/{n}/out"] = got.out
                    if got.acc is not None:
                        tensors[f"{tag}/{n}/acc"] = got.acc
        save_file({k: v.contiguous() for k, v in tensors.items()}, out / "recorded.safetensors")
        say(f"record: {len(tensors)} tensors")
    if "depth" in parts:
        depth(out, kernels, say)
    return 0


DEPTH_PAIRS = (("cutlass-fp8", "cublaslt-fp8"), ("triton-fp8", "cublaslt-fp8"), ("cutlass-fp8", "triton-fp8"))
DEPTH_KS = [512, 1024, 2048, 4096, 8192, 16384, 32768]
DEPTH_SEEDS = (0,)
DEPTH_M, DEPTH_N = 256, 2048
DEPTH_ROWS = 64  # rows compared (the kernels run the sweep's full M = 256: their schedule depends on the shape)


def depth(out: Path, kernels: dict, say) -> None:
    """The committed fp8 depth sweeps (M=256, N=2048, nested prefixes of one K=32768 draw, standard Gaussian values
    in e4m3, per-tensor scales 1) re-read with the model: per K, the elements where the two kernels differ as
    measured, as predicted from their declared schedules and epilogues, and how the two sets relate."""
    from alibi.exact.emulator import apply_epilogue
    from alibi.exact.fp8_mma import accumulate, accumulate_prefixes
    from alibi.exact.numerics import bitwise_equal_mask
    from alibi.sweep.operands import OperandSpec, draw
    from alibi.tiles.tile import Tile

    t0 = time.time()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    spec = OperandSpec("fp8_e4m3", DEPTH_M, DEPTH_N, "tensor")
    rows = []
    for seed in DEPTH_SEEDS:
        full = draw(spec, max(DEPTH_KS), (seed,), dev)
        preds = {}
        for name in {n for pair in DEPTH_PAIRS for n in pair if n in kernels}:
            k = kernels[name]
            sched_by_k = {K: k.schedule_at(spec.M, spec.N, K) for K in DEPTH_KS}
            for sched in {s for s in sched_by_k.values() if s is not None}:
                Ks = [K for K in DEPTH_KS if sched_by_k[K] == sched]
                accs = accumulate_prefixes(sched, full.a_q[:DEPTH_ROWS], full.w_q, Ks) if sched.split_k is None else \
                    {K: accumulate(sched, full.a_q[:DEPTH_ROWS, :K], full.w_q[:, :K]) for K in Ks}
                for K, acc in accs.items():
                    one = torch.ones(1, device=dev)
                    preds[(name, K)] = apply_epilogue(k.epilogue_at(spec.M), acc, one, one, None, torch.bfloat16)
        for K in DEPTH_KS:
            ops = full.prefix(K)
            tile = Tile(f"depth-{seed}-{K}", ops.a_q, ops.s_a, ops.w_q, ops.s_w, None, torch.bfloat16)
            outs = {n: k.run(tile, on_device=True).out[:DEPTH_ROWS] for n, k in kernels.items()
                    if any(n in pair for pair in DEPTH_PAIRS)}
            for a, b in DEPTH_PAIRS:
                if a not in outs or b not in outs:
                    continue
                measured = ~bitwise_equal_mask(outs[a], outs[b])
                row = {"seed": seed, "K": K, "kernel_a": a, "kernel_b": b, "n": measured.numel(),
                       "measured": int(measured.sum())}
                if (a, K) in preds and (b, K) in preds:
                    predicted = ~bitwise_equal_mask(preds[(a, K)], preds[(b, K)])
                    row.update(predicted=int(predicted.sum()), unpredicted=int((measured & ~predicted).sum()),
                               predicted_not_observed=int((predicted & ~measured).sum()),
                               a_equals_model=int((~bitwise_equal_mask(outs[a], preds[(a, K)])).sum()) == 0,
                               b_equals_model=int((~bitwise_equal_mask(outs[b], preds[(b, K)])).sum()) == 0)
                rows.append(row)
                say(f"depth seed {seed} K={K} {a} vs {b}: measured {row['measured']}, predicted "
                    f"{row.get('predicted')}, unpredicted {row.get('unpredicted')}, missing "
                    f"{row.get('predicted_not_observed')}")
    (out / "depth.json").write_text(json.dumps({"spec": "M=256 N=2048 (first 64 rows compared), e4m3 standard "
                                                "Gaussian, per-tensor scales 1, nested prefixes of one K=32768 "
                                                "draw per seed (alibi.sweep.operands.draw on cuda)",
                                                "rows": rows}, indent=1))
    say(f"depth: {time.time() - t0:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
