"""Hugging Face checkpoint folders: config, safetensors weights (single file or sharded), digests.

A checkpoint folder holds `config.json`, the weights as `model.safetensors` or as shards listed
in `model.safetensors.index.json`, optional tokenizer files, and (when written by this toolkit)
`manifest.json`, an alibi manifest pinning every other file. Reading needs only torch and
safetensors. Writing goes into a folder the caller stages with `alibi.atomic.staged_dir`, so a
failed write never leaves a half checkpoint at the destination.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from alibi.errors import InputError
from alibi.model.digests import (
    combined_sha256,
    file_sha256,
    json_sha256,
    tensors_sha256,
)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MANIFEST_FILE = "manifest.json"  # alibi.governance.manifest.MANIFEST_NAME
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
)


def read_config(folder: str | Path) -> dict:
    """The parsed `config.json` of the checkpoint in `folder` (InputError if missing or malformed)."""
    path = Path(folder) / CONFIG_FILE
    if not Path(folder).is_dir():
        raise InputError(f"{folder}: no such checkpoint folder; run `alibi model prepare` or pass an existing folder")
    if not path.is_file():
        raise InputError(f"{path}: missing; a checkpoint folder needs its config.json next to the weights")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc}); restore the file from its source") from exc
    if not isinstance(config, dict):
        raise InputError(f"{path}: must hold a JSON object")
    return config


def weight_files(folder: str | Path) -> list[Path]:
    """The safetensors files holding the checkpoint's weights, in a stable order."""
    folder = Path(folder)
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise InputError(f"{index}: malformed shard index (needs a 'weight_map' object); restore it") from exc
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise InputError(f"{folder}: shard(s) {', '.join(missing)} listed in {INDEX_FILE} are missing; copy them in")
        return [folder / n for n in names]
    single = folder / WEIGHTS_FILE
    if not single.is_file():
        raise InputError(
            f"{single}: missing (and no {INDEX_FILE}); the checkpoint's weights must be in safetensors "
            "format (pickled .bin files are not read)"
        )
    return [single]


def read_tensors(folder: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint in `folder`, on the CPU, in their stored dtypes."""
    tensors: dict[str, torch.Tensor] = {}
    for path in weight_files(folder):
        try:
            part = load_file(str(path))
        except (SafetensorError, OSError, ValueError) as exc:
            raise InputError(f"{path}: not a readable safetensors file ({exc}); restore it from its source") from exc
        dup = tensors.keys() & part.keys()
        if dup:
            raise InputError(f"{path}: tensor {min(dup)!r} also appears in another shard; the checkpoint is malformed")
        tensors.update(part)
    return tensors


def write_checkpoint(
    folder: str | Path,
    config: Mapping,
    tensors: Mapping[str, torch.Tensor],
    extra_files: Mapping[str, str | bytes] | None = None,
) -> None:
    """Write `config.json`, `model.safetensors` and `extra_files` into the existing `folder`.

    The folder should be a staging folder from `alibi.atomic.staged_dir`. Tensors are written
    contiguous, on the CPU, in the dtypes given.
    """
    folder = Path(folder)
    (folder / CONFIG_FILE).write_text(json.dumps(dict(config), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, str(folder / WEIGHTS_FILE))
    for name, content in (extra_files or {}).items():
        target = folder / name
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content, encoding="utf-8")


def tokenizer_files(folder: str | Path) -> dict[str, bytes]:
    """{file name: bytes} of the tokenizer files present in `folder`."""
    folder = Path(folder)
    return {n: (folder / n).read_bytes() for n in TOKENIZER_FILES if (folder / n).is_file()}


@dataclass(frozen=True)
class CheckpointDigests:
    """What a checkpoint is, by content.

    `weights`: tensor digest over all tensors (independent of sharding); `config`: canonical-JSON
    digest of config.json; `tokenizer`: digest over the tokenizer files' sha256s (empty string if
    there is no tokenizer); `files`: sha256 of every file (manifest excluded).
    """

    weights: str
    config: str
    tokenizer: str
    files: Mapping[str, str]

    def as_dict(self) -> dict:
        return {"weights": self.weights, "config": self.config, "tokenizer": self.tokenizer, "files": dict(self.files)}


def tokenizer_digest(folder: str | Path) -> str:
    """Digest of the tokenizer files in `folder` ('' if there are none)."""
    folder = Path(folder)
    present = {n: file_sha256(folder / n) for n in TOKENIZER_FILES if (folder / n).is_file()}
    return combined_sha256(present) if present else ""


def checkpoint_digests(folder: str | Path, tensors: Mapping[str, torch.Tensor] | None = None) -> CheckpointDigests:
    """Digests of the checkpoint in `folder`; pass `tensors` if already loaded to avoid a re-read."""
    folder = Path(folder)
    if tensors is None:
        tensors = read_tensors(folder)
    files = {
        p.relative_to(folder).as_posix(): file_sha256(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST_FILE
    }
    return CheckpointDigests(
        weights=tensors_sha256(tensors),
        config=json_sha256(read_config(folder)),
        tokenizer=tokenizer_digest(folder),
        files=files,
    )


def verified_checkpoint(folder: str | Path) -> dict:
    """Check the checkpoint in `folder` against its `manifest.json` when it has one.

    Returns `{"tensors_sha256": <tensor digest>, "verified": bool}`: with a manifest, every file
    must match it (InputError naming the first mismatch) and the tensor digest is the one it
    records; without one (e.g. a checkpoint made by llm-compressor) the digest is computed and
    `verified` is False.
    """
    from alibi.governance.manifest import read_manifest, verify_files

    folder = Path(folder)
    read_config(folder)
    if not (folder / MANIFEST_FILE).is_file():
        return {"tensors_sha256": tensors_sha256(read_tensors(folder)), "verified": False}
    manifest = read_manifest(folder)
    problems = verify_files(folder)
    if problems:
        raise InputError(f"{folder}: does not match its manifest ({problems[0]}); re-run `alibi model prepare` "
                         "or restore the checkpoint")
    recorded = (manifest.predicate.get("parameters") or {}).get("tensors_digest") or {}
    digest = recorded.get("sha256") or tensors_sha256(read_tensors(folder))
    return {"tensors_sha256": digest, "verified": True}
