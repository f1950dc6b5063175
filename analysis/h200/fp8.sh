#!/usr/bin/env bash
# Issue 34 on the GPU machine, from committed code (gpu_payload/src.tar.gz, analysis/h200/pack_source.sh):
#   probe     alibi probe fp8-mma (crafted families, 3 x 2^20 random steps, random chains; wgmma and mma.sync)
#   measure   analysis/h200/fp8_measure.py: every fp8 kernel's schedule read by probe at the matrix's and deeper shapes
#             (identify.json), recorded outputs for the CPU tests (recorded.safetensors), the depth sweep re-read
#             with the model (depth.json)
#   matrix    alibi matrix over the fp8 kernels and the fp8 emulators: SmolLM2 block at M=32 and M=256 (row scales),
#             and per-tensor scales with cublaslt-fp8-tensorwise
#   gputests  pytest -m gpu on the fp8 tests
# Carry: gpu_payload/{src.tar.gz,nvidia_cutlass-4.2.0.0-py3-none-any.whl,alibi_cache.tar.xz,kernel-pins.json,fbg}.
# Usage: FP8_PARTS="probe measure matrix gputests" bash analysis/h200/fp8.sh     (results: $OUT/fp8.tgz, $OUT/summary.txt)
#   FP8_MEASURE (default identify,record,depth), FP8_IDENTIFY (kernels whose schedule is read; default all),
#   FP8_MATRIX_ROWS (default "256 32"), FP8_GPUTESTS (default: the fp8 test files; "tests" for all); gpu_payload/vllm (optional) brings vllm-cutlass-fp8.
set -u -o pipefail
: "${OUT:?set OUT}"
REPO=$PWD
T0=$(date +%s)
PARTS=" ${FP8_PARTS:-probe gputests matrix measure mutants} "
want() { case "$PARTS" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
left() { echo $(( ${BUDGET_S:-540} - ($(date +%s) - T0) )); }
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
# CUTLASS: the headers' wheel, or (when the vLLM library leaves no room for it) only cutlass.h and version.h, enough to
# find the libraries already built in alibi_cache.tar.xz (their cache key names the CUTLASS version); nothing compiles
if [ -f gpu_payload/nvidia_cutlass-4.2.0.0-py3-none-any.whl ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site gpu_payload/nvidia_cutlass-4.2.0.0-py3-none-any.whl || exit 1
else
  export ALIBI_CUTLASS_INCLUDE=$REPO/gpu_payload/cutlass-min
fi
S=/tmp/src; rm -rf "$S"; mkdir -p "$S"
if [ -f gpu_payload/src.tar.gz ]; then tar -xzf gpu_payload/src.tar.gz -C "$S"; else git archive HEAD | tar -x -C "$S"; git rev-parse HEAD > "$S/SOURCE_COMMIT"; fi
cd "$S" || exit 1
export PYTHONPATH=$S:/tmp/site PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 SOURCE_DATE_EPOCH=1764633600
mkdir -p /tmp/ac && tar -C /tmp/ac -xJf "$REPO/gpu_payload/alibi_cache.tar.xz" && export ALIBI_CACHE=/tmp/ac
mkdir -p -m 700 /tmp/acfg && cp "$REPO/gpu_payload/kernel-pins.json" /tmp/acfg/ && chmod 600 /tmp/acfg/kernel-pins.json && export ALIBI_CONFIG=/tmp/acfg
mkdir -p /tmp/fbg && tar -C /tmp/fbg -xJf "$REPO/gpu_payload/fbg/fbgemm_triton_gemm-1.6.0.tar.xz" && export ALIBI_FBGEMM_ROOT=/tmp/fbg
export TRITON_CACHE_DIR=/tmp/triton-cache
# vLLM's op library (gpu_payload/vllm from analysis/h200/vllm_payload.sh, whole or split across calls): unpacked by
# vllm.sh into /tmp/alibi-vllm, which a warm machine keeps between calls
if [ -d "$REPO/gpu_payload/vllm" ]; then
  (cd "$REPO" && bash analysis/h200/vllm.sh --unpack) 2>&1 | tail -n 2
  if [ -f /tmp/alibi-vllm/_C_stable_libtorch.abi3.so ] && [ -f /tmp/alibi-vllm/triton_scaled_mm.py ]; then
    export ALIBI_VLLM_OPS=/tmp/alibi-vllm/_C_stable_libtorch.abi3.so ALIBI_VLLM_TRITON=/tmp/alibi-vllm/triton_scaled_mm.py
  fi
fi
R=$OUT/fp8; mkdir -p "$R"
cp SOURCE_COMMIT "$R/"
stamp "source: commit $(cat SOURCE_COMMIT); CUTLASS ${ALIBI_CUTLASS_INCLUDE:-wheel}; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
python -m alibi kernels > "$R/kernels.txt" 2>&1
if want probe; then
  timeout $(( $(left) - 60 )) python -m alibi probe fp8-mma --out "$R/probe" > "$R/probe.log" 2>&1; stamp "probe: rc $?"
  tail -n 60 "$R/probe/summary.txt" >> "$OUT/summary.txt" 2>/dev/null
fi
if want gputests; then
  timeout $(( $(left) - 15 )) python -m pytest -q -rs -m gpu -p no:cacheprovider ${FP8_GPUTESTS:-tests/exact/test_fp8_mma.py \
    tests/kernels/test_fp8_gpu.py tests/conform/test_fp8_recorded.py} > "$R/pytest-gpu.txt" 2>&1; stamp "gputests: rc $?"
  tail -n 5 "$R/pytest-gpu.txt" >> "$OUT/summary.txt"
fi
if want matrix; then
  K8=cutlass-fp8,triton-fp8,cublaslt-fp8,fbgemm-fp8-row,vllm-cutlass-fp8,emulator-fp8:fast-accum:w_then_a,emulator-fp8:promote-128:w_then_a+add_before_cast
  for M in ${FP8_MATRIX_ROWS:-256 32}; do
    timeout $(( $(left) - 40 )) python -m alibi matrix --available-only --kernels "$K8" --synthetic smollm2-135m-fp8 \
      --rows $M --out "$R/matrix-m$M" --quiet > "$R/matrix-m$M.txt" 2>&1; stamp "matrix M=$M: rc $?"
    head -n 30 "$R/matrix-m$M.txt" >> "$OUT/summary.txt"
  done
  timeout $(( $(left) - 30 )) python -m alibi matrix --available-only --synthetic smollm2-135m-fp8-tensor --rows 64 \
    --kernels cutlass-fp8,triton-fp8,cublaslt-fp8,cublaslt-fp8-tensorwise,emulator-fp8:promote-128:product_first+add_before_cast \
    --out "$R/matrix-tensor" --quiet > "$R/matrix-tensor.txt" 2>&1; stamp "matrix tensor: rc $?"
  head -n 20 "$R/matrix-tensor.txt" >> "$OUT/summary.txt"
fi
if want measure; then
  timeout $(( $(left) - 60 )) python analysis/h200/fp8_measure.py "$R/measure" --parts "${FP8_MEASURE:-identify,record,depth}" \
    --identify "${FP8_IDENTIFY:-}" \
    > "$R/measure.log" 2>&1; stamp "measure: rc $?"
  grep -E "^identify|^kernel|^depth" "$R/measure.log" | grep -v "^identify:" | cut -c1-260 >> "$OUT/summary.txt"
fi
if want mutants; then
  timeout $(( $(left) - 30 )) python -m alibi mutants --base cutlass-fp8 --synthetic smollm2-135m-fp8 --rows 64 \
    --severity one,all --out "$R/mutants-fp8" > "$R/mutants-fp8.txt" 2>&1; stamp "mutants fp8: rc $?"
  tail -n 20 "$R/mutants-fp8.txt" >> "$OUT/summary.txt"
fi
tar -C "$OUT" -czf "$OUT/fp8.tgz" fp8 && rm -rf "$R"
stamp "done"
