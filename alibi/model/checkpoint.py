"""Hugging Face checkpoint folders: config, safetensors weights (single file or sharded), digests.

A checkpoint folder holds `config.json`, the weights as `model.safetensors` or as shards listed
in `model.safetensors.index.json`, optional tokenizer files, and (when written by this toolkit)
`manifest.json`, an alibi manifest pinning every other file. Reading needs only torch and
safetensors. Writing goes into a folder the caller stages with `alibi.io.atomic.staged_dir`, so a
failed write never leaves a half checkpoint at the destination.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from alibi.errors import InputError, one_line, shown
from alibi.governance.manifest import digest_set, read_manifest, resource, verify_files
from alibi.io import jsonio
from alibi.io.digests import sha256_listing
from alibi.model.digests import (
    combined_sha256,
    file_sha256,
    json_sha256,
    tensors_sha256,
)
from alibi.tiles.safetensors_header import read_header

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


# config.json fields the model builder reads, with the JSON type each must have. A wrong type
# (`"hidden_size": "576"`) made transformers fail deep inside model construction with a
# TypeError; a missing optional field is left to transformers' defaults.
_POSITIVE_INT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                        "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings")
_NUMBER_FIELDS = ("rms_norm_eps", "rope_theta", "layer_norm_eps", "initializer_range")
_BOOL_FIELDS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_cache")
_STRING_FIELDS = ("model_type", "hidden_act", "torch_dtype", "dtype")
# Size fields every weight of a Llama/Qwen-style model is built from: each is a dimension of some
# stored tensor, so none can exceed the largest stored dimension (see `check_config_dimensions`).
_SIZE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size")


def config_problem(config: Mapping) -> str | None:
    """The first config.json field whose JSON type is wrong (one line naming it), or None."""
    def is_int(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    for key in _POSITIVE_INT_FIELDS:
        v = config.get(key)
        if v is not None and (not is_int(v) or v < 1):
            return f"{key} is {shown(v)}, expected a positive integer"
    for key in _NUMBER_FIELDS:
        v = config.get(key)
        if v is not None and (not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v)):
            return f"{key} is {shown(v)}, expected a finite number"
    for key in _BOOL_FIELDS:
        v = config.get(key)
        if v is not None and not isinstance(v, bool):
            return f"{key} is {shown(v)}, expected true or false"
    for key in _STRING_FIELDS:
        v = config.get(key)
        if v is not None and not isinstance(v, str):
            return f"{key} is {shown(v)}, expected a string"
    arch = config.get("architectures")
    if arch is not None and (not isinstance(arch, list) or not all(isinstance(a, str) for a in arch)):
        return f"architectures is {shown(arch)}, expected a list of class names"
    qc = config.get("quantization_config")
    if qc is not None and not isinstance(qc, dict):
        return f"quantization_config is {shown(qc)}, expected an object"
    return None


def read_config(folder: str | Path) -> dict:
    """The parsed `config.json` of the checkpoint in `folder` (InputError if missing, malformed, or
    a field the model builder reads has the wrong type)."""
    path = Path(folder) / CONFIG_FILE
    where = one_line(str(path))
    if not Path(folder).is_dir():
        raise InputError(f"{one_line(str(folder))}: no such checkpoint folder; run `alibi model prepare` or pass an "
                         "existing folder")
    if not path.is_file():
        raise InputError(f"{where}: missing; a checkpoint folder needs its config.json next to the weights")
    config = jsonio.read(path)
    if not isinstance(config, dict):
        raise InputError(f"{where}: must hold a JSON object")
    problem = config_problem(config)
    if problem:
        raise InputError(f"{where}: {problem}; fix the field or restore the file from its source")
    return config


def _index_problem(key: object, value: object) -> str | None:
    """Why one `weight_map` entry is unsafe or malformed (None when it names a shard in the folder).

    A shard must be a relative POSIX path inside the checkpoint folder: no absolute path, no `..`,
    no backslash or drive, and no component starting with a dot (hidden files are not covered by
    manifests, so a hidden shard could change without any digest noticing).
    """
    if not isinstance(value, str) or not value:
        return f"maps tensor {shown(key)} to {shown(value, 240)}, not a file name"
    if "\\" in value or "\0" in value:
        return f"maps tensor {shown(key)} to {shown(value, 240)}, which is not a POSIX path"
    pure = PurePosixPath(value)
    if pure.is_absolute() or PureWindowsPath(value).drive:
        return f"maps tensor {shown(key)} to the absolute path {shown(value, 240)}"
    if any(part in ("..", "") for part in value.split("/")) or any(part.startswith(".") for part in pure.parts):
        return (f"maps tensor {shown(key)} to {shown(value, 240)}, which leaves the folder or names a hidden file "
                "(no '..' or dot-files)")
    if value in (CONFIG_FILE, INDEX_FILE, MANIFEST_FILE):
        return f"maps tensor {shown(key)} to {shown(value, 240)}, which is not a weights file"
    return None


def shard_names(folder: str | Path) -> list[str] | None:
    """The shard paths (relative POSIX) listed in the folder's `model.safetensors.index.json`, sorted,
    or None when there is no index. InputError naming the entry for any shard outside the folder."""
    folder = Path(folder)
    index = folder / INDEX_FILE
    if not index.is_file():
        return None
    where = one_line(str(index))
    doc = jsonio.read(index)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise InputError(f"{where}: malformed shard index (needs a non-empty 'weight_map' object of tensor name → "
                         "shard file); restore it")
    for key, value in weight_map.items():
        problem = _index_problem(key, value)
        if problem:
            raise InputError(f"{where}: {problem}; a shard index may only name files inside its own folder")
    return sorted(set(weight_map.values()))


def weight_files(folder: str | Path) -> list[Path]:
    """The safetensors files holding the checkpoint's weights, in a stable order (the index's
    shards, each a file inside `folder`, or the single `model.safetensors`)."""
    folder = Path(folder)
    names = shard_names(folder)
    if names is not None:
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise InputError(f"{one_line(str(folder))}: shard(s) {one_line(', '.join(missing))[:200]} listed in "
                             f"{INDEX_FILE} are missing; copy them in")
        return [folder / n for n in names]
    single = folder / WEIGHTS_FILE
    if not single.is_file():
        raise InputError(
            f"{one_line(str(single))}: missing (and no {INDEX_FILE}); the checkpoint's weights must be in safetensors "
            "format (pickled .bin files are not read)"
        )
    return [single]


def tensor_shapes(folder: str | Path) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} of every stored tensor, read from the shards' headers only (no tensor data)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in weight_files(folder):
        header = read_header(path, "checkpoint shard")
        dup = shapes.keys() & header.tensors.keys()
        if dup:
            raise InputError(f"{one_line(str(path))}: tensor {shown(min(dup))} also appears in another shard; "
                             "the checkpoint is malformed")
        shapes.update({name: entry.shape for name, entry in header.tensors.items()})
    return shapes


def check_config_dimensions(config: Mapping, shapes: Mapping[str, tuple[int, ...]], where: str) -> None:
    """InputError unless config.json's sizes agree with the stored tensors' shapes.

    Argument: the model is built from config.json before any weight is loaded, so a config saying
    `vocab_size: 2000000000` allocates an embedding of 2·10⁹ × hidden elements (terabytes) first.
    Every weight of a decoder model is a `vocab × hidden`, `hidden × hidden`-like or
    `intermediate × hidden` matrix, so `vocab_size`, `hidden_size` and `intermediate_size` are
    dimensions of stored tensors: none may exceed the largest stored dimension, and where the
    Llama/Qwen tensor names are present they must match exactly (embedding `[vocab, hidden]`,
    `num_hidden_layers` = the number of `layers.<i>` blocks, gate/up projections `[intermediate, ...]`).
    """
    largest = max((d for shape in shapes.values() for d in shape), default=0)
    for key in _SIZE_FIELDS:
        v = config.get(key)
        if isinstance(v, int) and v > largest:
            raise InputError(f"{where}: config.json says {key} = {v}, larger than every stored tensor dimension "
                             f"(the largest is {largest}); the config does not describe these weights")
    embed = [shape for name, shape in shapes.items() if name.endswith("embed_tokens.weight")]
    vocab, hidden = config.get("vocab_size"), config.get("hidden_size")
    if len(embed) == 1 and vocab is not None and hidden is not None and tuple(embed[0]) != (vocab, hidden):
        raise InputError(f"{where}: the embedding is {list(embed[0])} but config.json says vocab_size × hidden_size "
                         f"= [{vocab}, {hidden}]; the config does not describe these weights")
    layers = {int(m.group(1)) for name in shapes if (m := _LAYER.search(name))}
    n_layers = config.get("num_hidden_layers")
    if layers and n_layers is not None and layers != set(range(n_layers)):
        raise InputError(f"{where}: the weights hold decoder layers 0..{max(layers)} ({len(layers)} blocks) but "
                         f"config.json says num_hidden_layers = {n_layers}")
    inter = config.get("intermediate_size")
    for name, shape in shapes.items():
        if inter is not None and name.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")) and shape[:1] != (inter,):
            raise InputError(f"{where}: {name} is {list(shape)} but config.json says intermediate_size = {inter}")


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def read_tensors(folder: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint in `folder`, on the CPU, in their stored dtypes.

    The shards' headers are validated first and, when the folder has a config.json, its sizes are
    compared with the stored shapes (`check_config_dimensions`) — before any tensor is read.
    """
    folder = Path(folder)
    shapes = tensor_shapes(folder)
    if (folder / CONFIG_FILE).is_file():
        check_config_dimensions(read_config(folder), shapes, one_line(str(folder)))
    tensors: dict[str, torch.Tensor] = {}
    for path in weight_files(folder):
        tensors.update(load_shard(path)[0])
    return tensors


def load_shard(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str] | None]:
    """Every tensor of one safetensors file and its header metadata; whatever the library raises on a
    damaged file becomes one InputError line naming the file."""
    try:
        with safe_open(str(path), framework="pt") as fh:  # one open: the header, then every tensor
            return {name: fh.get_tensor(name) for name in fh.keys()}, fh.metadata()
    except (SafetensorError, OSError, ValueError, RuntimeError, TypeError, KeyError) as exc:
        raise InputError(f"{one_line(str(path))}: not a readable safetensors file ({one_line(str(exc))[:200]}); "
                         "restore it from its source") from None


def write_checkpoint(
    folder: str | Path,
    config: Mapping,
    tensors: Mapping[str, torch.Tensor],
    extra_files: Mapping[str, str | bytes] | None = None,
) -> None:
    """Write `config.json`, `model.safetensors` and `extra_files` into the existing `folder`.

    The folder should be a staging folder from `alibi.io.atomic.staged_dir`. Tensors are written
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

    Returns `{"tensors_sha256": <tensor digest>, "verified": bool, "folder_sha256": <digest or None>}`: with a
    manifest, every file must match it (InputError naming the first mismatch), the tensor digest is the one it
    records, and `folder_sha256` is the folder's `digest_tree`, taken from the digests just verified (every file
    of the folder is listed and matches, so the listing is the same) rather than by reading the weights again;
    without one (e.g. a checkpoint made by llm-compressor) the tensor digest is computed, `verified` is False
    and `folder_sha256` None.
    """
    folder = Path(folder)
    read_config(folder)
    if not (folder / MANIFEST_FILE).is_file():
        return {"tensors_sha256": tensors_sha256(read_tensors(folder)), "verified": False, "folder_sha256": None}
    manifest = read_manifest(folder)
    problems = verify_files(folder)
    if problems:
        raise InputError(f"{folder}: does not match its manifest ({problems[0]}); re-run `alibi model prepare` "
                         "or restore the checkpoint")
    recorded = (manifest.predicate.get("parameters") or {}).get("tensors_digest") or {}
    digest = recorded.get("sha256") or tensors_sha256(read_tensors(folder))
    folder_digest = sha256_listing(sorted((s.name, s.sha256) for s in manifest.subjects))
    return {"tensors_sha256": digest, "verified": True, "folder_sha256": folder_digest}


def checkpoint_resource(name: str, folder: str | Path, checked: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest input record of the checkpoint in `folder` that `verified_checkpoint` returned `checked` for:
    its folder digest is the verified one when there is one (the weights are not read again), else computed."""
    if checked.get("folder_sha256") is None:
        return resource(name, folder)
    return {"name": name, "digest": digest_set(checked["folder_sha256"])}
