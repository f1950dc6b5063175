#!/usr/bin/env bash
# Positive controls on the H200 (issue 11): the detection matrix of every mutant against the `cutlass`
# and `triton` bases (the exposing set, plus the default preset as the benchmark; triton with its native
# in-kernel variants too), and `alibi boundary` for every int8 kernel the machine can run.
#
#   bash analysis/h200/positive_controls.sh        # from the repository root, gpu_payload/ carried
#
# Needs the CUTLASS headers and the prebuilt kernel cache in gpu_payload/ (as default_conform.sh).
# Each step has a time limit (560 s in all) so the whole script stays within one 10-minute call;
# expected 3-6 min. A step cut short is named in the summary. Results: $OUT/positive_controls.tgz
# (every folder and log), $OUT/summary.txt (the table printed last) and $OUT/env.txt.
set -u
W=/tmp/alibi
mkdir -p "$W"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
[ -d "$W/cutlass_include" ] || tar -C "$W" -xJf gpu_payload/cutlass_include.tar.xz
[ -d "$W/alibi_cache" ] || tar -C "$W" -xJf gpu_payload/alibi_cache.tar.xz
export ALIBI_CUTLASS_INCLUDE=$W/cutlass_include ALIBI_CACHE=$W/alibi_cache
. analysis/h200/kernel_pins.sh
R=$OUT/positive_controls
mkdir -p "$R"
{ nvidia-smi --query-gpu=name,driver_version --format=csv; nvcc --version | tail -2
  python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  lscpu | grep -E 'Model name|^CPU\(s\)'; git rev-parse HEAD; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

T0=$(date +%s)
step() {  # step LABEL LIMIT_S COMMAND...: run with a time limit, keep stdout/stderr, record rc and seconds
  local label=$1 limit=$2; shift 2
  local t=$(date +%s)
  timeout "$limit" "$@" > "$R/$label.txt" 2> "$R/$label.log"
  local rc=$?
  echo "$label rc=$rc $(( $(date +%s) - t ))s" | tee -a "$R/times.txt"
  tail -3 "$R/$label.txt"
}

step mutants-cutlass 130 python -m alibi mutants --base cutlass --out "$R/mutants-cutlass"
step mutants-triton 150 python -m alibi mutants --base triton --native --out "$R/mutants-triton"
step boundary 60 python -m alibi boundary --out "$R/boundary.json"
step mutants-cutlass-default 110 python -m alibi mutants --base cutlass --synthetic default --out "$R/mutants-cutlass-default"
step mutants-triton-default 110 python -m alibi mutants --base triton --synthetic default --out "$R/mutants-triton-default"
echo "total $(( $(date +%s) - T0 ))s" | tee -a "$R/times.txt"

python - "$R" > "$OUT/summary.txt" <<'PY'
"""The short table: per matrix, rows, null silent, every observable row detected, blind spots, time; per kernel, facts held."""
import sys
from pathlib import Path

from alibi.controls.boundary import BoundaryReport
from alibi.controls.mutant_matrix import DetectionMatrix

R = Path(sys.argv[1])
times = dict(line.split(" ", 1) for line in (R / "times.txt").read_text().splitlines())
print(f"{'matrix':<26} {'rows':>4}  {'null silent':>11}  {'all detected':>12}  {'time':>14}  undetected / seven-check detection of F1-F5")
for label in ("mutants-cutlass", "mutants-triton", "mutants-cutlass-default", "mutants-triton-default"):
    path = R / label / "detection.json"
    if not path.is_file():
        print(f"{label:<26} not produced ({times.get(label, 'not run')})")
        continue
    m = DetectionMatrix.from_json(path.read_text())
    seven = {c.fault: f"{c.units_detected_seven}/{c.units_observable}" for c in m.classes if c.implementation == "wrapper"}
    f15 = " ".join(f"{f}:{seven.get(f, '-')}" for f in ("scale-bf16", "double-round", "reassociate", "truncate-cast",
                                                         "scale-in-reduction"))
    print(f"{label:<26} {len(m.faults):>4}  {'yes' if m.null_silent else 'NO':>11}  {'yes' if m.all_detected else 'NO':>12}  "
          f"{times.get(label, ''):>14}  {', '.join(m.undetected_classes) or 'none'} / {f15}")
path = R / "boundary.json"
if path.is_file():
    b = BoundaryReport.from_json(path.read_text())
    print(f"\nboundary ({times.get('boundary', '')}): {'all facts hold' if b.all_hold else 'SOME FACT FAILS'}")
    for k in b.kernels:
        if not k.available:
            print(f"  {k.kernel:<14} not available: {k.how[:90]}")
            continue
        failed = [f"{f.group}:{f.fact}" for f in k.facts if not f.holds]
        print(f"  {k.kernel:<14} {sum(f.holds for f in k.facts)}/{len(k.facts)} hold" + (f"; FAILED {', '.join(failed)}" if failed else ""))
else:
    print(f"\nboundary not produced ({times.get('boundary', 'not run')})")
PY
tar -C "$OUT" -czf "$OUT/positive_controls.tgz" positive_controls && rm -rf "$R"
cat "$OUT/summary.txt"
