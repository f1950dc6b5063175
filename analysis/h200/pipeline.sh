#!/usr/bin/env bash
# Issue 12 on the H200: the typed pipeline's throughput (`alibi bench conform`, before/after), cutlass
# against triton on tiles with bias and fp16 output with every difference predicted, and the GPU tests.
#
#   bash analysis/h200/pipeline.sh [CAPTURE_DIR]     # the SmolLM2 W8A8 capture (210 tiles, M = 512), optional
#
# Runs from the repository root with the CUTLASS headers and kernel cache exported (setup.sh).
# Everything goes to $OUT/pipeline, packed into $OUT/pipeline.tgz, plus $OUT/pipeline-summary.txt.
set -u
: "${OUT:?}"
CAP=${1:-}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/pipeline
W=/tmp/alibi-pipeline
mkdir -p "$R" "$W"
T0=$(date +%s)
step() {  # step NAME LIMIT CMD...: log to $R/NAME.txt
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" > "$R/$name.txt" 2>&1
  local rc=$?
  echo "[$(( $(date +%s) - T0 ))s] $name rc=$rc" | tee -a "$R/steps.txt"
  tail -6 "$R/$name.txt"
}
step bench-qwen3-1.7b-m512 240 python -m alibi bench conform --kernel-a cutlass --kernel-b triton --synthetic qwen3-1.7b \
  --rows 512 --repeats 3 --check-devices cuda,cpu --quiet --out "$R/bench-conform-qwen3-1.7b-m512.json"
if [ -n "$CAP" ] && [ -d "$CAP" ]; then
  step bench-smollm2-capture 240 python -m alibi bench conform --kernel-a cutlass --kernel-b triton --tiles "$CAP" \
    --repeats 2 --check-devices cuda,cpu --quiet --out "$R/bench-conform-smollm2-capture.json"
  step conform-capture 180 python -m alibi conform --kernel-a cutlass --kernel-b triton --tiles "$CAP" --quiet \
    --out "$R/conform-capture-cutlass-vs-triton"
fi
# Tiles with bias, bf16 and fp16 output (the int8 set of analysis/h200/vllm.sh)
step operands 120 python - "$W/int8" <<'PY'
import sys
from pathlib import Path

import torch

from alibi.tiles.synthetic import synthetic_tiles
from alibi.tiles.tile import save_tile

root = Path(sys.argv[1]); root.mkdir(parents=True, exist_ok=True)
for f in root.glob("*.safetensors"):
    f.unlink()
n = 0
for t in synthetic_tiles("smollm2-135m-bias", seed=0):
    save_tile(t.replace(name=f"m32-{t.name}"), root / f"m32-{t.name}.safetensors"); n += 1
for M in (1, 16, 64, 65, 512):
    for t in synthetic_tiles("smollm2-135m-bias", seed=M, M=M):
        if t.meta["kind"] not in ("q_proj", "down_proj"):
            continue
        t = t.replace(name=f"m{M}-{t.name}")
        h = t.replace(out_dtype=torch.float16, bias=t.bias.to(torch.float16), name=f"{t.name}-fp16")
        for tile in (t, h):
            save_tile(tile, root / f"{tile.name}.safetensors"); n += 1
print(f"{n} int8 tiles with bias in {root}")
PY
step conform-bias-fp16 180 python -m alibi conform --kernel-a cutlass --kernel-b triton --tiles "$W/int8" --quiet \
  --out "$R/conform-bias-fp16-cutlass-vs-triton"
step predict-pair-bias-fp16 120 python -m alibi predict-pair cutlass triton --tiles "$W/int8" \
  --out "$R/predict-pair-bias-fp16-cutlass-vs-triton.json"
step pytest-gpu 330 python -m pytest -q -m gpu tests --ignore=tests/kernels/test_vllm.py -p no:cacheprovider \
  --junitxml "$R/pytest-gpu-junit.xml"
python - "$R" > "$OUT/pipeline-summary.txt" 2>&1 <<'PY'
import json, sys
from pathlib import Path
R = Path(sys.argv[1])
print((R / "steps.txt").read_text())
for f in sorted(R.glob("bench-conform-*.json")):
    b = json.loads(f.read_text())
    print(f"{f.stem}: {b['units']} units, {b['output_elements']:,} elements, verdict {b['verdict']}, "
          f"identical on every check device: {b['identical_results']}")
    for t in b["timings"]:
        s = t["stage_seconds"]
        print(f"  {t['check_device']:5s} total {t['total_seconds']:.3f} s ({t['elements_per_s'] / 1e6:.1f} M el/s); "
              f"kernels {s['kernels']:.3f}, reference {s['reference']:.3f}, checks {s['checks']:.3f}, io {s['io']:.3f}")
for d in sorted(R.glob("conform-*/")):
    r = json.loads((d / "report.json").read_text())
    judged = [u for u in r["tiles"] if u["explained"] is not None]
    print(f"{d.name}: {r['verdict']} ({r['equivalence']}); differing {sum(u['n_differing'] for u in r['tiles'])}, "
          f"predicted {sum(u['n_predicted'] or 0 for u in judged)}, explained {sum(u['explained'] for u in judged)}/"
          f"{len(judged)}, causes {sorted({u['cause'] for u in judged if u['cause']})}")
    for c in r["checks"]:
        print(f"    {c['status']:>12} {c['check']}: {c['detail'][:150]}")
t = (R / "pytest-gpu.txt").read_text().splitlines() if (R / "pytest-gpu.txt").exists() else []
print("pytest:", next((ln for ln in reversed(t) if "passed" in ln or "failed" in ln), "no output"))
for ln in t:
    if ln.startswith(("FAILED", "ERROR")):
        print("  " + ln[:200])
PY
cat "$OUT/pipeline-summary.txt"
tar -C "$OUT" -czf "$OUT/pipeline.tgz" pipeline && rm -rf "$R"
