"""Pre-registration: a protocol folder whose files are pinned by hash before anything is measured.

A protocol folder (conventionally `prereg/<study>/`) holds `protocol.md`, prediction lists and
analysis parameters — any files. Two files are the folder's own record and never pinned:

- `lock.json` — written once by `lock`: the sha256 of every file at that moment.
- `amendments.jsonl` — one line per amendment: the reason, the UTC time, which files were added,
  modified or removed with their new digests, and `prev`, the hash of the entry before it (the
  lock's hash for the first). Entries are hash-chained.

Argument for tamper evidence. Both records are stored in one canonical serialization (sorted
keys; lock: two-space indent; log: compact, one entry per line) and each carries the sha256 of its
own content (`content_sha256`, `entry_sha256`). Any byte changed in either is therefore caught:
the bytes are no longer canonical, or the content no longer hashes to its recorded value. An
entry removed, inserted or moved breaks the `prev` chain or the `seq` numbering. The log's last
entry cannot be dropped unnoticed either, because an amendment always changes at least one file:
the files on disk would then no longer match the digests the shortened log implies. Someone who
rewrites the files *and* recomputes every hash is caught only by outside anchors: git history,
and the lock and head hashes that every result produced under the protocol records.

One writer at a time. `lock` and `amend` hold an exclusive lock on the protocol folder itself
(`flock` on its descriptor: released by the kernel when the process ends, so a killed amend leaves
nothing to clean up) from reading the records to writing them; a second `lock` or `amend` of the
same folder meanwhile is refused in one line (exit 2), never queued behind the first to chain onto a
state it did not see. `amend` also compares the log's bytes just before it writes with those it read
first (a compare-and-swap): a log changed in between — by a writer that took no lock, e.g. on a
file system without `flock` — refuses the amendment instead of overwriting the other one.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alibi.errors import InputError, one_line, shown
from alibi.governance.environment import toolkit
from alibi.governance.manifest import folder_files, sha256_file, utc_now
from alibi.io import atomic, jsonio
from alibi.io.digests import sha256_bytes

LOCK_NAME = "lock.json"
LOG_NAME = "amendments.jsonl"
PROTOCOL_NAME = "protocol.md"
LOCK_FORMAT = "alibi-prereg-lock/v1"
RECORDS = (LOCK_NAME, LOG_NAME)

PROTOCOL_TEMPLATE = """\
# {title}

Pre-registered protocol. Lock it (`alibi prereg lock {folder}`) before any measurement it
governs; change it afterwards only through `alibi prereg amend {folder} --reason "..."`.

## Question

What is measured, on which model or operands, with which kernels.

## Predictions

Each prediction is falsifiable and names the check or statistic that decides it. Machine-readable
prediction lists live in `predictions/`.

## Materials

Model checkpoint, prompt set, tokenizer, capture (with their sha256, or the manifests pinned here).

## Procedure

The exact commands, in order (`alibi run experiments/<name>.yaml`).

## Analysis

Statistics, thresholds and exclusion rules (parameters in `analysis.yaml`).

## Deviations

Anything done differently from the above, recorded before the affected results are read.
"""

ANALYSIS_TEMPLATE = """\
# Analysis parameters, fixed before measurement. `criteria` are judged by code
# (alibi.governance.criteria; `alibi run` writes criteria.json, `alibi prereg evaluate` for other results).
scales: [real, pow2]
criteria:
  - id: no-check-fires
    prediction: no conformance check fires on any unit
    source: report
    metric: verdict
    op: "=="
    value: pass
"""


class ProtocolViolation(InputError):
    """A protocol folder is unlocked, damaged, or was changed without an amendment (exit 2)."""


_sha = sha256_bytes  # the toolkit's one byte digest (alibi.io.digests)


def _lock_text(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=True) + "\n"


def _entry_line(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _content_hash(obj: Mapping[str, Any], self_field: str) -> str:
    return _sha(_entry_line({k: v for k, v in obj.items() if k != self_field}).encode("ascii"))


def protocol_files(folder: str | os.PathLike, undecodable: list[str] | None = None) -> dict[str, str]:
    """`{relative path: sha256}` of every pinned file of the folder (all but dotfiles and its records).
    A file whose name is not valid UTF-8 cannot be pinned: refused, or listed in `undecodable`."""
    root = Path(folder)
    return {rel: sha256_file(root / rel) for rel in folder_files(root, exclude=RECORDS, undecodable=undecodable)}


@dataclass(frozen=True)
class Change:
    """One file's change in an amendment: `change` is added | modified | removed."""

    path: str
    change: str
    sha256: str | None
    previous_sha256: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "change": self.change, "sha256": self.sha256,
                "previous_sha256": self.previous_sha256}


@dataclass(frozen=True)
class ProtocolState:
    """What a protocol folder's records say, after checking them.

    locked: a lock exists; lock_sha256: hash of `lock.json`'s bytes; head_sha256: hash of the
    last amendment (the lock's hash when there is none); amendments: how many; pinned: the
    digests the records imply for every file; problems: every inconsistency found, each naming
    the file; pending: changes on disk not yet recorded by an amendment.
    """

    folder: Path
    locked: bool
    lock_sha256: str | None
    head_sha256: str | None
    amendments: int
    pinned: Mapping[str, str]
    problems: tuple[str, ...]
    pending: tuple[Change, ...]


@dataclass(frozen=True)
class ProtocolRecord:
    """What a result produced under a protocol records: the folder, lock hash and head hash."""

    folder: str
    lock_sha256: str
    head_sha256: str
    amendments: int

    def as_dict(self) -> dict[str, Any]:
        return {"folder": self.folder, "lock_sha256": self.lock_sha256, "head_sha256": self.head_sha256,
                "amendments": self.amendments}


try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: the compare-and-swap in `amend` still refuses a lost update
    fcntl = None


@contextlib.contextmanager
def _one_writer(root: Path, command: str) -> Iterator[None]:
    """Hold the folder's exclusive lock (module docstring: one writer at a time) for the block; InputError
    when another process holds it."""
    if fcntl is None:
        yield
        return
    try:
        fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise InputError(f"{root}: cannot open the protocol folder ({exc.strerror}); check the path") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"{root}: another `alibi prereg lock` or `amend` is writing this protocol's records "
                             f"right now, so this `{command}` was refused and nothing was written; when it has "
                             f"finished, check `alibi prereg status {root}` and run this again if a change is still "
                             "unrecorded") from None
        except OSError:  # a file system without flock: the compare-and-swap in `amend` still guards the log
            pass
        yield
    finally:
        os.close(fd)


def _log_bytes(root: Path) -> bytes | None:
    try:
        return (root / LOG_NAME).read_bytes()
    except FileNotFoundError:
        return None


def _require_folder(folder: Path) -> None:
    if not folder.is_dir():
        raise InputError(f"{folder}: no such protocol folder; create one with `alibi prereg init {folder}`")


def init(folder: str | os.PathLike, title: str | None = None) -> list[Path]:
    """Create a protocol folder with a `protocol.md` template, `analysis.yaml` and `predictions/`.

    Refuses (InputError) a folder that already holds anything. Returns the files written.
    """
    root = Path(folder)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise InputError(f"{root}: already exists and is not empty; choose a new folder under prereg/")
    title = title or root.name.replace("-", " ").capitalize()
    written = [
        atomic.write_text(root / PROTOCOL_NAME, PROTOCOL_TEMPLATE.format(title=title, folder=root.as_posix())),
        atomic.write_text(root / "analysis.yaml", ANALYSIS_TEMPLATE),
        atomic.write_text(root / "predictions" / ".gitkeep", ""),
    ]
    return written


def lock(folder: str | os.PathLike) -> str:
    """Pin the sha256 of every file into `lock.json`; return the lock hash.

    Refuses a folder without `protocol.md` and one that is already locked (change a locked
    protocol with `amend`).
    """
    root = Path(folder)
    _require_folder(root)
    with _one_writer(root, "lock"):
        return _lock(root)


def _lock(root: Path) -> str:
    if (root / LOCK_NAME).exists():
        raise InputError(f"{root / LOCK_NAME}: the protocol is already locked; record changes with "
                         f"`alibi prereg amend {root} --reason ...`")
    if (root / LOG_NAME).exists():
        raise InputError(f"{root / LOG_NAME}: an amendment log exists without a lock; remove it before locking")
    if not (root / PROTOCOL_NAME).is_file():
        raise InputError(f"{root / PROTOCOL_NAME}: missing; a protocol folder needs its protocol "
                         f"(`alibi prereg init` writes a template)")

    tk = toolkit()
    body: dict[str, Any] = {
        "format": LOCK_FORMAT,
        "locked_at": utc_now(),
        "toolkit": {"version": tk.version, "git_commit": tk.git_commit},
        "files": [{"path": p, "sha256": d} for p, d in sorted(protocol_files(root).items())],
    }
    body["content_sha256"] = _content_hash(body, "content_sha256")
    text = _lock_text(body)
    atomic.write_text(root / LOCK_NAME, text)
    return _sha(text.encode("ascii"))


def _read_lock(root: Path, problems: list[str]) -> tuple[str, dict[str, str]] | None:
    path = root / LOCK_NAME
    try:
        raw = path.read_bytes()
        body = jsonio.loads(raw, str(path))
    except OSError as exc:
        problems.append(f"{one_line(str(path))}: cannot be read ({exc.strerror})")
        return None
    except InputError:  # not JSON, not UTF-8, or nested deeper than any lock file
        problems.append(f"{one_line(str(path))}: not valid JSON (edited or damaged)")
        return None
    if not isinstance(body, dict) or body.get("format") != LOCK_FORMAT or not isinstance(body.get("files"), list):
        problems.append(f"{path}: not an {LOCK_FORMAT} lock file")
        return None
    if _lock_text(body).encode("ascii") != raw:
        problems.append(f"{path}: bytes are not in the canonical form the lock was written in (edited by hand)")
    if body.get("content_sha256") != _content_hash(body, "content_sha256"):
        problems.append(f"{path}: content no longer matches its content_sha256 (edited)")
    files = body["files"]
    valid = [f for f in files
             if isinstance(f, dict) and isinstance(f.get("path"), str) and isinstance(f.get("sha256"), str)]
    if len(valid) != len(files):
        problems.append(f"{path}: a pinned file entry is malformed")
    paths = [f["path"] for f in valid]
    if paths != sorted(set(paths)):
        problems.append(f"{path}: the pinned file list is reordered or has duplicates")
    pinned = {f["path"]: f["sha256"] for f in valid}
    return _sha(raw), pinned


def _replay_log(root: Path, head: str, pinned: dict[str, str], origin: dict[str, str],
                problems: list[str]) -> tuple[str, int]:
    path = root / LOG_NAME
    if not path.exists():
        return head, 0
    try:
        raw = path.read_bytes()
    except OSError as exc:
        problems.append(f"{one_line(str(path))}: cannot be read ({exc.strerror})")
        return head, 0
    if raw and not raw.endswith(b"\n"):
        problems.append(f"{path}: the last line is incomplete (truncated or edited)")
    lines = raw.split(b"\n")[:-1] if raw.endswith(b"\n") else raw.split(b"\n")
    for i, line in enumerate(lines, start=1):
        where = f"{one_line(str(path))}: entry {i}"
        try:
            entry = jsonio.loads(line, where)
        except InputError:  # not JSON, not UTF-8, or nested deeper than any amendment
            problems.append(f"{where} is not valid JSON (edited or damaged)")
            return head, i - 1
        if not isinstance(entry, dict):
            problems.append(f"{where} is not a JSON object")
            return head, i - 1
        if _entry_line(entry).encode("ascii") != line:
            problems.append(f"{where}: bytes are not in canonical form (edited by hand)")
        if entry.get("entry_sha256") != _content_hash(entry, "entry_sha256"):
            problems.append(f"{where}: content no longer matches its entry_sha256 (edited)")
        if entry.get("seq") != i:
            problems.append(f"{where}: has seq {entry.get('seq')!r}; entries were removed, inserted or reordered")
        if entry.get("prev") != head:
            problems.append(f"{where}: prev does not match the hash of the entry before it "
                            "(an entry was removed, inserted, reordered or edited)")
        changes = entry.get("changes")
        if not isinstance(changes, list) or not changes or not all(isinstance(c, dict) for c in changes):
            problems.append(f"{where}: has no list of changed files")
            changes = []
        for change in changes:
            p, kind, new, old = (change.get(k) for k in ("path", "change", "sha256", "previous_sha256"))
            if not isinstance(p, str) or kind not in ("added", "modified", "removed") \
                    or (new is None) != (kind == "removed") or not isinstance(new, (str, type(None))):
                problems.append(f"{where}: malformed change record {shown(change)}")
                continue
            if pinned.get(p) != old:
                problems.append(f"{where}: records {p} as {kind} from {old}, but the records before it pin {pinned.get(p)}")
            if kind == "removed":
                pinned.pop(p, None)
            else:
                pinned[p] = new
            origin[p] = f"amendment {i}"
        head = entry.get("entry_sha256") if isinstance(entry.get("entry_sha256"), str) else head
    return head, len(lines)


def _pending(pinned: Mapping[str, str], on_disk: Mapping[str, str]) -> tuple[Change, ...]:
    changes = []
    for p in sorted(set(pinned) | set(on_disk)):
        if p not in on_disk:
            changes.append(Change(p, "removed", None, pinned[p]))
        elif p not in pinned:
            changes.append(Change(p, "added", on_disk[p], None))
        elif pinned[p] != on_disk[p]:
            changes.append(Change(p, "modified", on_disk[p], pinned[p]))
    return tuple(changes)


def state(folder: str | os.PathLike) -> ProtocolState:
    """Read and check a protocol folder's records against its files (never raises for tampering)."""
    root = Path(folder)
    _require_folder(root)
    if not (root / LOCK_NAME).is_file():
        on_disk = protocol_files(root)  # nothing is locked yet: a name no record can hold is bad input (exit 2)
        problems = [f"{root}: not locked; run `alibi prereg lock {root}` before measuring"]
        if (root / LOG_NAME).exists():
            problems.append(f"{root / LOG_NAME}: an amendment log exists but the lock file is missing (deleted?)")
        return ProtocolState(root, False, None, None, 0, {}, tuple(problems), _pending({}, on_disk))
    undecodable: list[str] = []
    on_disk = protocol_files(root, undecodable)
    # A file added to a locked folder under a name no record can hold: a verification failure, not bad input.
    problems: list[str] = [f"{path}: added under a name that is not valid UTF-8, which no lock or amendment can "
                           "pin; rename or remove it" for path in undecodable]
    read = _read_lock(root, problems)
    if read is None:
        return ProtocolState(root, True, None, None, 0, {}, tuple(problems), ())
    lock_sha, pinned = read
    origin = {p: "the lock" for p in pinned}
    head, count = _replay_log(root, lock_sha, pinned, origin, problems)
    pending = _pending(pinned, on_disk)
    for c in pending:
        since = origin.get(c.path, "the lock")
        if c.change == "removed":
            problems.append(f"{root / c.path}: deleted after {since} without an amendment")
        elif c.change == "added":
            problems.append(f"{root / c.path}: added without an amendment")
        else:
            problems.append(f"{root / c.path}: edited since {since} without an amendment")
    return ProtocolState(root, True, lock_sha, head, count, dict(pinned), tuple(problems), pending)


def verify(folder: str | os.PathLike) -> list[str]:
    """Every problem with a protocol folder (empty when the files match the lock plus amendments)."""
    return list(state(folder).problems)


def amend(folder: str | os.PathLike, reason: str) -> str:
    """Append a hash-chained amendment recording every file changed since the last record.

    reason: why the protocol changed (required, non-empty). Refuses when the records themselves
    are damaged and when nothing changed (write a deviation into protocol.md first). Returns the
    new head hash.
    """
    root = Path(folder)
    if not reason or not reason.strip():
        raise InputError("an amendment needs a reason: pass --reason \"what changed and why\"")
    _require_folder(root)
    with _one_writer(root, "amend"):
        return _amend(root, reason)


def _amend(root: Path, reason: str) -> str:
    read = _log_bytes(root)  # compared again just before the write: no amendment is overwritten unseen
    st = state(root)
    if not st.locked:
        raise InputError(f"{root}: not locked yet; edit freely, then `alibi prereg lock {root}`")
    damaged = [p for p in st.problems if "without an amendment" not in p]
    if damaged:
        raise ProtocolViolation(f"{root}: its records are damaged, so no amendment can be chained: {damaged[0]}")
    if not st.pending:
        raise InputError(f"{root}: no file changed since the last record; write the deviation into "
                         f"{PROTOCOL_NAME} first, then amend")
    entry: dict[str, Any] = {
        "seq": st.amendments + 1,
        "prev": st.head_sha256,
        "time": utc_now(),
        "reason": reason.strip(),
        "changes": [c.as_dict() for c in st.pending],
    }
    entry["entry_sha256"] = _content_hash(entry, "entry_sha256")
    if _log_bytes(root) != read:
        raise InputError(f"{root / LOG_NAME}: another amendment was recorded while this one was prepared, so this "
                         f"one was refused and nothing was written; check `alibi prereg status {root}` and amend again "
                         "if a change is still unrecorded")
    existing = b"" if read is None else read
    atomic.write_bytes(root / LOG_NAME, existing + _entry_line(entry).encode("ascii") + b"\n")
    return entry["entry_sha256"]


def require_locked(folder: str | os.PathLike) -> ProtocolRecord:
    """The record a result produced under this protocol carries; fails closed otherwise.

    Raises ProtocolViolation when the folder is not locked, its records are damaged, or any file
    changed without an amendment — the message names the file and the fix.
    """
    st = state(folder)
    if st.problems:
        fix = (f"restore the file or record the change with `alibi prereg amend {folder} --reason ...`"
               if st.locked else f"lock it with `alibi prereg lock {folder}`")
        raise ProtocolViolation(f"protocol {folder} cannot be relied on: {st.problems[0]}; {fix}")
    assert st.lock_sha256 is not None and st.head_sha256 is not None
    return ProtocolRecord(str(folder), st.lock_sha256, st.head_sha256, st.amendments)


__all__ = ["LOCK_NAME", "LOG_NAME", "PROTOCOL_NAME", "Change", "ProtocolRecord", "ProtocolState",
           "ProtocolViolation", "amend", "init", "lock", "protocol_files", "require_locked", "state", "verify"]
