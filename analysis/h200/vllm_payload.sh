#!/usr/bin/env bash
# Package vLLM's own scaled-mm kernels for the GPU machine (no package index there, vLLM not
# installable there): from the vLLM 0.26.0 wheel take the compiled op library
# `vllm/_C_stable_libtorch.abi3.so` (built against PyTorch's stable ABI, so it loads into the GPU
# machine's torch 2.11) and the Triton kernel file `triton_scaled_mm.py`, and write them into the
# ignored folder gpu_payload/vllm/:
#
#   _C_stable_libtorch.abi3.so.xz   the op library, xz -T2 -9 (79 MB -> about 56 MB)
#   triton_scaled_mm.py             vLLM's Triton scaled-mm, byte for byte
#   fp8_utils.py                    vLLM's block-scaled fp8 utilities (w8a8_triton_block_scaled_mm), byte for byte
#   fp8_block_configs.tar.xz        its tuned Triton configs (quantization/utils/configs/*block_shape*.json), which
#                                   its launcher reads from configs/ beside fp8_utils.py (alibi/kernels/vllm_block.py)
#   SHA256SUMS                      sha256 of the wheel, the uncompressed library and the Triton file
#   VERSION                         the vLLM version the files come from
#
# analysis/h200/vllm.sh checks the decompressed library and the Triton file against SHA256SUMS
# before using them. Usage (from the repo root):
#
#   pip download --no-deps vllm==0.26.0 -d /work/scratch/vllm      # 304 MB, once
#   bash analysis/h200/vllm_payload.sh [WHEEL]                      # default: the file above
#
# The folder is staged and renamed into place only when complete: a failed run leaves no payload.
set -euo pipefail
VERSION=0.26.0
WHEEL=${1:-/work/scratch/vllm/vllm-${VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl}
# Pinned: the wheel PyPI served for vllm==0.26.0 (cp38-abi3, manylinux_2_28 x86_64).
WHEEL_SHA256=adb1e4c9b46d0dfdb094121ae5aad670a42412dd813ed4e5db069ed6a15006de
LIB=vllm/_C_stable_libtorch.abi3.so
TRITON=vllm/model_executor/layers/quantization/compressed_tensors/triton_scaled_mm.py
FP8_UTILS=vllm/model_executor/layers/quantization/utils/fp8_utils.py
CONFIGS=vllm/model_executor/layers/quantization/utils/configs/
DEST=gpu_payload/vllm

[ -f "$WHEEL" ] || { echo "vllm_payload.sh: no wheel at $WHEEL; run: pip download --no-deps vllm==$VERSION -d $(dirname "$WHEEL")" >&2; exit 2; }
[ -d alibi ] || { echo "vllm_payload.sh: run from the repository root" >&2; exit 2; }
got=$(sha256sum "$WHEEL" | cut -d' ' -f1)
[ "$got" = "$WHEEL_SHA256" ] || { echo "vllm_payload.sh: $WHEEL has sha256 $got, expected $WHEEL_SHA256 (vllm==$VERSION)" >&2; exit 2; }

mkdir -p gpu_payload
STAGE=$(mktemp -d gpu_payload/.vllm-stage.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT
python3 - "$WHEEL" "$STAGE" "$CONFIGS" "$LIB" "$TRITON" "$FP8_UTILS" <<'PY'
"""Copy the members out of the wheel (a zip) without unpacking the other 300 MB; the block-scaled configs into
configs/ (every file of the configs folder whose name has block_shape=)."""
import shutil
import sys
import zipfile
from pathlib import Path

wheel, stage, configs, *members = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    for name in members:
        with z.open(name) as src, open(Path(stage) / Path(name).name, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    (Path(stage) / "configs").mkdir()
    for name in z.namelist():
        if name.startswith(configs) and "block_shape=" in name:
            with z.open(name) as src, open(Path(stage) / "configs" / Path(name).name, "wb") as dst:
                shutil.copyfileobj(src, dst)
PY
tar -C "$STAGE" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - configs | xz -9 > "$STAGE/fp8_block_configs.tar.xz"
rm -rf "$STAGE/configs"
(cd "$STAGE" && sha256sum "$(basename "$LIB")" triton_scaled_mm.py fp8_utils.py fp8_block_configs.tar.xz > SHA256SUMS)
echo "$WHEEL_SHA256  $(basename "$WHEEL")" >> "$STAGE/SHA256SUMS"
echo "$VERSION" > "$STAGE/VERSION"
xz -T2 -9 "$STAGE/$(basename "$LIB")"
rm -rf "$DEST"
mv "$STAGE" "$DEST"
trap - EXIT
chmod 755 "$DEST"
echo "wrote $DEST:"
ls -l "$DEST"
du -cb "$DEST"/* | tail -1
