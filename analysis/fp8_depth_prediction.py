"""The FP8 depth curve predicted from the kernels' declared schedules, beside the measured one (issue 34, item 4).

The committed sweep `analysis/results/h200/sweeps/depth-fp8-cutlass-cublaslt` measured, on an H200, the fraction
of bf16 outputs where `cutlass-fp8` and `cublaslt-fp8` differ, at K = 512 … 32768 (M = 256, N = 2048, standard
Gaussian values cast to e4m3, per-tensor scales 1, nested prefixes of one draw per seed, 20 seeds): 8.5 % → 61 %,
fitted by 1 − exp(−c·K^α), α ≈ 0.55. Here nothing runs on a GPU: operands of the same distribution are drawn on the
CPU, and the emulator computes what each kernel's *declaration* prescribes — `cutlass-fp8`: one `wgmma` chain over
K (`fast-accum`), `w_then_a+fma`; `cublaslt-fp8`: a chain promoted into fp32 every 128 k (`promote-128`),
`w_then_a+add_before_cast` (with scales 1 and no bias both epilogues are one rounding of the accumulator to bf16).
If the two declarations are the whole story, the predicted fraction per K matches the measured one within the
sampling error, and α fitted to the prediction matches α fitted to the measurement.

Where the divergence comes from, element by element: the two accumulators differ in the low bits only because the
chain is cut to 13 fractional bits of its running sum at every step, whereas the promoted one restarts every 128
products and adds in fp32 (24 bits). The deeper K, the larger the running sum against each new product, the more
bits the chain drops, the more often the bf16 rounding of the two accumulators lands on different sides: every
differing element is an accumulator difference ("accumulation schedule (promotion interval)"), none an epilogue
one. The script also reports each accumulator's error against the exact sum.

    python analysis/fp8_depth_prediction.py [--seeds 5] [--rows 32] [--cols 256] [--out DIR]

Writes DIR/prediction.json (`FP8DepthPrediction`) and DIR/prediction.md; prints the table. CPU-only; the bits do
not depend on the CPU (the emulator is exact), the timing does.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from alibi.exact.emulator import EpilogueModel, apply_epilogue
from alibi.exact.fp8_mma import FAST_ACCUM, PROMOTE_128, accumulate_prefixes
from alibi.exact.numerics import bitwise_equal_mask, ulp_distance
from alibi.sweep.depth_fits import DepthData, fit_depth

REPO = Path(__file__).resolve().parents[1]
MEASURED = REPO / "analysis/results/h200/sweeps/depth-fp8-cutlass-cublaslt/depth.json"
KS = [512, 1024, 2048, 4096, 8192, 16384, 32768]
CUTLASS = (FAST_ACCUM, EpilogueModel("w_then_a", "fma"))
CUBLASLT = (PROMOTE_128, EpilogueModel("w_then_a", "add_before_cast"))


@dataclass(frozen=True)
class KRow:
    """One K: predicted and measured mean fraction of differing outputs, the predicted share of those ≥ 2 ulp apart,
    and each predicted accumulator's mean relative error against the exact sum (|acc − exact| / rms(exact))."""

    K: int
    predicted_frac: float
    predicted_sd: float
    measured_frac: float
    measured_sd: float
    predicted_share_ge2ulp: float
    fast_accum_rel_err: float
    promote_128_rel_err: float


@dataclass(frozen=True)
class FP8DepthPrediction:
    schema: str
    measured_source: str
    operands: str
    seeds: int
    rows: int
    cols: int
    rows_by_k: tuple[KRow, ...]
    alpha_predicted: float | None
    alpha_measured: float | None
    commit: str
    cpu: str
    seconds: float


def _alpha(fits) -> float | None:
    m = next((m for m in fits.models if m.model == "gen_saturation" and m.status == "ok"), None)
    return None if m is None or m.params is None else float(m.params.alpha)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--cols", type=int, default=256)
    p.add_argument("--out", type=Path, default=REPO / "analysis/results/cpu/fp8-depth-prediction")
    args = p.parse_args()
    t0 = time.time()
    measured = json.loads(MEASURED.read_text())
    meas = {K: [r["frac_differ"] for r in measured["records"] if r["K"] == K] for K in KS}
    frac: dict[int, list[float]] = {K: [] for K in KS}
    ge2: dict[int, list[float]] = {K: [] for K in KS}
    err: dict[str, dict[int, list[float]]] = {"fast": {K: [] for K in KS}, "promote": {K: [] for K in KS}}
    rows = []
    one = torch.ones(1)
    for seed in range(args.seeds):
        g = torch.Generator().manual_seed(seed)
        a = torch.randn((args.rows, max(KS)), generator=g).to(torch.float8_e4m3fn)
        w = torch.randn((args.cols, max(KS)), generator=g).to(torch.float8_e4m3fn)
        accs = {name: accumulate_prefixes(s, a, w, KS) for name, (s, _) in (("fast", CUTLASS), ("promote", CUBLASLT))}
        for K in KS:
            out_c = apply_epilogue(CUTLASS[1], accs["fast"][K], one, one, None, torch.bfloat16)
            out_b = apply_epilogue(CUBLASLT[1], accs["promote"][K], one, one, None, torch.bfloat16)
            differ = ~bitwise_equal_mask(out_c, out_b)
            frac[K].append(float(differ.float().mean()))
            ulp = ulp_distance(out_c, out_b)
            ge2[K].append(float((ulp[differ] >= 2).float().mean()) if bool(differ.any()) else 0.0)
            exact = a[:, :K].double() @ w[:, :K].double().T
            rms = float(exact.pow(2).mean().sqrt())
            for name in ("fast", "promote"):
                err[name][K].append(float((accs[name][K].double() - exact).abs().mean()) / rms)
            rows.append((seed, K, frac[K][-1]))
    table = tuple(KRow(K, float(np.mean(frac[K])), float(np.std(frac[K])), float(np.mean(meas[K])),
                       float(np.std(meas[K])), float(np.mean(ge2[K])), float(np.mean(err["fast"][K])),
                       float(np.mean(err["promote"][K]))) for K in KS)
    pred_fit = fit_depth(DepthData(tuple(r[0] for r in rows), tuple(r[1] for r in rows), tuple(r[2] for r in rows)),
                         source="prediction", label="predicted", bootstrap=200)
    meas_rows = [(r["seed"], r["K"], r["frac_differ"]) for r in measured["records"]]
    meas_fit = fit_depth(DepthData(*map(tuple, zip(*meas_rows))), source=str(MEASURED), label="measured",
                         bootstrap=200)
    recorded = REPO / "SOURCE_COMMIT"  # a `git archive` run (clean tree) names its commit there
    commit = recorded.read_text().strip() if recorded.is_file() else subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    result = FP8DepthPrediction(
        "alibi.fp8-depth-prediction/v1", str(MEASURED.relative_to(REPO)),
        f"standard Gaussian values cast to e4m3 on the CPU (torch.Generator seeds 0..{args.seeds - 1}), "
        f"per-tensor scales 1, nested prefixes of one K={max(KS)} draw per seed, M={args.rows}, N={args.cols}",
        args.seeds, args.rows, args.cols, table, _alpha(pred_fit), _alpha(meas_fit), commit,
        f"{platform.processor() or platform.machine()}", round(time.time() - t0, 1))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prediction.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
    (args.out / "SOURCE_COMMIT").write_text(commit + "\n")
    lines = ["| K | predicted fraction differing | measured (H200) | predicted share ≥ 2 ulp | fast-accum rel. error | "
             "promote-128 rel. error |", "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r.K} | {r.predicted_frac:.4f} ± {r.predicted_sd:.4f} | {r.measured_frac:.4f} ± {r.measured_sd:.4f} | "
              f"{r.predicted_share_ge2ulp:.3f} | {r.fast_accum_rel_err:.2e} | {r.promote_128_rel_err:.2e} |" for r in table]
    lines += ["", f"α (1 − exp(−c·K^α)): predicted {result.alpha_predicted}, measured {result.alpha_measured}"]
    (args.out / "prediction.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
