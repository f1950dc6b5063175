"""Content digests for checkpoints, tokenizers, prompt sets and captures (sha256, hex).

Two kinds, each with its argument:

- a *file* digest is the sha256 of the file's bytes: it pins exactly what was shipped;
- a *tensor* digest hashes each tensor's name, dtype, shape and raw little-endian bytes in name
  order, so it does not depend on how tensors are split across shards or ordered inside a
  safetensors header: two checkpoints with equal tensor digests hold identical tensors bit for bit.

A JSON document's digest is taken over its canonical form (sorted keys, no spaces, UTF-8).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from alibi.io.digests import sha256_bytes, sha256_file

# File and byte digests are `alibi.io.digests`' (one implementation for the whole toolkit); a folder's
# digest is `alibi.governance.manifest.digest_tree`.
file_sha256 = sha256_file
bytes_sha256 = sha256_bytes


def canonical_json(obj: object) -> bytes:
    """The canonical bytes of a JSON-able object: sorted keys, compact separators, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def json_sha256(obj: object) -> str:
    """sha256 of `obj`'s canonical JSON."""
    return bytes_sha256(canonical_json(obj))


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of a CPU tensor in C order (any dtype, including bfloat16 and float8)."""
    t = t.detach().to("cpu").contiguous()
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def tensors_sha256(tensors: Mapping[str, torch.Tensor]) -> str:
    """Digest of a set of named tensors, independent of sharding and header order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        header = f"{name}\0{str(t.dtype).removeprefix('torch.')}\0{list(t.shape)}\0".encode()
        h.update(header)
        h.update(tensor_bytes(t))
    return h.hexdigest()


def files_sha256(paths: Iterable[Path], root: Path) -> dict[str, str]:
    """{path relative to `root` (POSIX form): sha256} for each file in `paths`, sorted."""
    return {p.relative_to(root).as_posix(): file_sha256(p) for p in sorted(paths)}


def combined_sha256(digests: Mapping[str, str]) -> str:
    """One digest over a {name: digest} table (its canonical JSON)."""
    return json_sha256(dict(digests))

