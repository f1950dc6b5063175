"""Which commit produced a result: the commit whose tree has the result's recorded source digest.

Results computed on a copy of the working tree without git history (the GPU machine gets such a
copy) record `git_commit: null` but always a `source_digest`: the sha256 of the listing of the
package's source files (`source_digest` below). The same listing can be
computed from any commit's tree straight from the object store, so a result can be tied to the
commit(s) whose `alibi/` sources are byte for byte the code that ran — or shown to match none,
which means it ran on uncommitted code.

Argument. sha256 over (file digest, path) pairs is collision-resistant, so equal digests mean
equal source trees; several commits can share one tree (a commit that changed only results or
docs), and all of them are reported, oldest first.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from alibi.errors import InputError
from alibi.io.digests import sha256_bytes, sha256_listing

PACKAGE = "alibi"


SOURCE_SUFFIXES = (".py", ".cu", ".cuh", ".h", ".cpp")


def is_source_file(relative: str) -> bool:
    """Whether a file (path relative to the package folder) counts towards the source digest."""
    return relative.endswith(SOURCE_SUFFIXES) and "__pycache__" not in relative.split("/")


def source_digest(files: Mapping[str, bytes]) -> str:
    """sha256 of the `sha256sum`-style listing of `files` (path relative to the package folder →
    bytes), in path order: the toolkit's `source_digest`, computable from a working tree or from
    any commit's tree (see `alibi.governance.provenance`)."""
    return sha256_listing((rel, sha256_bytes(files[rel])) for rel in sorted(files, key=PurePosixPath))


@dataclass(frozen=True)
class Provenance:
    """recorded: the source digest and git commit the result recorded; matches: commits whose
    tree has that digest (oldest first); searched: how many commits were examined."""

    result: str
    recorded_digest: str
    recorded_commit: str | None
    matches: tuple[str, ...]
    searched: int

    @property
    def found(self) -> bool:
        return bool(self.matches)


def _git(repo: Path, *args: str, data: bytes | None = None) -> bytes:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], input=data, capture_output=True, check=False, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InputError(f"{repo}: cannot run git ({exc}); run this in a git checkout of the toolkit, or give one "
                         "with --repo") from None
    if done.returncode != 0:
        raise InputError(f"{repo}: git {' '.join(args[:2])} failed: {done.stderr.decode(errors='replace').strip()}; "
                         "give the toolkit's git checkout with --repo PATH")
    return done.stdout


def recorded_toolkit(path: str | Path) -> dict[str, Any]:
    """The `toolkit` record of a manifest (file or folder) or of any JSON result carrying one."""
    p = Path(path)
    f = p / "manifest.json" if p.is_dir() else p
    try:
        doc = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"{f}: cannot read it as a JSON result ({exc.__class__.__name__})") from None
    for candidate in (doc.get("predicate", {}) if isinstance(doc, dict) else {}, doc):
        toolkit = candidate.get("toolkit") if isinstance(candidate, dict) else None
        if isinstance(toolkit, dict) and isinstance(toolkit.get("source_digest"), dict):
            return toolkit
    raise InputError(f"{f}: records no toolkit source digest (predicate.toolkit.source_digest); "
                     "pass a manifest written by alibi")


def commit_source_digest(repo: Path, commit: str) -> str:
    """The source digest of `alibi/` in `commit`'s tree, read from the object store."""
    listing = _git(repo, "ls-tree", "-r", "-z", commit, "--", PACKAGE + "/").split(b"\0")
    blobs: list[tuple[str, str]] = []
    for entry in filter(None, listing):
        meta, _, name = entry.partition(b"\t")
        rel = name.decode("utf-8")[len(PACKAGE) + 1:]
        mode, kind, sha = meta.decode().split()
        if kind == "blob" and is_source_file(rel):
            blobs.append((rel, sha))
    contents = _read_blobs(repo, [sha for _, sha in blobs])
    return source_digest({rel: contents[sha] for rel, sha in blobs})


def _read_blobs(repo: Path, shas: list[str]) -> dict[str, bytes]:
    out = _git(repo, "cat-file", "--batch", data="".join(f"{s}\n" for s in shas).encode())
    blobs, pos = {}, 0
    while pos < len(out):
        header_end = out.index(b"\n", pos)
        sha, _kind, size = out[pos:header_end].decode().split()
        start = header_end + 1
        blobs[sha] = out[start:start + int(size)]
        pos = start + int(size) + 1
    return blobs


def _commits(repo: Path) -> Iterator[str]:
    yield from _git(repo, "rev-list", "--reverse", "HEAD").decode().split()


def find_provenance(result: str | Path, repo: str | Path = ".") -> Provenance:
    """Search every commit reachable from HEAD of `repo` for `result`'s recorded source digest."""
    toolkit = recorded_toolkit(result)
    want = toolkit["source_digest"].get("sha256")
    if not isinstance(want, str):
        raise InputError(f"{result}: toolkit.source_digest has no sha256")
    root = Path(repo)
    commits = list(_commits(root))
    matches = tuple(c for c in commits if commit_source_digest(root, c) == want)
    return Provenance(str(result), want, toolkit.get("git_commit"), matches, len(commits))
