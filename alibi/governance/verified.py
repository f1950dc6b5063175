"""Reading a result alibi wrote: only once its manifest vouches for every byte of it.

Every command that reads a folder or file an earlier `alibi` command wrote (`locate`, `prereg evaluate`,
`report html`, `analyze`, `conform --replay`) goes through this module, so that a result that was edited,
truncated, added to, or forged never yields a verdict. Three things are checked before a byte is used:

1. **the manifest**: the folder's `manifest.json` (for a file, that of the nearest folder at or above it
   holding one — an `alibi run` folder covers its `report/report.json`) reads back, every file it lists
   has the bytes it pins, and no file is in the folder that it does not list (`verify_files`, exact);
2. **the kind**: the manifest's kind is one this reader reads (`predicateType`, e.g. `replay` for a
   greedy run), so a flip analysis passed where a matrix belongs is refused by what it is, not by
   whichever field happens to be missing;
3. **the schema**: the document parses as the reader's type (`alibi.io.typed.TypedResult`, with the
   document's own consistency checks) and its `schema` is one the reader understands — an older
   version that lacks what the command compares (a greedy run without logit digests, for `locate`)
   is refused rather than compared on what it has.

A file is hashed from the very bytes that are then parsed, so what was verified is what is used. Every
refusal is an `InputError` (exit 2) of one line that names the file and says what to do.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from alibi.errors import InputError, one_line
from alibi.governance.manifest import MANIFEST_NAME, Manifest, read_manifest, subject_problems
from alibi.io.typed import TypedResult

R = TypeVar("R", bound=TypedResult)


@dataclass(frozen=True)
class VerifiedFile:
    """A file of a verified result: `path` as given, `data` the bytes that matched the manifest's pin,
    `sha256` that pin (the digest of `data`), `manifest` the manifest that pins them."""

    path: Path
    data: bytes
    sha256: str
    manifest: Manifest

    def text(self) -> str:
        try:
            return self.data.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{one_line(str(self.path))}: is not UTF-8 text; re-run the command that wrote "
                             "it") from None


def covering_manifest(path: str | os.PathLike) -> Path | None:
    """The `manifest.json` that covers `path`: the folder's own for a folder, for a file the one of the
    nearest folder at or above it that holds one (None when no folder does)."""
    p = Path(path).absolute()
    for folder in ([p] if p.is_dir() else []) + list(p.parents):
        if (folder / MANIFEST_NAME).is_file():
            return folder / MANIFEST_NAME
    return None


def verified_manifest(path: str | os.PathLike, kinds: Collection[str] | None, *, fix: str,
                      data: bytes | None = None) -> Manifest:
    """The manifest covering `path` (a result folder, or a file inside one) once every file it lists
    verifies, no unlisted file is there, and its kind is one of `kinds` (None: any alibi kind).

    fix: what to do about a refused result (appended to every error), e.g. "re-run `alibi replay greedy`".
    data: the bytes of the file `path`, already read by the caller: checked as they are, not read again.
    InputError (exit 2) of one line naming `path` otherwise."""
    label = one_line(str(path))
    if not Path(path).exists():
        raise InputError(f"{label}: no such file or folder; {fix}")
    found = covering_manifest(path)
    if found is None:
        raise InputError(f"{label}: no {MANIFEST_NAME} covers it, so nothing vouches for its bytes; pass the "
                         f"whole folder alibi wrote, or {fix}")
    try:
        manifest = read_manifest(found)
        read = {} if data is None else {Path(path).absolute().relative_to(manifest.folder).as_posix(): data}
        problems = subject_problems(manifest, read=read)
    except InputError as exc:
        raise InputError(f"{label}: its manifest cannot be read ({exc}); {fix}") from None
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InputError(f"{label}: fails its manifest {one_line(str(found))}: {one_line(problems[0])}{more}; "
                         f"the result was changed after alibi wrote it: {fix}")
    if kinds is not None and manifest.kind not in kinds:
        raise InputError(f"{label}: its manifest says it is a {manifest.kind!r} result, not "
                         f"{' or '.join(repr(k) for k in kinds)}; pass the result this command reads, or {fix}")
    return manifest


def verified_file(path: str | os.PathLike, kinds: Collection[str] | None, *, fix: str) -> VerifiedFile:
    """The bytes of the file `path` once its manifest verifies (`verified_manifest`) and pins exactly
    these bytes (read once, hashed once, and returned: what was checked is what the caller parses)."""
    p = Path(path)
    label = one_line(str(p))
    if p.is_dir():
        raise InputError(f"{label}: is a folder; pass the result file inside it")
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        data = None  # `verified_manifest` names it
    except OSError as exc:
        raise InputError(f"{label}: cannot be read ({exc.strerror}); {fix}") from None
    manifest = verified_manifest(p, kinds, fix=fix, data=data)
    rel = p.absolute().relative_to(manifest.folder).as_posix()
    pinned = {s.name: s.sha256 for s in manifest.subjects}.get(rel)
    if pinned is None or data is None:  # e.g. the manifest itself (a listed file read as missing fails above)
        raise InputError(f"{label}: not listed in {one_line(str(manifest.path))}; {fix}")
    return VerifiedFile(p, data, pinned, manifest)


def read_verified(path: str | os.PathLike, result: type[R], kinds: Collection[str] | None, *,
                  schemas: Collection[str] | None = None, lacks: str = "", fix: str | None = None) -> R:
    """The result document `path` (a file, or a folder holding `result.FILE`) as `result`, once it verifies:
    manifest and kind (`verified_file`), then the document (`result.from_json`, its own consistency checks).

    schemas: the schema versions this reader compares (default: every version `result` reads); a document of
    another version that `result` still reads is refused, saying it `lacks` what is compared (e.g. "logit
    digests"). fix: what to do about a refused result (default `result.REMEDY`)."""
    p = Path(path)
    f = p / result.FILE if p.is_dir() else p
    fix = fix or result.REMEDY
    verified = verified_file(f, kinds, fix=fix)
    doc = result.from_json(verified.text(), one_line(str(f)))
    schema = getattr(doc, "schema", None)
    if schemas is not None and schema not in schemas:
        raise InputError(f"{one_line(str(f))}: schema {schema!r} " + (f"has no {lacks}, which this command compares"
                         if lacks else "is not one this command reads") + f" (it reads {', '.join(schemas)}); {fix}")
    return doc


__all__ = ["VerifiedFile", "covering_manifest", "read_verified", "verified_file", "verified_manifest"]
