#!/usr/bin/env bash
# The kernels other projects ship, on the H200 (issue 22): `alibi identify` for each GPU kernel, then
# `alibi matrix` over every available int8 and fp8 kernel on biased bf16/fp16 tiles and on the SmolLM2
# capture, under real and pow2 scales, and the teacher-forced flips of torchao-int8 against vllm-cutlass.
# Installs nothing from a network (there is none): the wheels travel in gpu_payload/ecosystem/ (made here by
# analysis/h200/ecosystem_payload.sh) and are installed with `pip install --no-index --no-deps --target`.
#
# Run through the session wrapper, which unpacks the committed source (gpu_payload/src.tar.gz) and the CUTLASS
# headers and sets up /tmp/alibi:
#
#   ECO_PARTS=identify          bash analysis/h200/session.sh ecosystem   # ≈ 4 min (12 identify runs, GPU tests)
#   ECO_PARTS="synthetic fp8"   bash analysis/h200/session.sh ecosystem   # ≈ 5 min (4 matrices)
#   ECO_PARTS=capture           bash analysis/h200/session.sh ecosystem   # ≈ 6 min: model + capture + matrix
#   ECO_PARTS=flips             bash analysis/h200/session.sh ecosystem   # ≈ 4 min: teacher-forced, 2 arms
#
# (estimates: every step has its own time limit, so a call stays under 10 minutes; a step that runs out is
# listed with rc=124 in summary.txt). The operand folders are rebuilt by every call (≈ 30 s).
#
# carry: gpu_payload/ecosystem, gpu_payload/src.tar.gz, gpu_payload/cutlass_include.tar.xz and, to skip the
# CUTLASS build, gpu_payload/alibi_cache.tar.xz (≈ 9 MB with a ≈ 28 MB checkout). vLLM's kernels join when an earlier call left vLLM's files in /tmp/alibi-vllm
# (`session.sh vllm-unpack`); the SmolLM2 capture and model when earlier calls left them in /tmp/alibi
# (`session.sh stash` ×2 with GGUF parts aa, ab, then `pipeline` or this stage with part ac). Whatever is
# missing is named in $OUT/ecosystem/summary.txt (and `alibi matrix --available-only` lists each kernel
# left out with its reason); nothing is replaced silently.
#
# Parts (ECO_PARTS, default all): identify synthetic fp8 capture flips. ECO_INT8 / ECO_FP8 override the kernel lists.
# Results: $OUT/ecosystem/ (logs, identify outputs, matrix folders with manifests) and summary.txt.
set -u
: "${OUT:?set OUT to the results folder}"
PARTS=" ${ECO_PARTS:-identify synthetic fp8 capture flips} "
want() { case "$PARTS" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
E=/tmp/alibi-eco
R=$OUT/ecosystem
W=${W:-/tmp/alibi}
mkdir -p "$E" "$R"
T0=$(date +%s)
note() { echo "$*" >> "$R/steps.txt"; echo "$*"; }
# step NAME LIMIT_S CMD...: CMD under a time limit, output in $R/NAME.txt, its status line appended to
# $R/steps.txt (a file, so that steps started in the background with `&` report too; `wait` collects them).
# ECO_DEADLINE (epoch seconds, optional) shortens every limit so that the step ends by then.
step() {
  local name=$1 limit=$2; shift 2
  local s; s=$(date +%s)
  if [ -n "${ECO_DEADLINE:-}" ] && [ $(( ECO_DEADLINE - s )) -lt "$limit" ]; then limit=$(( ECO_DEADLINE - s )); fi
  if [ "$limit" -lt 10 ]; then note "$name not run: the call's time is spent"; return 124; fi
  timeout "$limit" "$@" > "$R/$name.txt" 2>&1
  local rc=$?
  printf '%-44s rc=%-3s %4ss\n' "$name" "$rc" "$(( $(date +%s) - s ))" >> "$R/steps.txt"
  echo "[$(( $(date +%s) - T0 ))s] $name rc=$rc"
  return $rc
}

# --- the carried wheels, checked against SHA256SUMS, installed once per machine (kept in $E) -------------
# A call that does not carry gpu_payload/ecosystem uses what an earlier call installed in $E, or says that
# the other projects' kernels are left out.
P=gpu_payload/ecosystem
if [ -f "$P/SHA256SUMS" ]; then
  for f in "$P"/*.whl "$P"/fbgemm_triton_gemm-1.6.0.tar.xz; do
    want_sum=$(grep "  $(basename "$f")\$" "$P/SHA256SUMS" | cut -d' ' -f1)
    [ "$(sha256sum "$f" | cut -d' ' -f1)" = "$want_sum" ] || { echo "ecosystem.sh: $f does not match $P/SHA256SUMS"; exit 3; }
  done
  if [ ! -d "$E/site/torchao" ]; then
    python -m pip install -q --no-index --no-deps --target "$E/site" "$P"/*.whl > "$R/install.txt" 2>&1 \
      || { cat "$R/install.txt"; exit 3; }
  fi
  mkdir -p "$E/fbgemm" && tar -C "$E/fbgemm" -xJf "$P/fbgemm_triton_gemm-1.6.0.tar.xz"
elif [ ! -d "$E/site/torchao" ]; then
  note "the other projects' wheels are neither carried ($P) nor installed in $E: torchao, bnb and fbgemm kernels are left out"
fi
export PYTHONPATH=$PWD:$E/site PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export ALIBI_FBGEMM_ROOT=$E/fbgemm TORCHAO_AUTOTUNER_DATA_PATH=$E/torchao-autotune.pkl
V=/tmp/alibi-vllm
if [ -f "$V/_C_stable_libtorch.abi3.so" ] && [ -f "$V/triton_scaled_mm.py" ]; then
  export ALIBI_VLLM_OPS=$V/_C_stable_libtorch.abi3.so ALIBI_VLLM_TRITON=$V/triton_scaled_mm.py
else
  note "vLLM's files are not in $V (run session.sh vllm-unpack first): vllm-* kernels are left out"
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  python -c "import torchao, bitsandbytes; print('torchao', torchao.__version__, 'bitsandbytes', bitsandbytes.__version__)"
  lscpu | grep -E 'Model name|^CPU\(s\)'; cat SOURCE_COMMIT 2>/dev/null; } > "$R/env.txt" 2>&1
cat "$R/env.txt"
step kernels 180 python -m alibi kernels &

INT8=${ECO_INT8:-cutlass,cutlass-sm80,triton,triton:w_then_a+fma,cublas,torch-cpu,vllm-cutlass,vllm-triton,torchao-int8,torchao-int-scaled-mm,sgl-int8}
FP8=${ECO_FP8:-cutlass-fp8,cublaslt-fp8,triton-fp8,vllm-cutlass-fp8,fbgemm-fp8-row,sgl-fp8}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1764633600}

if want identify || want synthetic || want fp8; then
# --- operands ------------------------------------------------------------------------------------------
step operands 300 python - "$E/tiles" <<'PY'
"""Tile folders. probes: the output-dtype bias probes, bf16 and fp16 (identify; a bias in the output dtype suits
every kernel); probes-stats-fp16: the fp16 ones with scales of 17 significant bits (bitsandbytes' statistics are
then exact); biased-bf16 / biased-fp16: one SmolLM2
decoder block with a bias in the output dtype at M = 64 and the q/down projections at M = 1, 16, 65;
biased-stats-fp16: biased-fp16 with 17-bit scales (bnb-int8 joins); fp8: e4m3 tiles from the same operands."""
import sys
from pathlib import Path

import torch

from alibi.kernels.bnb import with_exact_statistics
from alibi.tiles.out_bias_probe import out_bias_probe_tiles
from alibi.tiles.synthetic import synthetic_tiles
from alibi.tiles.tile import save_tile

root = Path(sys.argv[1])


def put(folder, tiles):
    (root / folder).mkdir(parents=True, exist_ok=True)
    for f in (root / folder).glob("*.safetensors"):
        f.unlink()
    for t in tiles:
        save_tile(t, root / folder / f"{t.name}.safetensors")
    print(f"{folder}: {len(tiles)} tiles")


put("probes", out_bias_probe_tiles(torch.bfloat16, seed=0) + out_bias_probe_tiles(torch.float16, seed=0))
put("probes-stats-fp16", [with_exact_statistics(t) for t in out_bias_probe_tiles(torch.float16, seed=0)])
block = [t.replace(name=f"m64-{t.name}") for t in synthetic_tiles("smollm2-135m-bias", seed=0, M=64)]
for M in (1, 16, 65):
    block += [t.replace(name=f"m{M}-{t.name}") for t in synthetic_tiles("smollm2-135m-bias", seed=M, M=M)
              if t.meta["kind"] in ("q_proj", "down_proj")]
put("biased-bf16", block)
fp16 = [t.replace(out_dtype=torch.float16, bias=t.bias.to(torch.float16)) for t in block]
put("biased-fp16", fp16)
put("biased-stats-fp16", [with_exact_statistics(t) for t in fp16])
fp8 = []
for M in (32, 256):
    for t in synthetic_tiles("smollm2-135m", seed=M, M=M):
        a, w = t.a_q.float() * t.s_a[:, None], t.w_q.float() * t.s_w[:, None]
        s_a, s_w = a.abs().amax(1) / 448, w.abs().amax(1) / 448
        fp8.append(t.replace(a_q=(a / s_a[:, None]).to(torch.float8_e4m3fn), s_a=s_a,
                             w_q=(w / s_w[:, None]).to(torch.float8_e4m3fn), s_w=s_w, name=f"m{M}-{t.name}"))
put("fp8", fp8)
PY
fi
T=$E/tiles

# --- identify: each GPU int8 kernel on the probes; the fp8 and library tests -------------------------------
if want identify; then
  # ECO_IDENTIFY: which kernels (default: every int8 kernel and bnb-int8); they run side by side.
  for k in ${ECO_IDENTIFY:-${INT8//,/ } bnb-int8}; do
    f=probes; [ "$k" = bnb-int8 ] && f=probes-stats-fp16
    safe=${k//[:+]/_}  # file names that travel back: no ':' or '+'
    step "identify-$safe" 240 python -m alibi identify "$k" --tiles "$T/$f" &
  done
  if [ "${ECO_PYTEST:-1}" = 1 ]; then
    step pytest-ecosystem-gpu 300 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_torchao.py \
      tests/kernels/test_bnb.py tests/kernels/test_fbgemm_sglang.py tests/conform/test_matrix.py --junitxml "$R/pytest-ecosystem-gpu.xml" &
  fi
  if [ "${ECO_CONTRACT:-1}" = 1 ]; then  # the kernel contract over every GPU kernel (issue 23), skips with their reasons
    step pytest-kernel-contract-gpu 420 python -m pytest -q -rs -m gpu -p no:cacheprovider \
      tests/kernels/test_kernel_contract.py --junitxml "$R/pytest-kernel-contract-gpu.xml" &
  fi
fi  # the identify steps run on beside the matrices; the `wait` below collects them all

# --- matrices on synthetic operands --------------------------------------------------------------------
if want synthetic; then  # the matrices run side by side
  step matrix-biased-bf16 300 python -m alibi matrix --available-only --kernels "$INT8" --tiles "$T/biased-bf16" \
    --quiet --out "$R/matrix-biased-bf16" &
  step matrix-biased-fp16 300 python -m alibi matrix --available-only --kernels "$INT8" --tiles "$T/biased-fp16" \
    --quiet --out "$R/matrix-biased-fp16" &
  step matrix-biased-stats-fp16 300 python -m alibi matrix --available-only --kernels "$INT8,bnb-int8" \
    --tiles "$T/biased-stats-fp16" --quiet --out "$R/matrix-biased-stats-fp16" &
fi
if want fp8; then
  step matrix-fp8 300 python -m alibi matrix --available-only --kernels "$FP8" --tiles "$T/fp8" --quiet \
    --out "$R/matrix-fp8" &
fi
wait

# --- the SmolLM2 capture and the token-level consequence -------------------------------------------------
have_model() { [ -f "$W/model/w8a8/manifest.json" ]; }
if want capture || want flips; then
  if ! have_model && type prepare_model >/dev/null 2>&1; then prepare_model > "$R/prepare.txt" 2>&1; fi
fi
capture_matrix() {  # the capture (kept in $W for later calls), then the matrix over it
  if have_model && [ ! -f "$W/capture/manifest.json" ]; then
    step capture 300 python -m alibi capture --model "$W/model/w8a8" --prompts experiments/prompts/wikipedia-8x512 \
      --tokens 512 --kernel triton --quiet --out "$W/capture"
  fi
  if [ -f "$W/capture/manifest.json" ]; then
    step matrix-capture 540 python -m alibi matrix --available-only --kernels "$INT8" --tiles "$W/capture" --quiet \
      --out "$R/matrix-capture"
  else
    note "capture: no SmolLM2 capture in $W/capture and no model to make one (send the GGUF parts first)"
  fi
}
flips() {
  if have_model && [ -n "${ALIBI_VLLM_OPS:-}" ]; then
    step flips-torchao-vs-vllm-cutlass 420 python -m alibi replay teacher-forced --model "$W/model/w8a8" \
      --prompts experiments/prompts/wikipedia-64x512 --kernel-a torchao-int8 --kernel-b vllm-cutlass \
      --windows 64 --context 256 --positions 256 --out "$R/flips-torchao-int8-vs-vllm-cutlass"
  else
    note "flips: needs the SmolLM2 model in $W/model and vLLM's files in $V"
  fi
}
want capture && capture_matrix &
want flips && flips &
wait

# --- summary ------------------------------------------------------------------------------------------
{ echo "ecosystem.sh on $(head -1 "$R/env.txt"), source $(cat SOURCE_COMMIT 2>/dev/null || echo '?')"
  cat "$R/steps.txt"
  for m in "$R"/matrix-*/matrix.json; do
    [ -f "$m" ] || continue
    echo; echo "== $(basename "$(dirname "$m")")"
    python - "$m" <<'PY'
import sys
from alibi.conform.matrix import Matrix
m = Matrix.from_json(open(sys.argv[1]).read())
for c in m.cells:
    print(f"  {c.kernel_a:>22} vs {c.kernel_b:<22} {c.status:<11} {', '.join(c.causes) or '-':<40} "
          f"{c.n_differing}/{c.n_elements}")
for k in m.kernels:
    if k.fired:
        print(f"  {k.name}: own check fired: {', '.join(k.fired)}")
for u in m.unavailable:
    print(f"  left out: {u.name}: {u.reason[:160]}")
PY
  done
  fl="$R/flips-torchao-int8-vs-vllm-cutlass/flips/flips.json"
  if [ -f "$fl" ]; then
    echo; echo "== teacher-forced torchao-int8 vs vllm-cutlass (SmolLM2 W8A8, real scales)"
    python - "$fl" <<'PY'
import sys
from alibi.tokens.flips import FlipAnalysis
f = FlipAnalysis.from_json(open(sys.argv[1]).read(), sys.argv[1])
print(f"  positions {f.n_positions}, flips {f.n_flips} (rate {f.flip_rate:.4f}), logits identical "
      f"{f.logits_identical}/{f.logits_compared}, margin ROC-AUC {f.roc_auc} CI90 {f.roc_auc_ci90}")
PY
  fi
  for f in "$R"/identify-*.txt; do
    [ -f "$f" ] && { echo; echo "== $(basename "$f" .txt)"; grep -A2 "declares\|^alibi: error" "$f" | head -4; }
  done
} > "$R/summary.txt" 2>&1
cat "$R/summary.txt"
