#!/usr/bin/env bash
# The README's main command on the H200 (with CUDA it compares cutlass with triton on the built-in
# default), plus an fp8 pair on fp8 tiles made from the same synthetic operands. Results in $OUT.
set -u
W=/tmp/alibi; mkdir -p "$W"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
tar -C "$W" -xJf gpu_payload/cutlass_include.tar.xz && tar -C "$W" -xJf gpu_payload/alibi_cache.tar.xz
export ALIBI_CUTLASS_INCLUDE=$W/cutlass_include ALIBI_CACHE=$W/alibi_cache
. analysis/h200/kernel_pins.sh
python -m alibi conform --out "$OUT/default" > "$OUT/default.txt" 2>&1; echo "default rc=$?"; tail -18 "$OUT/default.txt"
python - "$W/fp8tiles" <<'PY'
"""fp8 e4m3 tiles from the synthetic qwen3-1.7b operands: per-token and per-channel scales amax/448."""
import sys
from pathlib import Path
import torch
from alibi.tiles.synthetic import synthetic_tiles
from alibi.tiles.tile import save_tile
out = Path(sys.argv[1])
for t in synthetic_tiles("qwen3-1.7b", M=256):
    a = t.a_q.float() * t.s_a[:, None]
    w = t.w_q.float() * t.s_w[:, None]
    s_a = a.abs().amax(1) / 448
    s_w = w.abs().amax(1) / 448
    tile = t.replace(a_q=(a / s_a[:, None]).to(torch.float8_e4m3fn), s_a=s_a,
                     w_q=(w / s_w[:, None]).to(torch.float8_e4m3fn), s_w=s_w)
    save_tile(tile, out / f"{t.name}.safetensors")
PY
python -m alibi conform --kernel-a cutlass-fp8 --kernel-b triton-fp8 --tiles "$W/fp8tiles" --scales real --out "$OUT/fp8" > "$OUT/fp8.txt" 2>&1
echo "fp8 rc=$?"; tail -18 "$OUT/fp8.txt"
tar -C "$OUT" -czf "$OUT/default_conform.tgz" default default.txt fp8 fp8.txt && rm -rf "$OUT/default" "$OUT/fp8"
