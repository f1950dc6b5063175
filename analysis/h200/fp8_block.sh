#!/usr/bin/env bash
# Issue 35 on the GPU machine, from committed code (gpu_payload/src.tar.gz, analysis/h200/pack_source.sh):
#   measure   analysis/h200/fp8_block_measure.py: every block kernel's schedule read by probe at SmolLM2 and
#             DeepSeek-like shapes (identify.json; `alibi identify` per kernel in identify-<kernel>.txt), recorded
#             block tiles and outputs for the CPU tests (recorded-block.safetensors)
#   matrix    alibi matrix over the available block kernels but FBGEMM's (MATRIX_KERNELS) and the block emulators:
#             SmolLM2 at M = 1 and M = 16
#   mutants   alibi mutants --base vllm-cutlass-fp8-block (the block faults) on SmolLM2 at M = 64
#   mma16     alibi identify vllm-triton-fp8-block where vLLM's H100 configs give BLOCK_SIZE_M < 64 (f16 mma.sync)
#   record    analysis/h200/block_record.py: cuBLASLt's and vLLM Triton's outputs on random tiles, for
#             analysis/fit_block_schedule.py on the CPU
#   deepseek  alibi matrix at DeepSeek-V3's block-scaled layers (deepseek-v3-fp8-block, -decode): the long-K matrix
#   refit     cuBLASLt's outputs at the long-K shapes first read in bf16, recorded and fitted to fp32 on the GPU
#   launches  the GPU tests of replayed launches (every kernel that declares its launches replayable, the CUTLASS
#             ones included: carry gpu_payload/{alibi_cache.tar.xz,kernel-pins.json} too) and of the code
#             around them (the bench, private copies, the runner's decode graphs, the exact reference), then what
#             the garbage collector does in warm conformance runs (analysis/h200/gc_census.py; GC_CENSUS=0: not) and
#             the host's time per pipeline step (analysis/h200/host_timeline.py; HOST_TIMELINE=0: not)
#   gputests  pytest -m gpu tests/kernels/test_fp8_block_kernels.py and the fp8 model's GPU tests (each available
#             block kernel equals the emulator under its declared schedule on random tiles, bit for bit)
# Carry: gpu_payload/{src.tar.gz,vllm,fbg,ecosystem/torchao-0.18.0-*.whl} (vllm from analysis/h200/vllm_payload.sh:
#   the op library, triton_scaled_mm.py, fp8_utils.py, fp8_block_configs.tar.xz; about 56 MB in all). Nothing is built.
# Usage: BLOCK_PARTS="measure matrix mutants gputests" bash analysis/h200/fp8_block.sh   (results: $OUT/fp8_block.tgz,
#   $OUT/summary.txt). BUDGET_S (default 540) bounds the whole; BLOCK_SHAPES (MxNxK,...) overrides the measure shapes.
# Expected: about 4 minutes on an H100 (identify ~2 min for five kernels, matrix ~40 s, mutants ~30 s, tests ~40 s).
set -u -o pipefail
: "${OUT:?set OUT}"
REPO=$PWD
T0=$(date +%s)
PARTS=" ${BLOCK_PARTS:-measure matrix mutants gputests} "
want() { case "$PARTS" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
left() { echo $(( ${BUDGET_S:-540} - ($(date +%s) - T0) )); }
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
S=/tmp/src; rm -rf "$S"; mkdir -p "$S"
if [ -f gpu_payload/src.tar.gz ]; then tar -xzf gpu_payload/src.tar.gz -C "$S"; else git archive HEAD | tar -x -C "$S"; git rev-parse HEAD > "$S/SOURCE_COMMIT"; fi
cd "$S" || exit 1
export PYTHONPATH=$S:/tmp/site PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 SOURCE_DATE_EPOCH=1764633600
export TRITON_CACHE_DIR=/tmp/triton-cache TORCHAO_AUTOTUNER_DATA_PATH=/tmp/torchao-autotune.pkl
# FBGEMM's Triton files
if [ -f "$REPO/gpu_payload/fbg/fbgemm_triton_gemm-1.6.0.tar.xz" ]; then
  mkdir -p /tmp/fbg && tar -C /tmp/fbg -xJf "$REPO/gpu_payload/fbg/fbgemm_triton_gemm-1.6.0.tar.xz" && export ALIBI_FBGEMM_ROOT=/tmp/fbg
fi
# TorchAO (pure Python for this path; its compiled parts are skipped)
for whl in "$REPO"/gpu_payload/ecosystem/torchao-0.18.0-*.whl; do
  [ -f "$whl" ] && python3 -m pip install -q --no-index --no-deps --target /tmp/site "$whl"
done
# vLLM: the op library and triton_scaled_mm.py (vllm.sh --unpack, digests checked), fp8_utils.py and its configs
if [ -d "$REPO/gpu_payload/vllm" ]; then
  (cd "$REPO" && bash analysis/h200/vllm.sh --unpack) 2>&1 | tail -n 2
  V=/tmp/alibi-vllm P=$REPO/gpu_payload/vllm
  [ -f "$V/_C_stable_libtorch.abi3.so" ] && export ALIBI_VLLM_OPS=$V/_C_stable_libtorch.abi3.so
  if [ -f "$P/fp8_utils.py" ]; then
    cp "$P/fp8_utils.py" "$V/" && rm -rf "$V/configs" && tar -C "$V" -xJf "$P/fp8_block_configs.tar.xz"
    if (cd "$P" && grep -E ' (fp8_utils.py|fp8_block_configs.tar.xz)$' SHA256SUMS | sha256sum -c --quiet -) \
        && [ "$(sha256sum "$V/fp8_utils.py" | cut -d' ' -f1)" = "$(grep ' fp8_utils.py$' "$P/SHA256SUMS" | cut -d' ' -f1)" ]; then
      export ALIBI_VLLM_FP8_UTILS=$V/fp8_utils.py
    else
      echo "fp8_block.sh: fp8_utils.py or its configs do not match $P/SHA256SUMS: vllm-triton-fp8-block left out"
    fi
  fi
fi
[ -f /tmp/alibi-vllm/triton_scaled_mm.py ] && export ALIBI_VLLM_TRITON=/tmp/alibi-vllm/triton_scaled_mm.py
# the CUTLASS libraries built on the CPU machine, and their pins (analysis/h200/kernel_pins.sh)
if [ -f "$REPO/gpu_payload/alibi_cache.tar.xz" ]; then
  mkdir -p /tmp/alibi && tar -C /tmp/alibi -xJf "$REPO/gpu_payload/alibi_cache.tar.xz" && export ALIBI_CACHE=/tmp/alibi/alibi_cache
  [ -f "$REPO/gpu_payload/cutlass_include.tar.xz" ] && tar -C /tmp/alibi -xJf "$REPO/gpu_payload/cutlass_include.tar.xz" \
    && export ALIBI_CUTLASS_INCLUDE=/tmp/alibi/cutlass_include
  W=/tmp/alibi && cd "$REPO" && . analysis/h200/kernel_pins.sh && cd "$S"
fi
R=$OUT/fp8_block; mkdir -p "$R"
cp SOURCE_COMMIT "$R/"
stamp "source: commit $(cat SOURCE_COMMIT); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
python -m alibi kernels > "$R/kernels.txt" 2>&1
grep -E -- "-block " "$R/kernels.txt" | cut -c1-200 >> "$OUT/summary.txt"
BLOCK_KERNELS=cublaslt-fp8-block,vllm-triton-fp8-block,vllm-cutlass-fp8-block,fbgemm-fp8-block,torchao-fp8-block
if want measure; then
  timeout $(( $(left) - 200 )) python analysis/h200/fp8_block_measure.py "$R/measure" --shapes "${BLOCK_SHAPES:-}" \
    > "$R/measure.log" 2>&1; stamp "measure: rc $?"
  grep -E "^identify|^kernel|^record" "$R/measure.log" | cut -c1-300 >> "$OUT/summary.txt"
  # the CLI's own verdict (exit 1 unless the declaration matches) on two shapes per kernel
  for k in ${BLOCK_KERNELS//,/ }; do
    [ "$(left)" -gt 180 ] || break
    timeout 60 python -m alibi identify "$k" --shape 1x576x1536 --shape 256x1536x576 > "$R/identify-$k.txt" 2>&1
    stamp "identify $k: rc $?"
  done
fi
if want matrix; then
  E="emulator-fp8-block:block128:fma(sa*sw,p,acc):add_after_cast,emulator-fp8-block:block128:acc+(p*sa)*sw:add_after_cast"
  E="$E,emulator-fp8-block:block128:fma(p*sa,sw,acc):add_after_cast,emulator-fp8-block:block128:rescale:add_after_cast"
  # FBGEMM stays out of the matrices until its scale division (Triton's div.full.f32) is modelled
  MATRIX_KERNELS=${MATRIX_KERNELS:-${BLOCK_KERNELS/,fbgemm-fp8-block/}}
  timeout $(( $(left) - 120 )) python -m alibi matrix --available-only --kernels "$MATRIX_KERNELS,$E" \
    --synthetic smollm2-135m-fp8-block-decode --out "$R/matrix-m1" --quiet > "$R/matrix-m1.txt" 2>&1
  stamp "matrix M=1: rc $?"; head -n 30 "$R/matrix-m1.txt" >> "$OUT/summary.txt"
  timeout $(( $(left) - 90 )) python -m alibi matrix --available-only --kernels "$MATRIX_KERNELS,$E" \
    --synthetic smollm2-135m-fp8-block --out "$R/matrix-m16" --quiet > "$R/matrix-m16.txt" 2>&1
  stamp "matrix M=16: rc $?"; head -n 30 "$R/matrix-m16.txt" >> "$OUT/summary.txt"
fi
if want mutants; then
  timeout $(( $(left) - 60 )) python -m alibi mutants --base vllm-cutlass-fp8-block --synthetic smollm2-135m-fp8-block \
    --rows 64 --severity one,all --scales real --out "$R/mutants-block" > "$R/mutants-block.txt" 2>&1
  stamp "mutants block: rc $?"; tail -n 20 "$R/mutants-block.txt" >> "$OUT/summary.txt"
fi
if want mma16; then
  # vLLM's Triton block kernel where its H100 configs give BLOCK_SIZE_M = 16 (32 at N = 36864): the f16 mma.sync step
  timeout $(( $(left) - 90 )) python -m alibi identify vllm-triton-fp8-block --shape 1x576x7168 --shape 16x7168x2048 \
    --shape 128x576x7168 --shape 64x4096x7168 --shape 32x36864x7168 > "$R/identify-mma16.txt" 2>&1
  stamp "identify vllm-triton-fp8-block at BLOCK_SIZE_M < 64: rc $?"; tail -n 12 "$R/identify-mma16.txt" >> "$OUT/summary.txt"
fi
if want record; then
  # outputs for analysis/fit_block_schedule.py: cuBLASLt where no modelled schedule fits (and two declared controls)
  CUBLASLT_RECORD=${CUBLASLT_RECORD:-1x256x7168,4x256x7168,16x256x7168,32x256x7168,64x256x7168,128x256x7168,8x576x7168,16x576x7168,1x2048x7168,4x2048x7168,32x576x7168,64x2048x7168}
  timeout $(( $(left) - 60 )) python analysis/h200/block_record.py "$R/record-cublaslt.safetensors" \
    --kernel cublaslt-fp8-block --shapes "$CUBLASLT_RECORD" --seeds 4 > "$R/record-cublaslt.txt" 2>&1
  stamp "record cublaslt: rc $?"; tail -n 1 "$R/record-cublaslt.txt" | cut -c1-400 >> "$OUT/summary.txt"
  timeout $(( $(left) - 45 )) python analysis/h200/block_record.py "$R/record-vllm-triton.safetensors" \
    --kernel vllm-triton-fp8-block --shapes 1x576x7168,16x7168x2048 --seeds 2 > "$R/record-vllm-triton.txt" 2>&1
  stamp "record vllm-triton: rc $?"; tail -n 1 "$R/record-vllm-triton.txt" | cut -c1-400 >> "$OUT/summary.txt"
fi
if want deepseek; then
  # the block matrix at DeepSeek-V3's nine layers (K up to 18432): M = 16 and a decode row, with this project's
  # emulators of the four schedules the kernels declare there
  E="emulator-fp8-block:block128:fma(sa*sw,p,acc):add_after_cast,emulator-fp8-block:block128:fma(sa*sw,p,acc):split-2:add_after_cast"
  E="$E,emulator-fp8-block:block128:fma(p*sa,sw,acc):add_after_cast,emulator-fp8-block:block128:fma(p*sa,sw,acc):f16-mma:add_after_cast"
  K4=cublaslt-fp8-block,vllm-triton-fp8-block,vllm-cutlass-fp8-block,torchao-fp8-block
  timeout $(( $(left) - 150 )) python -m alibi matrix --available-only --kernels "$K4,$E" --synthetic deepseek-v3-fp8-block \
    --scales real --out "$R/matrix-deepseek-m16" --quiet > "$R/matrix-deepseek-m16.txt" 2>&1
  stamp "matrix DeepSeek-V3 M=16: rc $?"; head -n 30 "$R/matrix-deepseek-m16.txt" >> "$OUT/summary.txt"
  timeout $(( $(left) - 60 )) python -m alibi matrix --available-only --kernels "$K4,fbgemm-fp8-block,$E" \
    --synthetic deepseek-v3-fp8-block-decode --scales real --out "$R/matrix-deepseek-m1" --quiet > "$R/matrix-deepseek-m1.txt" 2>&1
  stamp "matrix DeepSeek-V3 M=1: rc $?"; head -n 30 "$R/matrix-deepseek-m1.txt" >> "$OUT/summary.txt"
fi
if want refit; then
  # cuBLASLt's long-K shapes first read from bf16 outputs alone, recorded again and fitted to fp32 (on the GPU)
  REFIT=${REFIT:-4x7168x7168,16x7168x7168,32x7168x7168,64x7168x7168,128x7168x7168,16x2048x7168,32x2048x7168,128x2048x7168,128x576x7168,256x576x7168,1x4096x4096,16x4096x4096,64x4096x4096,256x4096x4096}
  timeout $(( $(left) - 60 )) python analysis/h200/block_record.py /tmp/refit.safetensors --kernel cublaslt-fp8-block \
    --shapes "$REFIT" --seeds 2 > "$R/refit-record.txt" 2>&1 && \
  timeout $(( $(left) - 30 )) python analysis/fit_block_schedule.py /tmp/refit.safetensors --device cuda \
    --out "$R/fit-refit.json" ${REFIT_ORDER:+--shapes "$REFIT_ORDER"} > "$R/fit-refit.txt" 2>&1
  stamp "refit: rc $?"; cut -c1-200 "$R/fit-refit.txt" >> "$OUT/summary.txt"
fi
if want gputests; then
  timeout $(( $(left) - 15 )) python -m pytest -q -rs -m gpu -p no:cacheprovider tests/kernels/test_fp8_block_kernels.py \
    tests/exact/test_fp8_mma.py tests/exact/test_fp8_block_mma.py > "$R/pytest-gpu.txt" 2>&1; stamp "gputests: rc $?"
  tail -n 8 "$R/pytest-gpu.txt" >> "$OUT/summary.txt"
fi
if want launches; then
  timeout $(( $(left) - 15 )) python -m pytest -q -rs -m gpu -p no:cacheprovider tests/conform/test_launches.py tests/conform/test_judge_graphs.py \
    tests/conform/test_bench.py tests/kernels/test_private_copy.py tests/model/test_decode_graphs.py \
    tests/exact/test_emulator_device.py > "$R/pytest-gpu-launches.txt" 2>&1; stamp "launches: rc $?"
  tail -n 12 "$R/pytest-gpu-launches.txt" >> "$OUT/summary.txt"
  # what the garbage collector does in warm runs of the SmolLM2 shapes (GC_CENSUS=0 leaves it out)
  if [ "${GC_CENSUS:-1}" = 1 ]; then
    timeout 150 python analysis/h200/gc_census.py --synthetic smollm2-135m-full 5 > "$R/gc-census.txt" 2>&1
    stamp "gc census: rc $?"; tail -n 12 "$R/gc-census.txt" >> "$OUT/summary.txt"
  fi
  # the host's own time per pipeline step in warm plain runs (analysis/h200/host_timeline.py; HOST_TIMELINE=0: not)
  if [ "${HOST_TIMELINE:-1}" = 1 ]; then
    for source in qwen3-1.7b smollm2-135m-full; do
      timeout 120 python analysis/h200/host_timeline.py --synthetic "$source" 10 > "$R/host-timeline-$source.txt" 2>&1
      stamp "host timeline $source: rc $?"; cat "$R/host-timeline-$source.txt" >> "$OUT/summary.txt"
    done
  fi
  # plain walls (analysis/h200/wall_conform.py), cutlass vs triton, every launch eager against replayed, in turn
  # (LAUNCH_WALLS=0 leaves them out)
  [ "${LAUNCH_WALLS:-1}" = 1 ] && for source in qwen3-1.7b smollm2-135m-full; do
    for round in 1 2; do
      for graphs in 0 1; do
        [ "$(left)" -gt 40 ] || break 3
        line=$(ALIBI_GRAPHS=$graphs timeout 120 python analysis/h200/wall_conform.py cutlass triton cuda 5 --synthetic "$source" 2>&1 | tail -n 1)
        stamp "wall $source round $round graphs=$graphs: $line"
      done
    done
  done
fi
tar -C "$OUT" -czf "$OUT/fp8_block.tgz" fp8_block && rm -rf "$R"
stamp "done"
