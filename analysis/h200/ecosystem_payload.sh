#!/usr/bin/env bash
# Package the other projects' kernels for the GPU machine (no package index there) into the ignored folder
# gpu_payload/ecosystem/, for analysis/h200/ecosystem.sh:
#
#   torchao-0.18.0-cp310-abi3-....whl           the wheel PyPI serves, byte for byte (3.4 MB, pure Python + .so
#                                               files alibi does not load)
#   bitsandbytes-0.50.2-slim.whl               the 0.50.2 wheel without the libraries of other CUDA/ROCm/XPU
#                                               builds (43 MB -> 4 MB): every kept file is byte for byte the
#                                               wheel's, and its RECORD (kept unchanged) holds their sha256
#   fbgemm_triton_gemm-1.6.0.tar.xz            fbgemm_gpu/experimental/gemm/triton_gemm/ from the
#                                               fbgemm-gpu-genai 1.6.0 wheel (pure Triton; FBGEMM's library is
#                                               tied to one torch and is not carried)
#   SHA256SUMS                                 the three source wheels and the files above
#
# Usage (from the repository root; downloads about 82 MB once into ECO_WHEELS, default /tmp/wheels):
#
#   bash analysis/h200/ecosystem_payload.sh
#
# The folder is staged and renamed into place only when complete.
set -euo pipefail
[ -d alibi ] || { echo "ecosystem_payload.sh: run from the repository root" >&2; exit 2; }
WHEELS=${ECO_WHEELS:-/tmp/wheels}
DEST=gpu_payload/ecosystem
mkdir -p "$WHEELS" gpu_payload
for spec in torchao==0.18.0 bitsandbytes==0.50.2 fbgemm-gpu-genai==1.6.0; do
  python3 -m pip download -q --no-deps --python-version 3.12 --only-binary=:all: "$spec" -d "$WHEELS"
done
STAGE=$(mktemp -d gpu_payload/.ecosystem-stage.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT
python3 - "$WHEELS" "$STAGE" <<'PY'
"""Copy the torchao wheel, write the slim bitsandbytes wheel and the FBGEMM Triton tarball."""
import hashlib
import io
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

wheels, stage = Path(sys.argv[1]), Path(sys.argv[2])
sums = []


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


torchao = next(wheels.glob("torchao-0.18.0-*.whl"))
shutil.copy(torchao, stage / torchao.name)
sums += [(sha(torchao), torchao.name)]

bnb = next(wheels.glob("bitsandbytes-0.50.2-*.whl"))
keep = ("libbitsandbytes_cuda130.so", "libbitsandbytes_cpu.so")
slim = stage / "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl"  # pip reads the tags from the name
with zipfile.ZipFile(bnb) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
    for info in src.infolist():
        if info.filename.endswith(".so") and not info.filename.endswith(keep):
            continue
        dst.writestr(info, src.read(info.filename))
sums += [(sha(bnb), f"source:{bnb.name}"), (sha(slim), slim.name)]

fbgemm = next(wheels.glob("fbgemm_gpu_genai-1.6.0-*.whl"))
prefix = "fbgemm_gpu/experimental/gemm/triton_gemm/"
buf = io.BytesIO()
with zipfile.ZipFile(fbgemm) as src, tarfile.open(fileobj=buf, mode="w") as tar:
    for info in src.infolist():
        if info.filename.startswith(prefix) and info.filename.endswith(".py"):
            data = src.read(info.filename)
            member = tarfile.TarInfo(info.filename)
            member.size, member.mtime = len(data), 0
            tar.addfile(member, io.BytesIO(data))
            sums += [(hashlib.sha256(data).hexdigest(), info.filename)]
import lzma
(stage / "fbgemm_triton_gemm-1.6.0.tar.xz").write_bytes(lzma.compress(buf.getvalue(), preset=9))
sums += [(sha(fbgemm), f"source:{fbgemm.name}"), (sha(stage / "fbgemm_triton_gemm-1.6.0.tar.xz"), "fbgemm_triton_gemm-1.6.0.tar.xz")]
(stage / "SHA256SUMS").write_text("".join(f"{d}  {n}\n" for d, n in sums))
PY
rm -rf "$DEST"
mv "$STAGE" "$DEST"
trap - EXIT
du -sh "$DEST"/*
