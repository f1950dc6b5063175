"""The header of a safetensors file, read and validated without reading the tensors.

Format (https://github.com/huggingface/safetensors#format): 8 bytes little-endian `n`, then `n`
bytes of UTF-8 JSON — an object mapping each tensor name to `{dtype, shape, data_offsets}` plus an
optional `__metadata__` object of string → string — then the tensor bytes, offsets relative to
the end of the header.

Argument for reading only this much. `n` is checked against the file's size (from `fstat`) before
anything is read, so a file claiming a header larger than itself, or an 8 GiB sparse file, costs
8 + n bytes of reading at most, and n is capped at 100 MB (safetensors' own limit). Shapes and
offsets are checked against the data size, so a caller can bound the work a file asks for
(`alibi.io.limits`) before any tensor is loaded. Every way the bytes can be malformed — too short, not
UTF-8, not JSON, nested JSON, not an object, a `__metadata__` that is not a string map, an entry
without dtype/shape/offsets, offsets outside the data, a size that disagrees with dtype × shape,
tensors not laid out back to back, bytes after the last tensor —
is an InputError naming the file; so is an unreadable file (permissions, a folder, I/O errors).
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from alibi.errors import InputError, one_line, shown
from alibi.io import jsonio

HEADER_LIMIT = 100_000_000  # bytes; safetensors refuses larger headers too (MAX_HEADER_SIZE)
METADATA_KEY = "__metadata__"
ITEM_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
              "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor's header entry: safetensors `dtype` name, `shape`, and byte range [start, end) of the data."""

    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Header:
    """A validated header: `tensors` by name, the string `metadata`, and the size of the data section."""

    tensors: Mapping[str, TensorEntry]
    metadata: Mapping[str, str]
    data_size: int


def _entry(name: str, raw: object, data_size: int, bad) -> TensorEntry:
    if not isinstance(raw, dict):
        raise bad(f"tensor {shown(name)} has header entry {shown(raw)}, not an object")
    dtype, shape, offsets = raw.get("dtype"), raw.get("shape"), raw.get("data_offsets")
    if not isinstance(dtype, str):
        raise bad(f"tensor {shown(name)} has dtype {shown(dtype)}, not a string")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise bad(f"tensor {shown(name)} has shape {shown(shape)}, not a list of non-negative integers")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_size):
        raise bad(f"tensor {shown(name)} has data_offsets {shown(offsets)}, not [begin, end] within the "
                  f"{data_size} data bytes")
    entry = TensorEntry(dtype, tuple(shape), offsets[0], offsets[1])
    size = ITEM_SIZES.get(dtype)
    if size is not None and entry.numel * size != entry.end - entry.start:
        raise bad(f"tensor {shown(name)} is {dtype} {list(shape)} ({entry.numel * size} bytes) but its "
                  f"data_offsets span {entry.end - entry.start} bytes")
    return entry


def read_header(path: str | os.PathLike, what: str = "safetensors file") -> Header:
    """The validated header of the safetensors file at `path` (see the module docstring).

    what: how errors describe the file ("tile", "checkpoint shard", ...).
    """
    path = Path(path)
    label = one_line(str(path))

    def bad(problem: str) -> InputError:
        return InputError(f"{label}: not a valid {what}: {problem}")

    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < 8:
                raise bad(f"only {size} bytes, less than the 8-byte header length")
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > size - 8:
                raise bad(f"the header claims {n} bytes but only {size - 8} follow (truncated?)")
            if n > HEADER_LIMIT:
                raise bad(f"the header claims {n} bytes, more than the {HEADER_LIMIT} safetensors allows")
            raw = fh.read(n)
    except OSError as exc:
        raise InputError(f"{label}: cannot read the {what} ({one_line(exc.strerror or exc.__class__.__name__)}); "
                         "check the path and its permissions") from None
    if len(raw) != n:
        raise bad(f"the header is cut short ({len(raw)} of {n} bytes)")
    try:
        header = jsonio.loads(raw, label)
    except InputError as exc:
        raise bad(f"its header is unreadable ({str(exc).removeprefix(label + ': ')})") from None
    if not isinstance(header, dict):
        raise bad(f"its header is {type(header).__name__} JSON, not an object")
    metadata = header.pop(METADATA_KEY, None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise bad(f"{METADATA_KEY} is {shown(metadata)}, not an object of strings")
    data_size = size - 8 - n
    tensors = {name: _entry(name, entry, data_size, bad) for name, entry in header.items()}
    # The format lays the tensors out back to back and the data ends with the last one (safetensors
    # refuses anything else, after mapping the whole file): checked here, so a file padded with
    # gigabytes — or a sparse one — is refused before anything maps it.
    end = 0
    for name, entry in sorted(tensors.items(), key=lambda kv: (kv[1].start, kv[1].end)):
        if entry.start != end:
            raise bad(f"tensor {shown(name)} starts at data byte {entry.start}, expected {end} "
                      "(tensors must be laid out back to back)")
        end = entry.end
    if end != data_size:
        raise bad(f"{data_size - end} bytes follow the last tensor's data; the file is padded or damaged")
    return Header(tensors, dict(metadata), data_size)


__all__ = ["HEADER_LIMIT", "ITEM_SIZES", "Header", "TensorEntry", "read_header"]
