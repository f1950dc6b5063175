"""Tiles: one GEMM invocation's operands, and their stable on-disk format.

A tile is one `.safetensors` file:

| tensor | dtype | shape | meaning |
|---|---|---|---|
| `a_q` | int8 (or float8_e4m3fn) | `[M,K]` | quantized activations |
| `s_a` | float32 | `[M]` (fp8: `[M]` or `[1]`) | per-token activation scale |
| `w_q` | int8 (or float8_e4m3fn) | `[N,K]` | quantized weights |
| `s_w` | float32 | `[N]` (fp8: `[N]` or `[1]`) | per-channel weight scale |
| `bias` (optional) | bfloat16, float16 or float32 | `[N]` | added in the epilogue |

A block-scaled fp8 tile (`alibi.exact.fp8_block`) says so in its metadata, `scale_layout = block:1x<k>:<n>x<k>`
(DeepSeek-V3's `block:1x128:128x128`): its scales are then `s_a` [M, ceil(K/k)] (one per row and k group) and `s_w`
[ceil(N/n), ceil(K/k)] (the checkpoint's `weight_scale_inv`), both float32, its format is `fp8_e4m3_block`, and the
scales enter the accumulation itself (`alibi.exact.fp8_block_mma`), not the epilogue.

String metadata: `name` (the tile's name; default: the file stem), `out_dtype` (`bfloat16` or
`float16`; default `bfloat16`), and any other keys, kept in `Tile.meta`. The product is
`Y = out_dtype( float(a_q @ w_qᵀ) · s_a[:,None] · s_w[None,:] (+ bias) )`.

Loading validates everything and raises InputError naming the file and the problem; it never
repairs a tile. Subnormal scales are valid (and reported by the checks), zero, negative and
non-finite scales are not.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load as load_safetensors

from alibi.errors import InputError, one_line, shown
from alibi.exact.fp8_block import LAYOUT_KEY, BlockLayout
from alibi.exact.numerics import FLOAT_DTYPES, dtype_name
from alibi.io import atomic
from alibi.io.digests import sha256_bytes
from alibi.io.limits import check_gemm_size
from alibi.tiles.safetensors_header import read_header

OPERAND_DTYPES = {torch.int8: "int8", torch.float8_e4m3fn: "fp8_e4m3"}
BLOCK_FORMAT = "fp8_e4m3_block"  # the format of a tile whose metadata names a block-scaled layout
BIAS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
OUT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
_KNOWN_TENSORS = {"a_q", "s_a", "w_q", "s_w", "bias"}


@dataclass(frozen=True)
class Tile:
    """Operands of one scaled GEMM call. Tensors live on the CPU unless moved by a kernel."""

    name: str
    a_q: torch.Tensor
    s_a: torch.Tensor
    w_q: torch.Tensor
    s_w: torch.Tensor
    bias: torch.Tensor | None = None
    out_dtype: torch.dtype = torch.bfloat16
    meta: Mapping[str, str] = field(default_factory=dict)

    @property
    def M(self) -> int:
        return self.a_q.shape[0]

    @property
    def K(self) -> int:
        return self.a_q.shape[1]

    @property
    def N(self) -> int:
        return self.w_q.shape[0]

    @property
    def fmt(self) -> str:
        return BLOCK_FORMAT if LAYOUT_KEY in self.meta else OPERAND_DTYPES[self.a_q.dtype]

    @property
    def block_layout(self) -> BlockLayout | None:
        """The block-scaled layout its `scale_layout` metadata names (None for per-row and per-tensor scales)."""
        return BlockLayout.parse(self.meta[LAYOUT_KEY]) if LAYOUT_KEY in self.meta else None

    def replace(self, **changes) -> Tile:
        return dataclasses.replace(self, **changes)

    def rows(self, index: torch.Tensor | slice) -> Tile:
        """The sub-tile made of the given activation rows (weights unchanged)."""
        s_a = self.s_a if self.s_a.numel() == 1 and self.fmt != "int8" else self.s_a[index]
        return self.replace(a_q=self.a_q[index], s_a=s_a)

    def validate(self, origin: str | None = None) -> Tile:
        """Raise InputError (naming `origin`, default the tile name) unless the operands are well formed."""
        where = origin or f"tile {self.name!r}"

        def bad(problem: str) -> InputError:
            return InputError(f"{where}: {problem}")

        if LAYOUT_KEY in self.meta:
            return self._validate_block(bad)
        if self.a_q.dtype not in OPERAND_DTYPES:
            raise bad(f"a_q has dtype {dtype_name(self.a_q.dtype)}; expected int8 (or float8_e4m3fn)")
        if self.w_q.dtype != self.a_q.dtype:
            raise bad(f"w_q has dtype {dtype_name(self.w_q.dtype)} but a_q is {dtype_name(self.a_q.dtype)}; "
                      "both operands must share one format")
        if self.a_q.dim() != 2 or self.w_q.dim() != 2:
            raise bad(f"a_q {list(self.a_q.shape)} and w_q {list(self.w_q.shape)} must both be 2-D ([M,K] and [N,K])")
        M, K = self.a_q.shape
        N, K_w = self.w_q.shape
        if K_w != K:
            raise bad(f"K mismatch: a_q is [M={M}, K={K}] but w_q is [N={N}, K={K_w}]")
        if min(M, N, K) == 0:
            raise bad(f"empty operands (M={M}, K={K}, N={N})")
        per_tensor_ok = self.fmt != "int8"
        for label, scale, rows in (("s_a", self.s_a, M), ("s_w", self.s_w, N)):
            allowed = [(rows,)] + ([(1,)] if per_tensor_ok else [])
            self._check_scale(bad, label, scale, allowed)
        return self._validate_rest(bad, N)

    @staticmethod
    def _check_scale(bad, label: str, scale: torch.Tensor, allowed: list[tuple[int, ...]]) -> None:
        if scale.dtype != torch.float32:
            raise bad(f"{label} has dtype {dtype_name(scale.dtype)}; expected float32")
        if tuple(scale.shape) not in allowed:
            want = " or ".join(str(list(s)) for s in allowed)
            raise bad(f"{label} has shape {list(scale.shape)}; expected {want}")
        if not bool(torch.isfinite(scale).all()):
            raise bad(f"{label} contains non-finite values (inf or NaN); scales must be positive and finite")
        if not bool((scale > 0).all()):
            raise bad(f"{label} contains zero or negative values (min {scale.min().item()!r}); "
                      "scales must be positive")

    def _validate_rest(self, bad, N: int) -> Tile:
        if self.bias is not None:
            if self.bias.dtype not in BIAS_DTYPES:
                raise bad(f"bias has dtype {dtype_name(self.bias.dtype)}; expected bfloat16, float16 or float32")
            if tuple(self.bias.shape) != (N,):
                raise bad(f"bias has shape {list(self.bias.shape)}; expected [{N}]")
        if self.out_dtype not in OUT_DTYPES.values():
            raise bad(f"out_dtype {dtype_name(self.out_dtype)} is not supported; use bfloat16 or float16")
        return self

    def _validate_block(self, bad) -> Tile:
        """A block-scaled tile: e4m3 operands, 2-D scales of the shapes its layout gives (module docstring)."""
        try:
            layout = BlockLayout.parse(self.meta[LAYOUT_KEY])
        except InputError as exc:
            raise bad(f"metadata {LAYOUT_KEY}: {exc}") from None
        for label, t in (("a_q", self.a_q), ("w_q", self.w_q)):
            if t.dtype != torch.float8_e4m3fn:
                raise bad(f"{label} has dtype {dtype_name(t.dtype)}; a block-scaled tile ({layout.text}) holds "
                          "float8_e4m3fn operands")
        if self.a_q.dim() != 2 or self.w_q.dim() != 2 or self.a_q.shape[1] != self.w_q.shape[1]:
            raise bad(f"a_q {list(self.a_q.shape)} and w_q {list(self.w_q.shape)} must be [M,K] and [N,K]")
        (M, K), N = self.a_q.shape, self.w_q.shape[0]
        if min(M, N, K) == 0:
            raise bad(f"empty operands (M={M}, K={K}, N={N})")
        self._check_scale(bad, "s_a", self.s_a, [layout.a_scale_shape(M, K)])
        self._check_scale(bad, "s_w", self.s_w, [layout.w_scale_shape(N, K)])
        return self._validate_rest(bad, N)


_SAFETENSORS_DTYPE = {torch.int8: "I8", torch.uint8: "U8", torch.int16: "I16", torch.int32: "I32",
                      torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32",
                      torch.float64: "F64", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}


def safetensors_bytes(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> bytes:
    """Serialize to the safetensors format with a canonical layout: same tensors → same bytes.

    The `safetensors` library writes its metadata from a hash map, so its key order (and the file's
    digest) varies between runs; tile digests must not. Here tensors are laid out in name order and
    the JSON header is written with sorted keys, padded with spaces to 8 bytes as the format asks.
    """
    header: dict[str, object] = {"__metadata__": dict(sorted(metadata.items()))} if metadata else {}
    chunks, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _SAFETENSORS_DTYPE[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def tile_bytes(tile: Tile) -> bytes:
    """The tile serialized in the documented safetensors format (canonical, deterministic bytes)."""
    tensors = {"a_q": tile.a_q, "s_a": tile.s_a, "w_q": tile.w_q, "s_w": tile.s_w}
    if tile.bias is not None:
        tensors["bias"] = tile.bias
    metadata = {**{str(k): str(v) for k, v in tile.meta.items()},
                "name": tile.name, "out_dtype": dtype_name(tile.out_dtype)}
    return safetensors_bytes(tensors, metadata)


def save_tile(tile: Tile, path: str | Path) -> Path:
    """Validate and write one tile atomically."""
    tile.validate()
    return atomic.write_bytes(path, tile_bytes(tile))


def load_tile(path: str | Path) -> Tile:
    """Read and validate one tile file; InputError names the file and what is wrong (`read_tile`)."""
    return read_tile(path)[0]


def read_tile(path: str | Path) -> tuple[Tile, str]:
    """Read and validate one tile file; returns the tile and the sha256 of the very bytes it was parsed from.

    The header is read and checked first (`alibi.tiles.safetensors_header`: only its bytes are read, and
    every malformation is an InputError), then the tensor names and the GEMM's size against the
    element budget (`alibi.io.limits`); only then is the file read, once: the digest and the tensors
    come from the same bytes, so a manifest pins what was checked.
    """
    path = Path(path)
    where = one_line(str(path))
    if not path.is_file():
        raise InputError(f"{where}: no such tile file")
    header = read_header(path, "tile")
    metadata = dict(header.metadata)
    missing = [k for k in ("a_q", "s_a", "w_q", "s_w") if k not in header.tensors]
    if missing:
        raise InputError(f"{where}: missing tensor(s) {', '.join(missing)}; a tile needs a_q, s_a, w_q, s_w")
    extra = sorted(set(header.tensors) - _KNOWN_TENSORS)
    if extra:
        raise InputError(f"{where}: unknown tensor(s) {one_line(', '.join(extra))[:200]}; a tile holds a_q, s_a, w_q, "
                         "s_w, bias")
    for tensor, entry in header.tensors.items():  # before the library parses them (it raises KeyError on these)
        if entry.dtype not in _SAFETENSORS_DTYPE.values():
            raise InputError(f"{where}: tensor {tensor} has dtype {shown(entry.dtype)}, which no tile tensor has (a_q "
                             "and w_q: int8 or float8_e4m3fn; s_a, s_w: float32; bias: bfloat16, float16 or float32)")
    a_shape, w_shape = header.tensors["a_q"].shape, header.tensors["w_q"].shape
    if len(a_shape) == 2 and len(w_shape) == 2:
        check_gemm_size(a_shape[0], a_shape[1], w_shape[0], where)
    out_name = metadata.pop("out_dtype", "bfloat16")
    if out_name not in OUT_DTYPES:
        raise InputError(f"{where}: out_dtype {shown(out_name)} is not supported; use bfloat16 or float16")
    try:
        data = path.read_bytes()
        tensors = load_safetensors(data)
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the library raises on these bytes is a bad input file
        raise InputError(f"{where}: truncated or not a safetensors file ({one_line(str(exc))[:200]})") from None
    name = metadata.pop("name", path.stem)
    tile = Tile(name=name, a_q=tensors["a_q"], s_a=tensors["s_a"], w_q=tensors["w_q"], s_w=tensors["s_w"],
                bias=tensors.get("bias"), out_dtype=OUT_DTYPES[out_name], meta=metadata)
    return tile.validate(origin=where), sha256_bytes(data)


def load_tile_dir(folder: str | Path) -> list[Tile]:
    """Every `*.safetensors` tile in `folder` (sorted by file name); an empty folder is an error."""
    return [t for t, _ in read_tile_dir(folder).values()]


def read_tile_dir(folder: str | Path) -> dict[str, tuple[Tile, str]]:
    """Every `*.safetensors` tile in `folder` by file name (sorted), each with the sha256 of its bytes
    (`read_tile`); an empty folder, or two tiles of one name, is an error."""
    folder = Path(folder)
    where = one_line(str(folder))
    if not folder.is_dir():
        raise InputError(f"{where}: not a folder of tiles")
    try:
        paths = sorted(p for p in folder.glob("*.safetensors") if not p.name.startswith("."))
    except OSError as exc:
        raise InputError(f"{where}: cannot list the folder ({exc.strerror})") from None
    if not paths:
        raise InputError(f"{where}: holds no *.safetensors tiles")
    read = {p.name: read_tile(p) for p in paths}
    names = [t.name for t, _ in read.values()]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InputError(f"{one_line(str(folder))}: several tiles share the name(s) {one_line(', '.join(dupes))[:200]}; "
                         "names must be unique")
    return read


__all__ = ["FLOAT_DTYPES", "OUT_DTYPES", "Tile", "load_tile", "load_tile_dir", "read_tile", "read_tile_dir",
           "save_tile", "tile_bytes"]
