#!/usr/bin/env bash
# The H200 model session: what ran on the GPU for issues 4, 5 and 6, as run there.
#
#   stage prep    (first call):  stash the first GGUF part in /tmp/alibi (the file is over the
#                                64 MiB a call may carry; see README.md, "On a machine without a package index")
#   stage capture (next call):   prepare SmolLM2-135M W8A8, capture it twice with the triton
#                                runner (repeatability), predict, greedy-generate with every GPU
#                                kernel, capture overhead, the Triton GPU tests
#   stage study   (later call):  prepare + capture again, run the locked pre-registered study
#                                (as run: in the warm machine right after the lock was committed,
#                                on the capture still in place, with `alibi run` alone)
#   stage pow2    (later call):  prepare, then analysis/pow2_gpu.sh (issue 6) and the cublas GPU
#                                tests; everything packed into $OUT/pow2.tgz (a call returns ≤ 8 files)
#
# Runs from the repository root with gpu_payload/ carried; results go to $OUT.
set -u
STAGE=$1
W=/tmp/alibi
mkdir -p "$W"
if [ "$STAGE" = prep ]; then cp gpu_payload/smollm2.gguf.part-aa "$W/"; ls -la "$W"; exit 0; fi

export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
tar -C "$W" -xJf gpu_payload/cutlass_include.tar.xz && tar -C "$W" -xJf gpu_payload/alibi_cache.tar.xz
export ALIBI_CUTLASS_INCLUDE=$W/cutlass_include ALIBI_CACHE=$W/alibi_cache
. analysis/h200/kernel_pins.sh
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv; nvcc --version | tail -2
  python -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

cat "$W/smollm2.gguf.part-aa" gpu_payload/smollm2.gguf.part-ab > "$W/s.gguf" || exit 1
python -m alibi model prepare smollm2-135m --gguf "$W/s.gguf" --out "$W/model" > "$OUT/prepare.txt" 2>&1 || { cat "$OUT/prepare.txt"; exit 1; }
stamp prepared
PROMPTS=experiments/prompts/wikipedia-8x512
CAP=captures/smollm2-135m-w8a8-triton-m512

if [ "$STAGE" = capture ]; then
  for i in 1 2; do
    rm -rf $CAP
    python -m alibi capture --model "$W/model/w8a8" --prompts $PROMPTS --tokens 512 --kernel triton --out $CAP > "$OUT/capture$i.txt" 2>&1
    cp $CAP/manifest.json "$OUT/capture$i.manifest.json"; stamp "capture $i"
  done
  python -m alibi predict --tiles $CAP --out "$OUT/layers.json" > "$OUT/predict.txt" 2>&1; stamp predict
  for k in cutlass cutlass-sm80 triton cublas; do
    python -m alibi eval generate --model "$W/model/w8a8" --prompts $PROMPTS --kernel $k --new-tokens 32 --out "$OUT/generate-$k.json" > "$OUT/generate-$k.txt" 2>&1
    stamp "generate $k rc=$?"
  done
  python -m alibi capture-overhead --model "$W/model/w8a8" --prompts $PROMPTS --tokens 512 --kernel cutlass --out "$OUT/overhead.json" > "$OUT/overhead.txt" 2>&1
  stamp "overhead rc=$?"
  timeout 200 python -m pytest -q -p no:cacheprovider -rfE tests/kernels/test_triton_int8.py tests/kernels/test_triton_fp8.py > "$OUT/pytest-triton.txt" 2>&1
  stamp "triton tests rc=$?"; tail -5 "$OUT/pytest-triton.txt"
fi

if [ "$STAGE" = study ]; then
  python -m alibi capture --model "$W/model/w8a8" --prompts $PROMPTS --tokens 512 --kernel triton --out $CAP > "$OUT/capture.txt" 2>&1
  stamp "capture rc=$?"
  python -m alibi run experiments/smollm2-layer-verification.yaml --out "$OUT/smollm2-layer-verification" > "$OUT/study.txt" 2>&1
  stamp "study rc=$?"; tail -25 "$OUT/study.txt"
fi

if [ "$STAGE" = pow2 ]; then
  mkdir -p "$OUT/pow2"
  timeout 300 bash analysis/pow2_gpu.sh "$W/model" "$OUT/pow2" > "$OUT/pow2/pow2.txt" 2>&1
  stamp "pow2 rc=$?"; tail -25 "$OUT/pow2/pow2.txt"
  timeout 120 python -m pytest -q -p no:cacheprovider -rfE tests/kernels/test_cublas_gpu.py > "$OUT/pow2/pytest-cublas.txt" 2>&1
  stamp "cublas tests rc=$?"; tail -3 "$OUT/pow2/pytest-cublas.txt"
  cp "$OUT/env.txt" "$OUT/pow2/"; tar -C "$OUT" -czf "$OUT/pow2.tgz" pow2 && rm -rf "$OUT/pow2"
fi
