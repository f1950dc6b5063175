#!/usr/bin/env bash
# Sourced by every H200 session script: the CUTLASS headers and the prebuilt kernel cache carried in
# gpu_payload/ (built on a CPU machine with `alibi kernels build` for sm_90; nvcc 13.0 on both
# sides, so the cache keys agree and nothing is compiled on the GPU), the environment record, and
# a timer. Work folder /tmp/alibi survives between calls while the machine stays warm.
W=/tmp/alibi
mkdir -p "$W"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
[ -d "$W/cutlass_include" ] || tar -C "$W" -xJf gpu_payload/cutlass_include.tar.xz
[ -d "$W/alibi_cache" ] || tar -C "$W" -xJf gpu_payload/alibi_cache.tar.xz
export ALIBI_CUTLASS_INCLUDE=$W/cutlass_include ALIBI_CACHE=$W/alibi_cache
. analysis/h200/kernel_pins.sh
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nvcc --version | tail -2
  python -c "import torch, triton, transformers, sklearn, scipy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__, 'sklearn', sklearn.__version__, 'scipy', scipy.__version__)"
  lscpu | grep -E 'Model name|^CPU\(s\)'; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# The SmolLM2 GGUF (98 MB) travels in three parts, one per call (a call carries at most 64 MiB
# together with the working tree): `stash_gguf_part` keeps whatever part came along in /tmp/alibi,
# `prepare_model` joins them once all three are there.
GGUF_PARTS="aa ab ac"
stash_gguf_part() {
  for p in gpu_payload/smollm2.gguf.part-*; do [ -f "$p" ] && cp "$p" "$W/" && echo "kept $(basename "$p") in $W"; done
}
model_ready() {
  [ -f "$W/model/w8a8/manifest.json" ] && [ -f "$W/model/w8a8-pow2-ceil/manifest.json" ]
}
prepare_model() {
  model_ready && return 0
  stash_gguf_part
  local parts=""
  for x in $GGUF_PARTS; do
    [ -f "$W/smollm2.gguf.part-$x" ] || { echo "model: GGUF part $x missing (have: $(ls $W | tr '\n' ' '))"; return 1; }
    parts="$parts $W/smollm2.gguf.part-$x"
  done
  cat $parts > "$W/s.gguf" || return 1
  python -m alibi model prepare smollm2-135m --gguf "$W/s.gguf" --out "$W/model" > "$OUT/prepare.txt" 2>&1 || { cat "$OUT/prepare.txt"; return 1; }
  python -m alibi pow2-rewrite --mode ceil --requantize-from "$W/model/bf16" "$W/model/w8a8" "$W/model/w8a8-pow2-ceil" >> "$OUT/prepare.txt" 2>&1 || { cat "$OUT/prepare.txt"; return 1; }
  tail -4 "$OUT/prepare.txt"; stamp "model prepared"
}
