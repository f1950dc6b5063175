#!/usr/bin/env bash
# Issue 10 on the H200: INT8-versus-FP8 divergence against the reduction depth K, the rows sweep (decode
# regime at layer level), the fits and the figures. One call, from the repository root:
#
#   OUT=/path/to/results bash analysis/h200/sweeps.sh
#
# Expects the CUTLASS headers and prebuilt kernel cache exported by the lead's wrapper as
# ALIBI_CUTLASS_INCLUDE and ALIBI_CACHE; if they are unset and gpu_payload/ holds the two tarballs,
# they are unpacked into /tmp/alibi (said in the log). Expected runtime: about 3 minutes; each step
# has a time limit and the limits add up to 6.5 minutes.
#
# Steps (wall time of each printed as it ends, and again in the table at the end):
#   gpu-tests          tests/sweep/test_gpu_sweeps.py (operands on CUDA, the GPU fp64 reference, kernel pairs)
#   depth-fp8-cutlass  cutlass-fp8 vs cublaslt-fp8, 20 seeds, K = 512…32768, M = 256, N = 2048, nested prefixes
#   depth-fp8-triton   triton-fp8  vs cublaslt-fp8, same grid
#   depth-int8         cutlass vs triton (int8), same grid
#   rows-int8          cutlass vs triton, M = 1,4,16,64,256,512,4096, K = N = 4096, ≥ 1e8 elements per M
#   fits               alibi analyze depth on the three depth sweeps and the rows sweep (B = 1000)
# Shapes: every K and N here is a multiple of 16, so no kernel pads (alibi/kernels/fp8.py, cutlass.py).
#
# Results: $OUT/sweeps_h200.tgz (one folder per step, each with its manifest; logs; env.txt; pytest
# junit) and $OUT/sweeps_summary.txt, whose table is also printed last.
set -u
: "${OUT:?set OUT to the results folder}"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
R=$OUT/sweeps
mkdir -p "$R"
if [ -z "${ALIBI_CUTLASS_INCLUDE:-}" ] && [ -f gpu_payload/cutlass_include.tar.xz ]; then
  W=/tmp/alibi; mkdir -p "$W"
  [ -d "$W/cutlass_include" ] || tar -C "$W" -xJf gpu_payload/cutlass_include.tar.xz
  [ -d "$W/alibi_cache" ] || tar -C "$W" -xJf gpu_payload/alibi_cache.tar.xz
  export ALIBI_CUTLASS_INCLUDE=$W/cutlass_include ALIBI_CACHE=$W/alibi_cache
  . analysis/h200/kernel_pins.sh
  echo "CUTLASS headers and kernel cache unpacked from gpu_payload/ into $W"
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python -c "import torch, triton, scipy, matplotlib; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'scipy', scipy.__version__, 'matplotlib', matplotlib.__version__)"
  lscpu | grep -E 'Model name|^CPU\(s\)'; git rev-parse HEAD; } > "$R/env.txt" 2>&1
cat "$R/env.txt"

T0=$(date +%s)
STEPS=()
# step NAME LIMIT_S CMD...: CMD under a time limit, its output in $R/NAME.txt, rc and wall time kept.
step() {
  local name=$1 limit=$2; shift 2
  local s; s=$(date +%s.%N)
  timeout "$limit" "$@" > "$R/$name.txt" 2>&1
  local rc=$?
  local dt; dt=$(python -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$s" "$(date +%s.%N)")
  STEPS+=("$(printf '%-18s rc=%-3s %6ss' "$name" "$rc" "$dt")")
  echo "[$(( $(date +%s) - T0 ))s] $name rc=$rc ${dt}s"; tail -3 "$R/$name.txt"
}

GRID=(--K 512,1024,2048,4096,8192,16384,32768 --M 256 --N 2048 --seeds 20 --nested-prefix)
step gpu-tests 60 python -m pytest -q -p no:cacheprovider -rfEs --junitxml="$R/pytest-gpu.xml" tests/sweep/test_gpu_sweeps.py
step depth-fp8-cutlass 55 python -m alibi sweep depth --kernel-a cutlass-fp8 --kernel-b cublaslt-fp8 --format fp8_e4m3 "${GRID[@]}" --out "$R/depth-fp8-cutlass-cublaslt"
step depth-fp8-triton 55 python -m alibi sweep depth --kernel-a triton-fp8 --kernel-b cublaslt-fp8 --format fp8_e4m3 "${GRID[@]}" --out "$R/depth-fp8-triton-cublaslt"
step depth-int8 55 python -m alibi sweep depth --kernel-a cutlass --kernel-b triton --format int8 "${GRID[@]}" --out "$R/depth-int8-cutlass-triton"
step rows-int8 120 python -m alibi sweep rows --kernel-a cutlass --kernel-b triton --M 1,4,16,64,256,512,4096 --K 4096 --N 4096 --elements 1e8 --out "$R/rows-int8-cutlass-triton"
FITS_IN=()
for d in depth-fp8-cutlass-cublaslt depth-fp8-triton-cublaslt depth-int8-cutlass-triton; do
  [ -f "$R/$d/depth.json" ] && FITS_IN+=("$R/$d")
done
ROWS_IN=()
[ -f "$R/rows-int8-cutlass-triton/rows.json" ] && ROWS_IN=(--rows "$R/rows-int8-cutlass-triton")
if [ ${#FITS_IN[@]} -gt 0 ]; then
  step fits 45 python -m alibi analyze depth "${FITS_IN[@]}" "${ROWS_IN[@]}" --bootstrap 1000 --bootstrap-seed 0 --out "$R/fits"
else
  STEPS+=("$(printf '%-18s %s' fits 'skipped: no depth sweep completed')")
fi

python - "$R" > "$OUT/sweeps_summary.txt" 2>&1 <<'PY'
"""The short table: per sweep its wall time and where it went, the fractions at the ends of K, the fit."""
import sys
from pathlib import Path

from alibi.sweep.analysis import DepthAnalysis
from alibi.sweep.records import read_depth_sweep, read_rows_sweep

R = Path(sys.argv[1])
print(f"{'sweep':<28} {'wall s':>7} {'kernels s':>9} {'ref s':>6} {'outside kern':>12} {'outside k+ref':>13}  "
      "frac K=512 → 32768 (≥2ulp share at 32768)")
for d in ("depth-fp8-cutlass-cublaslt", "depth-fp8-triton-cublaslt", "depth-int8-cutlass-triton"):
    if not (R / d / "depth.json").exists():
        print(f"{d:<28} missing")
        continue
    s = read_depth_sweep(R / d)
    t = s.timing
    lo = [r for r in s.records if r.K == s.Ks[0]]
    hi = [r for r in s.records if r.K == s.Ks[-1]]
    frac = lambda rs: sum(r.n_differing for r in rs) / sum(r.n for r in rs)
    far = sum(r.n_differing_far for r in hi)
    ge2 = sum(r.n_ge2ulp for r in hi) / far if far else float("nan")
    print(f"{d:<28} {t.total:7.1f} {t.kernel_a + t.kernel_b:9.2f} {t.reference:6.2f} {t.share_outside_kernels:12.1%} "
          f"{t.share_outside_kernels_and_reference:13.1%}  {frac(lo):.4g} → {frac(hi):.4g} ({ge2:.3f})")
if (R / "rows-int8-cutlass-triton" / "rows.json").exists():
    rows = read_rows_sweep(R / "rows-int8-cutlass-triton")
    print(f"\nrows sweep {rows.label}: {rows.timing.total:.1f} s, {rows.timing.share_outside_kernels:.1%} outside kernels")
    for p in rows.points:
        print(f"  M={p.M:>5}: {p.rate.events:>5} of {p.elements} ({p.rate.rate * 1e6:.3f} ppm, "
              f"95% CI {p.rate.low * 1e6:.3f}–{p.rate.high * 1e6:.3f}), max ulp {p.max_ulp}")
    h, tr = rows.homogeneity, rows.trend
    g = lambda x: "–" if x is None else f"{x:.3g}"
    print(f"  one rate for all M ({h.status}): χ² p = {g(h.p_chi2)}, exact p = {g(h.p_exact)}; rate change from "
          f"M={tr.x_min:g} to {tr.x_max:g} compatible at 90%: ×{g(tr.factor_low)} … ×{g(tr.factor_high)}; "
          f"largest pairwise ratio compatible ×{g(rows.ratio.max_ratio)} ({rows.ratio.status})")
if (R / "fits" / "fits.json").exists():
    a = DepthAnalysis.from_json((R / "fits" / "fits.json").read_text(), "fits.json")
    print()
    for f in a.analyses:
        print(f.statement)
PY
cat "$OUT/sweeps_summary.txt"
cp "$OUT/sweeps_summary.txt" "$R/"
tar -C "$OUT" -czf "$OUT/sweeps_h200.tgz" sweeps && rm -rf "$R"
echo
echo "steps (total $(( $(date +%s) - T0 ))s):"
printf '  %s\n' "${STEPS[@]}"
