"""Atomic output: a reader sees a complete file or folder, or none at all.

Everything is first written under a hidden temporary name in the destination's own folder (same
file system, so the final `os.replace` is atomic) and renamed into place only once complete. A
failure or a kill in between leaves no partial output at the destination.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from alibi.errors import InputError


def _prepare_parent(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{path}: cannot create its folder ({exc.strerror}); choose a writable location") from exc
    if not os.access(path.parent, os.W_OK):
        raise InputError(f"{path.parent}: not writable; choose a writable output location")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` atomically, with the permissions a plain `open()` would give (0666 & ~umask)."""
    path = Path(path)
    _prepare_parent(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write UTF-8 `text` to `path` atomically."""
    return write_bytes(path, text.encode("utf-8"))


def check_writable_dir(path: str | os.PathLike) -> Path:
    """Fail early (InputError) if `path` cannot become a writable folder; creates nothing."""
    path = Path(path)
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise InputError(f"{path}: {probe} is a file, not a folder; choose another output folder")
    if not os.access(probe, os.W_OK):
        raise InputError(f"{path}: {probe} is not writable; choose a writable output folder")
    return path


def _normal_permissions(root: Path) -> None:
    """Give a staged tree the modes plain mkdir/open would (mkdtemp and mkstemp make 0700/0600)."""
    mask = _umask()
    for folder, _, files in os.walk(root):
        os.chmod(folder, 0o777 & ~mask)
        for name in files:
            f = Path(folder) / name
            if not f.is_symlink():
                os.chmod(f, (0o777 if os.access(f, os.X_OK) else 0o666) & ~mask)


@contextlib.contextmanager
def staged_dir(path: str | os.PathLike, *, overwrite: bool = True) -> Iterator[Path]:
    """Yield an empty staging folder that replaces `path` only if the block completes.

    With `overwrite=False` an existing `path` is refused (InputError). An existing folder that is
    overwritten is swapped out only after the new one is complete.
    """
    path = Path(path)
    check_writable_dir(path)
    if path.exists() and not overwrite:
        raise InputError(f"{path}: already exists; remove it or choose another output folder")
    _prepare_parent(path)
    stage = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent))
    try:
        yield stage
        _normal_permissions(stage)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, old / "x")
            os.replace(stage, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(stage, path)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
