"""Atomic output: a reader sees a complete file or folder, or none at all — or the old one.

Everything is first written under a hidden staging name in the destination's own folder (same
file system, so the final rename is atomic) and renamed into place only once complete. A failure
or a kill in between leaves no partial output at the destination:

- a file is committed by one `os.replace` (an existing file is replaced in the same step);
- a new folder is committed by one `os.replace`; an existing folder is swapped with the staged
  one by one `renameat2(RENAME_EXCHANGE)` (Linux ≥ 3.15 on ext4, xfs, btrfs, tmpfs, overlayfs…),
  so the destination always holds either the whole old folder or the whole new one. Where the
  exchange is not supported (another OS or file system) the old folder is moved aside first and
  the new one renamed in: two renames, and a kill between them leaves the destination absent
  with the old folder kept under a hidden `.old` name beside it.

Staging names are `.<name>.alibi.<host>.<pid>.<random>.partial` (`.old` for a moved-aside
folder). A killed process cannot remove its stage, so every later write to the same destination
first removes the stages of dead processes of this host (`remove_stale_stages`); a stage of a
live process, or of another host sharing the file system, is left alone.

Paths are checked before any work starts: `check_writable_dir` probes the nearest existing
folder by creating (and removing) a hidden file — `os.access` says yes to root even where nothing
can be created, e.g. under /proc — and `refuse_overlap` refuses an output that is, contains or
lies inside one of the command's inputs.

Nothing alibi did not write is deleted: an existing folder is replaced only if alibi wrote every
file and folder in it, hidden ones included (`check_replaceable`, which `staged_dir` applies
before it starts and again just before the swap): each file must be listed in a manifest of the
folder holding it or of one above it (up to the output folder), or be a manifest itself, a stage or
a write probe. Anything else
(a `.git/`, notes, a file added to an earlier output) is refused in one line naming it, and the
folder is left as it was.

A full disk is bad luck, not a bug: when a staged write fails because its file system ran out of
space (ENOSPC or EDQUOT, by errno or in a library's wrapped message; or any OSError/RuntimeError —
torch.save's reports no errno — while less than 1 MiB is left there), the stage is removed and
`DiskFull` (exit 2) names the destination and the fix: free space, or another output location.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from alibi.errors import DiskFull, InputError, is_disk_full, one_line

STAGE_SUFFIX = ".partial"
OLD_SUFFIX = ".old"
PROBE_PREFIX = ".alibi-probe."
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"


def _stage_prefix(path: Path) -> str:
    return f".{path.name}.alibi.{_host()}.{os.getpid()}."


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_stale_stages(path: str | os.PathLike) -> list[Path]:
    """Remove the staging files and folders a killed process left for destination `path`.

    A stage belongs to a dead process when it carries this host's name and a process id that no
    longer exists; those are removed, others left alone. Returns what was removed.
    """
    path = Path(path)
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.alibi\.{re.escape(_host())}\.(\d+)\.[^/]*"
                         rf"({re.escape(STAGE_SUFFIX)}|{re.escape(OLD_SUFFIX)})$")
    removed = []
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        m = pattern.match(entry.name)
        if m is None or int(m.group(1)) == os.getpid() or _pid_alive(int(m.group(1))):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
        removed.append(entry)
    return removed


def _probe(folder: Path) -> str | None:
    """Why a file cannot be created in the existing `folder` (None if it can): create one and remove it."""
    try:
        fd, name = tempfile.mkstemp(prefix=PROBE_PREFIX, dir=folder)
    except OSError as exc:
        return exc.strerror or exc.__class__.__name__
    os.close(fd)
    os.unlink(name)
    return None


def _prepare_parent(path: Path) -> list[Path]:
    """Create the folders on the way to `path` and check the last accepts a file; returns those created,
    innermost first (`_remove_made` takes them away again when the write fails)."""
    label = one_line(str(path))
    made = [p for p in [path.parent, *path.parent.parents] if not p.exists()]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _remove_made(made)
        if is_disk_full(exc):
            raise disk_full(path) from None
        raise InputError(f"{label}: cannot create its folder ({exc.strerror}); choose a writable location") from None
    why = _probe(path.parent)
    if why is not None:
        _remove_made(made)
        raise InputError(f"{one_line(str(path.parent))}: cannot write there ({why}); choose a writable output location")
    return made


def _remove_made(made: list[Path]) -> None:
    """Remove the folders a failed write created on the way to its output (innermost first); rmdir leaves
    any that something else was put in meanwhile."""
    for folder in made:
        with contextlib.suppress(OSError):
            folder.rmdir()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` atomically, with the permissions a plain `open()` would give (0666 & ~umask).

    An existing folder at `path` is refused (InputError): a file cannot replace it.
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{one_line(str(path))}: is a folder; name a file to write (or remove the folder)")
    made = _prepare_parent(path)
    remove_stale_stages(path)
    with _full_disk_is_one_line(path, made):
        fd, tmp = tempfile.mkstemp(prefix=_stage_prefix(path), suffix=STAGE_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600
        _commit(tmp, path)
    except BaseException as exc:
        full = out_of_space(exc, path.parent)  # before the partial file is removed, which frees its space
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        _remove_made(made)
        if full:
            raise disk_full(path) from None
        raise
    return path


NEARLY_FULL = 2**20  # bytes: a write that failed with less than this left is taken for a full disk


def _free_bytes(folder: Path) -> int | None:
    """Bytes this process may still write in `folder`'s file system (root may use the reserved blocks)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize


def out_of_space(exc: BaseException, folder: str | os.PathLike) -> bool:
    """Whether the write that raised `exc` into `folder` failed because its file system is full: the error
    says so (`alibi.errors.is_disk_full`), or it is an OSError or RuntimeError — torch.save's names no
    errno — while less than `NEARLY_FULL` bytes are left there. Our own refusals (InputError) never are."""
    if isinstance(exc, InputError) or not isinstance(exc, Exception):
        return False
    if is_disk_full(exc):
        return True
    if isinstance(exc, (OSError, RuntimeError)):
        free = _free_bytes(Path(folder))
        return free is not None and free < NEARLY_FULL
    return False


def disk_full(path: str | os.PathLike) -> DiskFull:
    """The one-line refusal of an output that did not fit (the partial output already removed)."""
    return DiskFull(f"{one_line(str(path))}: the file system ran out of space while alibi wrote it; nothing was "
                    "written there and no input was changed: free space on that file system, or choose another "
                    "output location")


@contextlib.contextmanager
def _full_disk_is_one_line(path: Path, made: list[Path]) -> Iterator[None]:
    """`disk_full(path)` for a full disk met while creating a stage (only the folders `made` to remove)."""
    try:
        yield
    except BaseException as exc:
        _remove_made(made)
        if isinstance(exc, OSError) and is_disk_full(exc):
            raise disk_full(path) from None
        raise


def _commit(staged: str | os.PathLike, path: str | os.PathLike) -> None:
    """The one rename that makes a staged file or new folder visible (a seam for kill tests)."""
    os.replace(staged, path)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write UTF-8 `text` to `path` atomically."""
    return write_bytes(path, text.encode("utf-8"))


def check_writable_dir(path: str | os.PathLike) -> Path:
    """Fail early (InputError) if `path` cannot become a writable folder; leaves nothing behind.

    The nearest existing folder on the way to `path` must accept a new file (probed by creating
    and removing a hidden one), and no existing part of the way may be a file.
    """
    path = Path(path)
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    label = one_line(str(path))
    if probe.exists() and not probe.is_dir():
        raise InputError(f"{label}: {one_line(str(probe))} is a file, not a folder; choose another output folder")
    why = _probe(probe)
    if why is not None:
        raise InputError(f"{label}: cannot create anything in {one_line(str(probe))} ({why}); choose a writable "
                         "output folder")
    return path


def check_writable_file(path: str | os.PathLike, option: str) -> Path:
    """Fail early (InputError naming `option`) unless a file can be written at `path` later: it is not a
    folder, and its folder exists or can be made, and accepts a new file (`check_writable_dir`)."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{option} {one_line(str(path))}: is a folder; name a file to write")
    try:
        check_writable_dir(path.parent)
    except InputError as exc:
        raise InputError(f"{option} {one_line(str(path))}: {exc}") from None
    return path


def overlaps(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether `a` and `b` are the same path or one lies inside the other (after resolving links)."""
    ra, rb = Path(a).resolve(), Path(b).resolve()
    return ra == rb or ra in rb.parents or rb in ra.parents


def refuse_overlap(out: str | os.PathLike, inputs: Mapping[str, str | os.PathLike | None],
                   what: str = "the output") -> None:
    """InputError unless `out` is disjoint from every input: not the same path, not inside one, not
    holding one. Writing into an input would change it (a capture's manifest overwritten by a
    report), and replacing a folder that holds an input would delete it.

    inputs: label (e.g. "--tiles") → path; None entries are skipped.
    """
    for label, path in inputs.items():
        if path is not None and overlaps(out, path):
            raise InputError(f"{one_line(str(out))}: {what} overlaps {label} {one_line(str(path))} (the same path, or "
                             "one inside the other); write it to a separate location, nothing in an input is changed")


# What alibi's own writes leave inside a folder, of any process or host: stages and moved-aside
# folders (`.<name>.alibi.<host>.<pid>.<random>.partial` / `.old`) and write probes.
_ARTEFACT = re.compile(rf"^\..+\.alibi\.[A-Za-z0-9-]+\.\d+\.[^/]*({re.escape(STAGE_SUFFIX)}|{re.escape(OLD_SUFFIX)})$"
                       rf"|^{re.escape(PROBE_PREFIX)}")


# How a manifest in a folder is read: (its kind, the names it lists) or None when it is not one alibi can read.
# Manifests are a governance concept above this layer: `alibi.governance.manifest` registers its reader here when it
# is imported, and every check below refuses to run without it (fail closed: an output is never replaced unchecked).
ManifestListing = Callable[[Path], "tuple[str, frozenset[str]] | None"]
_manifest_listing: ManifestListing | None = None
MANIFEST_NAME = "manifest.json"


def register_manifest_reader(listing: ManifestListing) -> None:
    """Called by `alibi.governance.manifest` on import (see `_manifest_listing`)."""
    global _manifest_listing
    _manifest_listing = listing


def _listing() -> ManifestListing:
    if _manifest_listing is None:
        raise RuntimeError("alibi.io.atomic: no manifest reader registered; import alibi.governance.manifest before "
                           "writing an output folder")
    return _manifest_listing


def foreign_entry(folder: str | os.PathLike) -> str | None:
    """The first entry below the existing `folder` that alibi did not write, as a path relative to it
    (a folder with a trailing `/`), or None when alibi wrote everything there.

    Every file and folder counts, hidden ones included, walked in name order. alibi wrote a file when
    a readable manifest (`manifest.json`) of its folder or of a folder above it, up to `folder`,
    lists it; a readable manifest is alibi's too, and so are stages and write probes (`_ARTEFACT`).
    A folder is alibi's when everything in it is and it is not empty; a symbolic link never is.
    """
    listing = _listing()
    root = Path(folder)

    def first(rel: str, listed: frozenset[str]) -> str | None:
        here = root / rel if rel else root
        prefix = f"{rel}/" if rel else ""
        manifest = here / MANIFEST_NAME
        if manifest.is_file() and not manifest.is_symlink():
            read = listing(manifest)  # None: not a manifest alibi can read, which vouches for nothing, itself included
            if read is not None:
                listed = listed | {prefix + name for name in read[1]} | {prefix + MANIFEST_NAME}
        with os.scandir(here) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            path = prefix + entry.name
            if _ARTEFACT.match(entry.name):
                continue
            if entry.is_symlink():
                return path
            if entry.is_dir():
                with os.scandir(entry.path) as it:
                    if next(it, None) is None:
                        return f"{path}/"
                found = first(path, listed)
                if found is not None:
                    return found
            elif path not in listed:
                return path
        return None

    return first("", frozenset())


def check_replaceable(path: str | os.PathLike, kind: str | None = None) -> None:
    """InputError unless a new output may replace what is at `path`: nothing, an empty folder, or a
    folder holding only what alibi wrote (`foreign_entry`). The message names the first foreign entry;
    nothing is changed. kind: also require an earlier output of that manifest kind (`report`,
    `matrix`, `replay`, `checkpoint` …) when the folder is not empty, so one command never replaces
    another's result. A file at `path` is left to `check_writable_dir`, which refuses it.
    """
    path = Path(path)
    label = one_line(str(path))
    if path.is_symlink():
        raise InputError(f"{label}: is a symbolic link, which alibi did not make; the output would replace it: "
                         "remove the link or choose another output folder")
    if not path.is_dir():
        return
    foreign = foreign_entry(path)
    if foreign is not None:
        raise InputError(f"{label}: holds {one_line(foreign)!r}, which alibi did not write (no manifest there "
                         "lists it); the new output replaces the whole folder, so move that out of it or choose "
                         "another output folder (nothing was changed)")
    if kind is None or all(_ARTEFACT.match(p.name) for p in path.iterdir()):
        return
    read = _listing()(path / MANIFEST_NAME)
    found = None if read is None else read[0]
    if found != kind:
        what = "no manifest of its own" if found is None else f"a {found} manifest"
        raise InputError(f"{label}: holds an alibi output with {what}, not an earlier {kind} output; choose "
                         "another output folder (nothing was changed)")


def _normal_permissions(root: Path) -> None:
    """Give a staged tree the modes plain mkdir/open would (mkdtemp and mkstemp make 0700/0600)."""
    mask = _umask()
    for folder, _, files in os.walk(root):
        os.chmod(folder, 0o777 & ~mask)
        for name in files:
            f = Path(folder) / name
            if not f.is_symlink():
                os.chmod(f, (0o777 if os.access(f, os.X_OK) else 0o666) & ~mask)


def _renameat2():
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2 = _renameat2()


def exchange(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Swap the two existing paths `a` and `b` in one atomic step; False where the OS or the file
    system cannot (then nothing was changed). Other failures raise OSError."""
    if _RENAMEAT2 is None:
        return False
    rc = _RENAMEAT2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _swap_in(stage: Path, path: Path) -> None:
    """Make the complete `stage` appear at the existing `path` (see the module docstring)."""
    if exchange(stage, path):
        if stage.is_symlink():  # the old destination was a link: drop the link, not its target
            stage.unlink()
        else:
            shutil.rmtree(stage, ignore_errors=True)  # now holds the old folder
        return
    old = Path(tempfile.mkdtemp(prefix=_stage_prefix(path), suffix=OLD_SUFFIX, dir=path.parent))
    os.replace(path, old / "x")
    _commit(stage, path)
    shutil.rmtree(old, ignore_errors=True)


def discard_dir(folder: str | os.PathLike, beside: str | os.PathLike) -> None:
    """Remove `folder` so that a kill at any instant leaves it whole or gone, never half deleted
    under its own name: one rename (`_commit`) to a staging name of destination `beside` — which
    every later write of `beside` removes (`remove_stale_stages`) if a kill stops the deletion —
    then the deletion. `folder` must lie in the folder that holds `beside`."""
    folder, beside = Path(folder), Path(beside)
    if not folder.exists():
        return
    trash = Path(tempfile.mkdtemp(prefix=_stage_prefix(beside), suffix=STAGE_SUFFIX, dir=beside.parent))
    _commit(folder, trash / "x")
    shutil.rmtree(trash, ignore_errors=True)


@contextlib.contextmanager
def staged_dir(path: str | os.PathLike, *, overwrite: bool = True, internal: bool = False) -> Iterator[Path]:
    """Yield an empty staging folder that replaces `path` only if the block completes.

    With `overwrite=False` an existing `path` is refused (InputError). An existing folder that is
    overwritten is swapped out only after the new one is complete, in one atomic exchange where
    the file system supports it; it must hold only what alibi wrote (`check_replaceable`, checked
    before the block and again before the swap). Stale stages of killed runs are removed first.
    internal: `path` is a working folder alibi keeps for itself beside or inside an output (a run's
    units, `alibi run`'s report/ before the run's manifest is written), replaced whole unchecked.
    """
    path = Path(path)
    check_writable_dir(path)
    if (path.exists() or path.is_symlink()) and not overwrite:
        raise InputError(f"{one_line(str(path))}: already exists; remove it or choose another output folder")
    if not internal:
        check_replaceable(path)
    made = _prepare_parent(path)
    remove_stale_stages(path)
    with _full_disk_is_one_line(path, made):
        stage = Path(tempfile.mkdtemp(prefix=_stage_prefix(path), suffix=STAGE_SUFFIX, dir=path.parent))
    try:
        yield stage
        _normal_permissions(stage)
        if path.exists() or path.is_symlink():
            if not internal:  # again: something may have been put there while the stage was filled
                check_replaceable(path)
            _swap_in(stage, path)
        else:
            _commit(stage, path)
    except BaseException as exc:
        # measured before the stage goes; a file inside that did not fit is named by this output's path
        full = isinstance(exc, DiskFull) or out_of_space(exc, path.parent)
        shutil.rmtree(stage, ignore_errors=True)
        _remove_made(made)
        if full:
            raise disk_full(path) from None
        raise
