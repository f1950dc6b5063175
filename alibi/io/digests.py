"""Content digests: sha256, lowercase hex, of bytes, of a file, and of a listing of files.

The one convention for a *set* of files is a `sha256sum`-style listing: one line
`"<sha256 of the file's bytes>  <name>\\n"` per file, in an order the caller fixes, and the
sha256 of the listing's UTF-8 bytes. It changes when any listed file's bytes, name or presence
change, and not otherwise, and `sha256sum -c` can check a listing written out (the two spaces
are its separator). Every folder digest of the toolkit
is built on `sha256_listing`: a manifest folder (`alibi.governance.manifest.digest_tree`), a
checkpoint (the same function over the checkpoint's own file list), the toolkit's source
(`alibi.governance.provenance.source_digest`), a kernel's source (`kernel_build_digest`) and an
in-memory tile set.

A leaf module (no alibi import but `alibi.errors`) so that every layer can use it without a cycle.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from typing import BinaryIO

from alibi.errors import InputError

CHUNK = 1 << 20  # read files in 1 MiB chunks: constant memory for a 79 MB op library or a checkpoint shard


def sha256_bytes(data: bytes | bytearray | memoryview) -> str:
    """Hex sha256 of `data` (any bytes-like object; a memoryview is hashed without a copy)."""
    return hashlib.sha256(data).hexdigest()


def sha256_stream(fh: BinaryIO) -> str:
    """Hex sha256 of everything left to read in the binary file object `fh`, read in chunks."""
    h = hashlib.sha256()
    while chunk := fh.read(CHUNK):
        h.update(chunk)
    return h.hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes; InputError naming the file when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            return sha256_stream(fh)
    except OSError as exc:
        raise InputError(f"{path}: cannot read it to compute its digest ({exc.strerror})") from None


def listing(entries: Iterable[tuple[str, str]]) -> str:
    """The `sha256sum`-style text of `(name, hex sha256)` pairs, one line each, in the order given."""
    return "".join(f"{digest}  {name}\n" for name, digest in entries)


def sha256_listing(entries: Iterable[tuple[str, str]], header: str = "") -> str:
    """sha256 of `header` followed by the `listing` of `(name, hex sha256)` pairs, in the order given.

    header: a first line that names what the listing describes (a kernel class, say), "" for a
    plain listing; it is part of the hashed text, so two listings with different headers differ.
    """
    return sha256_bytes((header + listing(entries)).encode("utf-8"))


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def digest_set(hex_digest: str) -> dict[str, str]:
    """`{"sha256": hex}` after checking the hex is a well-formed sha256."""
    if not isinstance(hex_digest, str) or not _SHA256.match(hex_digest):
        raise InputError(f"{hex_digest!r} is not a sha256 digest (64 lowercase hex characters)")
    return {"sha256": hex_digest}


__all__ = ["CHUNK", "digest_set", "listing", "sha256_bytes", "sha256_file", "sha256_listing", "sha256_stream"]
