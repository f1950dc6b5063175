"""Fit a block schedule to a kernel's recorded outputs (analysis/h200/block_record.py): which promotion, block
order and split of K reproduce every output bit of every recorded tile.

    python analysis/fit_block_schedule.py record.safetensors [--out fit.json] [--parts 2..8] [--dtype fp32|bf16]
        [--device cuda]

Each record is a random block tile (rebuilt here from its seed), padded as the kernel pads it, and the kernel's
output. The chains (a fresh chain per 128 k, on the `wgmma` step) are computed once per tile
(`alibi.exact.fp8_block_mma.chain_partials`); every candidate then only promotes them (`promote_chains`):
the six promotions × the chains in ascending or descending k × K unsplit or split into p parts of whole chains
(`SplitK`: as even as that allows, the first parts longer), the parts added in ascending or descending order.
A candidate reproduces a shape when it gives every bit of the fp32 outputs (or, with `--dtype bf16`, of the bf16
ones) of every seed. The model's arithmetic is exact on either device (`--device`: the chains of large shapes
on a GPU). Exit 0 when every shape has at least one candidate.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import safe_open

from alibi.controls.fp8_block_schedule import random_block_tile
from alibi.exact.fp8_block_mma import PROMOTIONS, chain_partials, parse_block_schedule, promote_chains
from alibi.kernels.block_scaled import pad_block_operands
from alibi.kernels.registry import get_kernel


def candidates(parts: range) -> list:
    out = []
    for promotion in PROMOTIONS:
        for order in ("", ":reverse"):
            out.append(parse_block_schedule(f"block128:{promotion}{order}"))
            for p in parts:
                for how in ("", "-desc"):
                    out.append(parse_block_schedule(f"block128:{promotion}{order}:split-{p}{how}"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("record", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--parts", default="2..8", help="split counts tried, lo..hi")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shapes", help="MxNxK,...: fit these recorded shapes, in this order (default: all)")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    args = ap.parse_args()
    lo, hi = (int(x) for x in args.parts.split(".."))
    cands = candidates(range(lo, hi + 1))
    with safe_open(str(args.record), "pt") as f:
        meta = f.metadata()
        keys = sorted({k.rsplit("/", 1)[0] for k in f.keys()})
        records = {k: f.get_tensor(f"{k}/{args.dtype}") for k in keys}
    kernel = get_kernel(meta["kernel"])
    multiples = getattr(kernel, "multiples", (1, 1, 1))
    by_shape: dict[str, list[str]] = defaultdict(list)
    for key in keys:
        by_shape[key.split("/")[0]].append(key)
    order = args.shapes.split(",") if args.shapes else list(by_shape)
    missing = [s for s in order if s not in by_shape]
    if missing:
        raise SystemExit(f"fit_block_schedule.py: --shapes {','.join(missing)} not in {args.record}")
    report = []
    for shape in order:
        seeds = by_shape[shape]
        M, N, K = (int(x) for x in shape.split("x"))
        differing = {c.label: 0 for c in cands}
        for key in seeds:
            tile = random_block_tile(M, N, K, int(key.split("/")[1]))
            p = pad_block_operands(tile.a_q, tile.s_a, tile.w_q, tile.s_w, kernel.layout, m_multiple=multiples[0],
                                   n_multiple=multiples[1], k_multiple=multiples[2])
            Kp = p.a_q.shape[1]
            partials = chain_partials(p.a_q.to(args.device), p.w_q.to(args.device))
            sw = kernel.layout.column_scales(p.s_w.to(args.device, torch.float32), p.w_q.shape[0])
            sa = p.s_a.to(args.device, torch.float32)
            want = records[key].to(args.device).view(torch.int32 if args.dtype == "fp32" else torch.int16)
            for c in cands:
                acc = promote_chains(c, partials, Kp, sa, sw, kernel.layout.block_k)[:M, :N]
                got = acc if args.dtype == "fp32" else acc.to(torch.bfloat16)
                differing[c.label] += int((got.contiguous().view(want.dtype) != want).sum())
        ranked = sorted(differing.items(), key=lambda kv: kv[1])
        fits = [label for label, n in ranked if n == 0]
        report.append({"shape": shape, "padded": [p.a_q.shape[0], p.w_q.shape[0], Kp], "seeds": len(seeds),
                       "elements": len(seeds) * M * N, "fits": fits, "nearest": ranked[:8]})
        print(f"{shape} (padded {p.a_q.shape[0]}x{p.w_q.shape[0]}x{Kp}), {len(seeds)} seeds: "
              f"{fits if fits else 'none; nearest ' + str(ranked[:4])}", flush=True)
        if args.out:  # after every shape: a run cut short keeps what it fitted
            args.out.write_text(json.dumps({"record": str(args.record), "metadata": meta, "dtype": args.dtype,
                                            "candidates": len(cands), "shapes": report}, indent=1))
    return 0 if all(r["fits"] for r in report) else 1


if __name__ == "__main__":
    sys.exit(main())
