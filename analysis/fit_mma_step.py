"""Fit a tensor-core step model to recorded MMA chains (analysis/h200/fp8_block_measure.py, part `mma16`).

    python analysis/fit_mma_step.py mma16.safetensors [--out fit.json]

Every case of the file is `out = C + a·bᵀ` chained over K on the GPU (a, b e4m3 [16, K], C fp32 [16, 16]). Each
candidate `StepModel` (k; align_bits; the two cuts; whether C joins the alignment; `f16_operands`: whether the
operands' exponents are their values', as after the conversion to f16 that an f16 `mma.sync` sees; `k_order`: which
products one instruction takes) is run over every case, and the candidates that reproduce every output bit are
printed, with the differing-output counts of the nearest others (a candidate that fails on the shortest chains is
counted there only). Nothing is assumed about which instruction ran: the file's metadata names the PTX.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors import safe_open

from alibi.exact.fp8_mma import CUTS, K_ORDERS, Fp8Operand, StepModel, decode, dot_steps


def load(path: Path) -> dict[int, tuple[torch.Tensor, ...]]:
    """Cases grouped by K: a, b (e4m3 [n, 16, K]), c, out (fp32 [n, 16, 16])."""
    groups: dict[int, list] = {}
    with safe_open(str(path), "pt") as f:
        tags = sorted({k.rsplit("/", 1)[0] for k in f.keys()})
        for tag in tags:
            a = f.get_tensor(f"{tag}/a").view(torch.float8_e4m3fn)
            groups.setdefault(a.shape[1], []).append(
                (a, f.get_tensor(f"{tag}/b").view(torch.float8_e4m3fn), f.get_tensor(f"{tag}/c"),
                 f.get_tensor(f"{tag}/out")))
    return {K: tuple(torch.stack(x) for x in zip(*cases)) for K, cases in groups.items()}


def differing(model: StepModel, groups) -> int:
    n = 0
    for K, (a, b, c, out) in groups.items():
        if K % model.period:
            return -1
        da, db = decode(a), decode(b)
        # rows of a against rows of b: [n, 16, 1, K] x [n, 1, 16, K]
        A = Fp8Operand(da.value[:, :, None], da.exponent[:, :, None], da.zero[:, :, None])
        B = Fp8Operand(db.value[:, None], db.exponent[:, None], db.zero[:, None])
        got = dot_steps(A, B, c, model)
        n += int((got.view(torch.int32) != out.view(torch.int32)).sum())
    return n


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("recorded", type=Path)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    groups = load(args.recorded)
    total = sum(int(g[3].numel()) for g in groups.values())
    # every candidate on the shortest chains first; only those that reproduce all of them on the rest
    shortest = {min(groups): groups[min(groups)]}
    results = []
    for k, align, acut, rcut, cjoin, f16, order in itertools.product((8, 16, 32), range(23, 31), CUTS,
                                                                      ("toward_zero", "nearest"), (True, False),
                                                                      (True, False), K_ORDERS):
        model = StepModel(k=k, align_bits=align, align_cut=acut, result_bits=23, result_cut=rcut,
                          c_joins_alignment=cjoin, f16_operands=f16, k_order=order)
        n = differing(model, shortest)
        if n == 0 and len(groups) > 1:
            n = differing(model, groups)
        if n >= 0:
            results.append((n, model))
    results.sort(key=lambda r: r[0])
    for n, model in results[:15]:
        print(f"{n:8d} differ: {model.name}")
    if args.out:
        args.out.write_text(json.dumps([{"differing": n, "of": total, "model": asdict(m)} for n, m in results],
                                       indent=1))
    return 0 if results and results[0][0] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
