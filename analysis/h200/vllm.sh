#!/usr/bin/env bash
# vLLM's own kernels on the H200 (issue 14): identify each, conform them against alibi's kernels,
# bench them side by side, run their GPU tests. Installs nothing (no network there).
#
# Needs, carried in ignored paths: gpu_payload/vllm/ (made here by analysis/h200/vllm_payload.sh:
# the xz'd op library, triton_scaled_mm.py, SHA256SUMS, VERSION) and the CUTLASS headers and kernel
# cache, which the lead's wrapper unpacks and exports as ALIBI_CUTLASS_INCLUDE and ALIBI_CACHE.
# If the op library is already decompressed in /tmp/alibi-vllm from an earlier call (same digest),
# the .xz need not travel again.
#
#   bash analysis/h200/vllm.sh [CAPTURE_DIR]     # CAPTURE_DIR: SmolLM2 W8A8 tiles (alibi capture), optional
#   bash analysis/h200/vllm.sh --unpack          # only decompress the op library into /tmp/alibi-vllm
#
# Size: gpu_payload/vllm is 55,877,597 bytes; with a ~7 MB checkout and the CUTLASS headers and cache
# (1.5 MB) one call carries about 64.5 MB of the 64 MiB (67.1 MB) allowed. Should the checkout grow
# past that, split it: a first call carrying gpu_payload/vllm runs `--unpack`; the next call (within
# ~30 s, while /tmp survives) carries only gpu_payload/vllm/{SHA256SUMS,VERSION,triton_scaled_mm.py}.
#
# Results: $OUT/vllm_h200.tgz (every report folder with its manifest, logs, bench.json, pytest junit)
# and $OUT/vllm_summary.txt, whose table is also printed last.
set -u
: "${OUT:?set OUT to the results folder}"
CAPTURE=${1:-}
# VLLM_PARTS: which parts run after the operands (default all): identify conform bench pytest
PARTS=" ${VLLM_PARTS:-identify conform bench pytest} "
want() { case "$PARTS" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
W=/tmp/alibi-vllm
R=$OUT/vllm
mkdir -p "$W" "$R"
T0=$(date +%s)
STEPS=()
# step NAME LIMIT_S CMD...: run CMD with a time limit, output in $R/NAME.txt, status kept for the table.
step() {
  local name=$1 limit=$2; shift 2
  local s; s=$(date +%s)
  timeout "$limit" "$@" > "$R/$name.txt" 2>&1
  local rc=$?
  STEPS+=("$(printf '%-46s rc=%-3s %4ss' "$name" "$rc" "$(( $(date +%s) - s ))")")
  echo "[$(( $(date +%s) - T0 ))s] $name rc=$rc"
  return $rc
}

# --- environment and vLLM's files ----------------------------------------------------------------
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  echo "ALIBI_CACHE=${ALIBI_CACHE:-unset} ALIBI_CUTLASS_INCLUDE=${ALIBI_CUTLASS_INCLUDE:-unset}"
  lscpu | grep -E 'Model name|^CPU\(s\)'; } > "$R/env.txt" 2>&1

P=gpu_payload/vllm
LIB=$W/_C_stable_libtorch.abi3.so
want_lib=$(grep '_C_stable_libtorch.abi3.so$' "$P/SHA256SUMS" | cut -d' ' -f1)
want_triton=$(grep 'triton_scaled_mm.py$' "$P/SHA256SUMS" | cut -d' ' -f1)
have_lib() { [ -f "$LIB" ] && [ "$(sha256sum "$LIB" | cut -d' ' -f1)" = "$want_lib" ]; }
# The .xz travels whole, or (when the checkout is too big for both in one call) as VLLM_XZ_PARTS
# pieces `_C_stable_libtorch.abi3.so.xz.part-a?` (split -n 2), one per call: each call keeps the
# pieces it carries in $W, and the call that completes the set decompresses them.
XZ=_C_stable_libtorch.abi3.so.xz
for f in "$P/$XZ".part-*; do [ -f "$f" ] && cp "$f" "$W/" && echo "kept $(basename "$f") in $W"; done
if ! have_lib; then
  if [ -f "$P/$XZ" ]; then
    xz -T0 -dc "$P/$XZ" > "$LIB.part" && mv "$LIB.part" "$LIB"
  elif [ "$(ls "$W/$XZ".part-* 2>/dev/null | wc -l)" -eq "${VLLM_XZ_PARTS:-2}" ]; then
    cat "$W/$XZ".part-* | xz -T0 -dc > "$LIB.part" && mv "$LIB.part" "$LIB"
  elif [ "$CAPTURE" = "--unpack" ]; then
    echo "vllm.sh: $(ls "$W/$XZ".part-* 2>/dev/null | wc -l) of ${VLLM_XZ_PARTS:-2} parts of $XZ in $W; the next call brings the rest"
    rm -rf "$R"; exit 0
  fi
fi
have_lib || { echo "vllm.sh: $LIB does not match $P/SHA256SUMS ($want_lib); re-run vllm_payload.sh"; exit 3; }
cp "$P/triton_scaled_mm.py" "$W/triton_scaled_mm.py"
[ "$(sha256sum "$W/triton_scaled_mm.py" | cut -d' ' -f1)" = "$want_triton" ] || { echo "vllm.sh: triton_scaled_mm.py digest mismatch"; exit 3; }
export ALIBI_VLLM_OPS=$LIB ALIBI_VLLM_TRITON=$W/triton_scaled_mm.py
echo "vLLM $(cat "$P/VERSION"): $LIB ($want_lib), $ALIBI_VLLM_TRITON ($want_triton)" | tee -a "$R/env.txt"
if [ "$CAPTURE" = "--unpack" ]; then rm -rf "$R"; echo "unpacked into $W"; exit 0; fi
echo "[$(( $(date +%s) - T0 ))s] payload ready"

step kernels 120 python -m alibi kernels

# --- operands: probes for identify, int8 tiles with bias and fp16 output, fp8 tiles ----------------
step operands 300 python - "$W" <<'PY'
"""Tile folders: probes (output-dtype bias, bf16 + fp16), int8 (SmolLM2 shapes, bf16 and fp16 with bias,
M from 1 to 512), fp8 (e4m3 from the same operands, M = 32 and 256, scales amax/448)."""
import sys
from pathlib import Path

import torch

from alibi.tiles.out_bias_probe import out_bias_probe_tiles
from alibi.tiles.synthetic import synthetic_tiles
from alibi.tiles.tile import save_tile

root = Path(sys.argv[1])
for sub in ("probes", "int8", "fp8"):
    (root / sub).mkdir(parents=True, exist_ok=True)
    for f in (root / sub).glob("*.safetensors"):
        f.unlink()
for dtype in (torch.bfloat16, torch.float16):
    for t in out_bias_probe_tiles(dtype, seed=0):
        save_tile(t, root / "probes" / f"{t.name}.safetensors")
n = 0
for t in synthetic_tiles("smollm2-135m-bias", seed=0):  # M = 32, bf16 output and bias, all 7 layers
    t = t.replace(name=f"m32-{t.name}")
    save_tile(t, root / "int8" / f"{t.name}.safetensors"); n += 1
for M in (1, 16, 64, 65, 512):
    for t in synthetic_tiles("smollm2-135m-bias", seed=M, M=M):
        if t.meta["kind"] not in ("q_proj", "down_proj"):
            continue
        t = t.replace(name=f"m{M}-{t.name}")
        h = t.replace(out_dtype=torch.float16, bias=t.bias.to(torch.float16), name=f"{t.name}-fp16")
        for tile in (t, h):
            save_tile(tile, root / "int8" / f"{tile.name}.safetensors"); n += 1
for M in (32, 256):
    for t in synthetic_tiles("smollm2-135m", seed=M, M=M):
        a = t.a_q.float() * t.s_a[:, None]
        w = t.w_q.float() * t.s_w[:, None]
        s_a, s_w = a.abs().amax(1) / 448, w.abs().amax(1) / 448
        f = t.replace(a_q=(a / s_a[:, None]).to(torch.float8_e4m3fn), s_a=s_a,
                      w_q=(w / s_w[:, None]).to(torch.float8_e4m3fn), s_w=s_w, name=f"m{M}-{t.name}")
        save_tile(f, root / "fp8" / f"m{M}-{t.name}.safetensors")
print(f"probes 4, int8 {n}, fp8 14 tiles in {root}")
PY

# --- identify: the declared epilogues confirmed from output bits -----------------------------------
if want identify; then
mkdir -p "$R/identify"
identify() {  # identify NAME KERNEL SOURCE-ARGS...: the JSON candidates go to identify/NAME.json
  local name=$1; shift
  step "identify-$name" 120 sh -c 'out=$1; shift; python -m alibi identify "$@" --json > "$out"' _ \
    "$R/identify/$name.json" "$@"
}
identify vllm-cutlass vllm-cutlass --tiles "$W/probes"
identify vllm-triton vllm-triton --tiles "$W/probes"
identify vllm-triton-epilogue-probe-bias vllm-triton --synthetic epilogue-probe-bias
identify triton-w_then_a+fma triton:w_then_a+fma --tiles "$W/probes"
python -m alibi manifest write "$R/identify" --kind identify --input "tiles=$W/probes" > /dev/null 2>&1 || echo "identify manifest failed"
fi

# --- conform -----------------------------------------------------------------------------------------
conform() {  # conform NAME A B SOURCE-ARGS...
  local name=$1 a=$2 b=$3; shift 3
  step "conform-$name" 240 python -m alibi conform --kernel-a "$a" --kernel-b "$b" "$@" --out "$R/conform-$name"
}
conform cutlass-vs-vllm-cutlass cutlass vllm-cutlass --tiles "$W/int8"
conform triton-vs-vllm-triton triton vllm-triton --tiles "$W/int8"
if want conform; then
conform vllm-cutlass-vs-vllm-triton vllm-cutlass vllm-triton --tiles "$W/int8"
conform triton-w_then_a+fma-vs-vllm-cutlass triton:w_then_a+fma vllm-cutlass --tiles "$W/int8"
conform triton-w_then_a+fma-vs-cutlass triton:w_then_a+fma cutlass --tiles "$W/int8"
conform cutlass-fp8-vs-vllm-cutlass-fp8 cutlass-fp8 vllm-cutlass-fp8 --tiles "$W/fp8" --scales real
if [ -n "$CAPTURE" ] && [ -d "$CAPTURE" ]; then
  conform capture-cutlass-vs-vllm-cutlass cutlass vllm-cutlass --tiles "$CAPTURE" --no-invariance
  conform capture-triton-vs-vllm-triton triton vllm-triton --tiles "$CAPTURE" --no-invariance
  conform capture-vllm-cutlass-vs-vllm-triton vllm-cutlass vllm-triton --tiles "$CAPTURE" --no-invariance
  conform capture-triton-w_then_a+fma-vs-vllm-cutlass triton:w_then_a+fma vllm-cutlass --tiles "$CAPTURE" --no-invariance
else
  echo "no capture folder given: the SmolLM2 capture comparisons are skipped" | tee "$R/capture-skipped.txt"
fi
fi

# --- bench: all int8 kernels, both fp8 CUTLASS kernels ---------------------------------------------
if want bench; then
mkdir -p "$R/bench"
step bench 300 python -m alibi bench --int8 cutlass,cutlass-sm80,triton,triton:w_then_a+fma,cublas,vllm-cutlass,vllm-triton \
  --fp8 cutlass-fp8,vllm-cutlass-fp8 --shape 1,4096,4096 --shape 16,4096,4096 --shape 128,4096,4096 \
  --shape 512,4096,4096 --shape 4096,4096,4096 --rep-ms 40 --out "$R/bench/bench.json"
python -m alibi manifest write "$R/bench" --kind bench > /dev/null 2>&1 || echo "bench manifest failed"
fi

# --- the GPU tests -----------------------------------------------------------------------------------
if want pytest; then
mkdir -p "$R/pytest"
step pytest-gpu 300 python -m pytest -q -m gpu tests/kernels/test_vllm.py tests/kernels/test_triton_w_then_a_fma.py tests/kernels/test_cutlass_gpu.py --junitxml "$R/pytest/junit.xml" -p no:cacheprovider
cp "$R/pytest-gpu.txt" "$R/pytest/pytest.txt"
python -m alibi manifest write "$R/pytest" --kind test-run > /dev/null 2>&1 || echo "pytest manifest failed"
fi

# --- summary (printed last) ------------------------------------------------------------------------
printf '%s\n' "${STEPS[@]}" > "$R/steps.txt"
python - "$R" > "$OUT/vllm_summary.txt" 2>&1 <<'PY'
"""One table: identify, conform, bench, pytest, from the files this script wrote."""
import json
import re
import sys
from pathlib import Path

R = Path(sys.argv[1])


def why(step: str) -> str:
    """The last line a failed step printed (its one-line error)."""
    f = R / f"{step}.txt"
    lines = [ln for ln in f.read_text(errors="replace").splitlines() if ln.strip()] if f.exists() else []
    return lines[-1][:150] if lines else "no output"


print("== steps ==")
print((R / "steps.txt").read_text().rstrip())
print("\n== identify (model matching every output bit of every tile) ==")
for kernel, f in (("vllm-cutlass  [out-bias probes bf16+fp16]", "vllm-cutlass.json"),
                  ("vllm-triton   [out-bias probes bf16+fp16]", "vllm-triton.json"),
                  ("vllm-triton   [epilogue-probe-bias, fp32 bias]", "vllm-triton-epilogue-probe-bias.json"),
                  ("triton:w_then_a+fma [out-bias probes bf16+fp16]", "triton-w_then_a+fma.json")):
    # declared: vllm-cutlass and triton:w_then_a+fma w_then_a+fma, vllm-triton a_then_w+add_after_cast
    try:
        found = json.loads((R / "identify" / f).read_text())
        match = [c["model"] for c in found if c["matches"]]
        print(f"{kernel:48s} {', '.join(match) or 'NO MATCH'}   (next: {found[len(match)]['model']} "
              f"{found[len(match)]['n_differing']} differing)")
    except (OSError, ValueError, IndexError, KeyError):
        print(f"{kernel:48s} no result: {why('identify-' + f.removesuffix('.json'))}")
print("\n== conform ==")
print(f"{'pair / source':58s} {'verdict':8s} {'equiv':11s} {'real: tiles eq, diff el, ulp':30s} {'pow2 eq':8s} epilogue-model")
for f in sorted(R.glob("conform-*.txt")):
    d = R / f.stem
    try:
        rep = json.loads((d / "report.json").read_text())
    except (OSError, ValueError):
        print(f"{f.stem.removeprefix('conform-'):58s} no report: {why(f.stem)}")
        continue
    tiles = rep["tiles"]
    real = [u for u in tiles if u["regime"] == "real"]
    pow2 = [u for u in tiles if u["regime"] == "pow2"]
    em = next(c for c in rep["checks"] if c["check"] == "epilogue-model")
    r = f"{sum(u['bitwise_equal'] for u in real)}/{len(real)}, {sum(u['n_differing'] for u in real)}, " \
        f"{max((u['max_ulp'] or 0) for u in real) if real else '-'}"
    p = f"{sum(u['bitwise_equal'] for u in pow2)}/{len(pow2)}" if pow2 else "-"
    judged = [u for u in tiles if u.get("explained") is not None]  # schema v2: predicted against observed
    ex = (f"  explained {sum(u['explained'] for u in judged)}/{len(judged)}, predicted "
          f"{sum(u['n_predicted'] for u in judged)}, cause {sorted({u['cause'] for u in judged if u['cause']})}"
          if judged else "")
    print(f"{d.name.removeprefix('conform-'):58s} {rep['verdict']:8s} {rep['equivalence']:11s} {r:30s} {p:8s} "
          f"{em['status']}{ex}")
print("\n== bench (TOPS, CUDA-graph timed; N = K = 4096) ==")
try:
    rows = json.loads((R / "bench" / "bench.json").read_text())["results"]
    Ms = sorted({r["M"] for r in rows})
    names = list(dict.fromkeys((r["fmt"], r["kernel"]) for r in rows))
    print(f"{'fmt':8s} {'kernel':18s} " + " ".join(f"{'M=' + str(m):>9s}" for m in Ms))
    for fmt, k in names:
        cells = []
        for m in Ms:
            x = next((r for r in rows if r["kernel"] == k and r["fmt"] == fmt and r["M"] == m), None)
            cells.append(f"{x['tops']:9.1f}" if x and x["tops"] is not None else f"{(x or {}).get('status', '-')[:9]:>9s}")
        print(f"{fmt:8s} {k:18s} " + " ".join(cells))
except (OSError, ValueError, KeyError):
    print(f"no bench report: {why('bench')}")
print("\n== GPU tests ==")
text = (R / "pytest-gpu.txt").read_text() if (R / "pytest-gpu.txt").exists() else ""
tail = [ln for ln in text.splitlines() if re.search(r"passed|failed|error|skipped", ln)]
print(tail[-1] if tail else "no pytest output")
for ln in text.splitlines():
    if ln.startswith(("FAILED", "ERROR")):
        print("  " + ln[:200])
PY
cp "$OUT/vllm_summary.txt" "$R/summary.txt"
tar -C "$OUT" -czf "$OUT/vllm_h200.tgz" vllm && rm -rf "$R"
echo "[$(( $(date +%s) - T0 ))s] packed $OUT/vllm_h200.tgz"
cat "$OUT/vllm_summary.txt"
