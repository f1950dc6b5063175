"""Manifests: an in-toto Statement v1 beside every artifact folder, pinning each file by sha256.

Shape (https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md)::

    {
      "_type": "https://in-toto.io/Statement/v1",
      "subject": [{"name": "<path relative to the folder>", "digest": {"sha256": "<64 hex>"}}, ...],
      "predicateType": "https://integer-alibi.dev/<kind>/v1",
      "predicate": {...run metadata, see `build_predicate`...}
    }

The JSON is written by hand rather than through the `in-toto-attestation` package: that package
builds statements on protobuf's `Struct`, which stores every number as a double (a seed of 42
comes back as `42.0`, 2⁶⁰ loses its low bits) and does not keep key order, so the same predicate
would not serialize to the same bytes. Here the bytes are a pure function of the content
(sorted keys, two-space indent, one trailing newline), which is what lets a resumed run be
byte-compared with an uninterrupted one.

Digests everywhere follow in-toto's DigestSet convention: a key named `digest` or ending in
`_digest` holds `{"sha256": "<64 lowercase hex>"}`. The one field that differs between two
executions of the same work is `predicate.run.created_at` (`TIMESTAMP_FIELD`); nothing else in a
predicate may depend on the clock.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alibi.errors import InputError, one_line
from alibi.governance.environment import environment_record, toolkit_record
from alibi.governance.kernel_log import KernelLog, require_consistent
from alibi.io import atomic, jsonio
from alibi.io.digests import digest_set, sha256_bytes, sha256_file, sha256_listing

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE_PREFIX = "https://integer-alibi.dev/"
MANIFEST_NAME = atomic.MANIFEST_NAME
TIMESTAMP_FIELD = ("predicate", "run", "created_at")

# Artifact kinds the toolkit writes; `predicate_type` accepts any lowercase slug, these are documented.
KINDS = ("tiles", "capture", "predictions", "report", "checkpoint", "prompts", "experiment-run", "flip-analysis",
         "replay")

_KIND = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def predicate_type(kind: str) -> str:
    """The predicateType URI of an artifact kind (`tiles` -> `https://integer-alibi.dev/tiles/v1`)."""
    if not _KIND.match(kind):
        raise InputError(f"manifest kind {kind!r} is not a lowercase slug; use e.g. one of {', '.join(KINDS)}")
    return f"{PREDICATE_TYPE_PREFIX}{kind}/v1"


def folder_files(folder: str | os.PathLike, exclude: Iterable[str] = (MANIFEST_NAME,),
                 undecodable: list[str] | None = None) -> list[str]:
    """Paths (relative, POSIX, sorted) of the files a folder manifest covers.

    Every regular file below `folder` except the relative paths in `exclude` (default: the
    manifest itself) and anything whose name starts with a dot (atomic-write staging files,
    `.gitkeep`, editor droppings). Symbolic links are refused, to files and to folders alike: the
    bytes they point to are not part of the folder (a linked folder is neither followed nor
    skipped). A name that is not valid UTF-8 is refused (InputError), or, when `undecodable` is
    a list, appended to it (as a path string, its raw bytes escaped) and left out.
    """
    exclude = set(exclude)
    root = Path(folder)
    if not root.is_dir():
        raise InputError(f"{root}: not a folder")
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in dirnames:
            if (Path(dirpath) / name).is_symlink():
                raise InputError(f"{one_line(str(Path(dirpath) / name))}: is a symbolic link to a folder; its files "
                                 f"are not part of {one_line(str(root))}: copy them in instead")
        for name in filenames:
            if name.startswith("."):
                continue
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if rel in exclude:
                continue
            if not _utf8(rel):  # a manifest is UTF-8 JSON: it cannot name this file faithfully
                if undecodable is not None:
                    undecodable.append(one_line(str(path)))
                    continue
                raise InputError(f"{one_line(str(path))}: its name is not valid UTF-8, so no manifest can record it; "
                                 "rename the file (the \\xNN shown are its raw bytes)")
            if path.is_symlink():
                raise InputError(f"{path}: is a symbolic link; copy the file into {root} instead")
            if path.is_file():
                out.append(rel)
    return sorted(out)


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a surrogate: a byte of a non-UTF-8 name, as os.fsdecode carries it
        return False
    return True


def digest_tree(folder: str | os.PathLike, files: Iterable[str] | None = None) -> str:
    """One sha256 for a folder: the toolkit's folder digest (`alibi.io.digests.sha256_listing`).

    The listing is `"<sha256>  <relative path>\\n"` per file, sorted by path, so the digest changes
    when any covered file's bytes, name or presence change, and not otherwise. files: the
    relative POSIX paths to cover (default: `folder_files(folder)`, the files a manifest covers);
    a caller with its own notion of the folder's files (a checkpoint, whose Hugging Face snapshot
    links are followed) passes them here rather than hashing its own listing.
    """
    names = folder_files(folder) if files is None else sorted(files)
    return sha256_listing((rel, sha256_file(Path(folder) / rel)) for rel in names)


def digest_path(path: str | os.PathLike) -> str:
    """sha256 of a file, or `digest_tree` of a folder."""
    p = Path(path)
    if p.is_dir():
        return digest_tree(p)
    if p.is_file():
        return sha256_file(p)
    raise InputError(f"{p}: no such file or folder to digest")


def resource(name: str, path: str | os.PathLike) -> dict[str, Any]:
    """An in-toto ResourceDescriptor `{"name", "digest": {"sha256"}}` for a file or folder."""
    return {"name": name, "digest": digest_set(digest_path(path))}


def utc_now() -> str:
    """The current UTC time, ISO 8601 to the second with a `Z` suffix."""
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def canonical_json(obj: Any) -> str:
    """The serialization every manifest uses: sorted keys, two-space indent, trailing newline."""
    return json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


@dataclass(frozen=True)
class Subject:
    """One covered file: `name` relative to the manifest's folder, `sha256` of its bytes."""

    name: str
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """A parsed manifest. `path` is the manifest file; `statement` the whole JSON object."""

    path: Path
    statement: Mapping[str, Any]

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def kind(self) -> str:
        return str(self.statement["predicateType"]).removeprefix(PREDICATE_TYPE_PREFIX).removesuffix("/v1")

    @property
    def predicate(self) -> Mapping[str, Any]:
        return self.statement["predicate"]

    @property
    def subjects(self) -> tuple[Subject, ...]:
        return tuple(Subject(s["name"], s["digest"]["sha256"]) for s in self.statement["subject"])


def build_statement(kind: str, predicate: Mapping[str, Any], subjects: Iterable[Subject]) -> dict[str, Any]:
    """The Statement object for `subjects` (sorted by name) and `predicate`."""
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": s.name, "digest": digest_set(s.sha256)} for s in sorted(subjects, key=lambda s: s.name)],
        "predicateType": predicate_type(kind),
        "predicate": dict(predicate),
    }


def write_manifest(folder: str | os.PathLike, kind: str, predicate: Mapping[str, Any],
                   files: Iterable[str | os.PathLike] | None = None) -> Path:
    """Write `folder/manifest.json` atomically and return its path.

    folder: the artifact folder; kind: the artifact kind (see `KINDS`); predicate: the run
    metadata, usually from `build_predicate`; files: the files to cover, relative to `folder` or
    absolute inside it (default: every file of `folder_files`). Subjects are sorted by name.
    """
    root = Path(folder)
    names = folder_files(root) if files is None else sorted({_relative(root, f) for f in files})
    if MANIFEST_NAME in names:
        raise InputError(f"{root / MANIFEST_NAME}: a manifest cannot cover itself; leave it out of `files`")
    subjects = [Subject(n, sha256_file(root / n)) for n in names]
    statement = build_statement(kind, predicate, subjects)
    try:
        text = canonical_json(statement)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{root / MANIFEST_NAME}: the predicate is not plain JSON ({exc}); "
                         "pass strings, numbers, booleans, lists and dicts only") from None
    # What `read_manifest` would refuse is never written: a manifest nobody can read back pins nothing.
    problems = statement_problems(json.loads(text))
    if problems:
        raise InputError(f"{root / MANIFEST_NAME}: not written, it would not read back: {problems[0]} (a key "
                         "ending in `digest` holds {\"sha256\": <64 hex>} or null; rename any other)")
    return atomic.write_text(root / MANIFEST_NAME, text)


def _relative(root: Path, f: str | os.PathLike) -> str:
    p = Path(f)
    full = p if p.is_absolute() else root / p
    try:
        rel = full.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        raise InputError(f"{f}: is not inside {root}; a manifest covers only files in its own folder") from None
    if not full.is_file():
        raise InputError(f"{full}: no such file to put in the manifest of {root}")
    return rel


def manifest_path(path: str | os.PathLike) -> Path:
    """`path` itself if it is a file, `path/manifest.json` if it is a folder."""
    p = Path(path)
    return p / MANIFEST_NAME if p.is_dir() else p


def read_manifest(path: str | os.PathLike) -> Manifest:
    """Parse a manifest (a file, or a folder holding `manifest.json`); InputError if it is malformed.

    Malformed means: not JSON, not an in-toto Statement v1, a predicateType outside the alibi
    namespace, a subject without a name or with a digest that is not 64 lowercase hex, duplicate
    or unsafe subject names, or any `digest`/`*_digest` field in the predicate that is malformed.
    """
    p = manifest_path(path)
    if not p.is_file():
        raise InputError(f"{p}: no such manifest; write one with `alibi manifest write` or pass the artifact folder")
    try:
        statement = jsonio.read(p)  # bounded: deep nesting is refused, not a RecursionError
    except InputError as exc:
        raise InputError(f"{exc}; the manifest is damaged, regenerate it") from None
    problems = statement_problems(statement)
    if problems:
        raise InputError(f"{p}: malformed manifest: {problems[0]}")
    return Manifest(p, statement)


def statement_problems(statement: Any) -> list[str]:
    """Every way `statement` departs from the manifest shape, each naming the field (empty if none)."""
    if not isinstance(statement, dict):
        return ["the top level is not a JSON object"]
    problems = []
    if statement.get("_type") != STATEMENT_TYPE:
        problems.append(f"field _type is {statement.get('_type')!r}, expected {STATEMENT_TYPE!r}")
    ptype = statement.get("predicateType")
    if not isinstance(ptype, str) or not re.match(rf"^{re.escape(PREDICATE_TYPE_PREFIX)}[a-z0-9][a-z0-9-]*/v1$", ptype):
        problems.append(f"field predicateType is {ptype!r}, expected {PREDICATE_TYPE_PREFIX}<kind>/v1")
    if not isinstance(statement.get("predicate"), dict):
        problems.append("field predicate is missing or not an object")
    subjects = statement.get("subject")
    if not isinstance(subjects, list):
        problems.append("field subject is missing or not a list")
        subjects = []
    seen: set[str] = set()
    for i, s in enumerate(subjects):
        where = f"subject[{i}]"
        name = s.get("name") if isinstance(s, dict) else None
        if not isinstance(name, str) or not name or name.startswith("/") or ".." in name.split("/"):
            problems.append(f"field {where}.name is {name!r}, expected a relative path inside the folder")
        elif name in seen:
            problems.append(f"field {where}.name {name!r} appears twice")
        else:
            seen.add(name)
            where = f"subject[{name}]"
        problems += _digest_problems(s.get("digest") if isinstance(s, dict) else None, f"{where}.digest")
    names = [s.get("name") for s in subjects if isinstance(s, dict)]
    if all(isinstance(n, str) for n in names) and names != sorted(names):
        problems.append("field subject is not sorted by name")
    if isinstance(statement.get("predicate"), dict):
        problems += predicate_digest_problems(statement["predicate"], "predicate")
    return problems


def _digest_problems(value: Any, where: str) -> list[str]:
    if not isinstance(value, dict) or "sha256" not in value:
        return [f"field {where} is {value!r}, expected {{\"sha256\": <64 hex>}}"]
    if not isinstance(value["sha256"], str) or not _SHA256.match(value["sha256"]):
        return [f"field {where}.sha256 is {value['sha256']!r}, not 64 lowercase hex characters"]
    return []


def predicate_digest_problems(node: Any, where: str) -> list[str]:
    """Malformed DigestSets under `node`: keys `digest`/`*_digest` whose value is not null and not well-formed."""
    problems: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{where}.{key}"
            if (key == "digest" or key.endswith("_digest")) and value is not None:
                problems += _digest_problems(value, path)
            else:
                problems += predicate_digest_problems(value, path)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            problems += predicate_digest_problems(value, f"{where}[{i}]")
    return problems


def verify_files(path: str | os.PathLike, *, exact: bool = True) -> list[str]:
    """Check every subject's bytes against its digest; return the problems (empty when all match).

    path: a manifest file or its folder. With `exact` (the default) a file present in the folder
    but not listed also counts as a problem, so additions are caught as well as edits and deletions.
    """
    return subject_problems(read_manifest(path), exact=exact)


def subject_problems(m: Manifest, *, exact: bool = True, read: Mapping[str, bytes] | None = None) -> list[str]:
    """`verify_files` of a manifest already read. read: {subject name: bytes} the caller has already read
    (hashed from these bytes, so a file is not read twice and what was checked is what the caller uses)."""
    read = read or {}
    problems = []
    for s in m.subjects:
        f = m.folder / s.name
        if s.name in read:
            if (actual := sha256_bytes(read[s.name])) != s.sha256:
                problems.append(f"file {s.name}: sha256 is {actual}, the manifest pins {s.sha256}")
        elif not f.is_file():
            problems.append(f"file {s.name}: listed in {m.path} but missing")
        elif (actual := sha256_file(f)) != s.sha256:
            problems.append(f"file {s.name}: sha256 is {actual}, the manifest pins {s.sha256}")
    if exact:
        listed = {s.name for s in m.subjects}
        problems += [f"file {n}: present in {m.folder} but not in its manifest" for n in folder_files(m.folder)
                     if n not in listed]
    return problems


@dataclass(frozen=True)
class Treatment:
    """The one thing allowed to differ between two arms: which kernel ran.

    arm: the arm's label ("a", "b", "cutlass", ...); kernel: the registry name; kernel_build_digest:
    hex sha256 of the kernel's build (compiled binary or source, see `kernel_build_digest`);
    epilogue_model: the declared epilogue (`EpilogueModel.name`, e.g. "w_then_a+fma"), None when
    the kernel declares none; kernel_evidence: what `Kernel.evidence()` reported (device, versions).
    kernel_log: an engine's kernel-selection lines (`alibi.governance.kernel_log.KernelLog`), when
    the arm ran inside one (vLLM); `kernel` is None for an arm evidenced by its log alone.
    """

    arm: str
    kernel: str | None
    kernel_build_digest: str | None
    epilogue_model: str | None
    kernel_evidence: Mapping[str, Any] | None = None
    kernel_log: KernelLog | None = None

    def as_dict(self) -> dict[str, Any]:
        doc = {
            "arm": self.arm,
            "kernel": self.kernel,
            "kernel_build_digest": None if self.kernel_build_digest is None else digest_set(self.kernel_build_digest),
            "epilogue_model": self.epilogue_model,
            "kernel_evidence": None if self.kernel_evidence is None else dict(self.kernel_evidence),
        }
        if self.kernel_log is not None:  # only then: manifests without a log keep their bytes
            doc["kernel_log"] = self.kernel_log.to_dict()
        return doc


def kernel_build_digest(kernel: Any) -> str:
    """Hex sha256 identifying the code a kernel runs: its `build_digest()` (`alibi.kernels.base.Kernel`
    has the one default, the kernel's sources), validated as a sha256."""
    return digest_set(str(kernel.build_digest()))["sha256"]


def engine_treatment(kernel_log: KernelLog, arm: str) -> Treatment:
    """The treatment of an arm that ran inside an engine and is evidenced by its selection log alone.

    No alibi kernel ran, so `kernel`, `kernel_build_digest` and `epilogue_model` are null; the
    identity contract accepts the log in their place (alibi.governance.identity).
    """
    return Treatment(arm=arm, kernel=None, kernel_build_digest=None, epilogue_model=None, kernel_log=kernel_log)


def treatment_of(kernel: Any, arm: str, kernel_log: Any = None) -> Treatment:
    """The treatment record of `kernel` run as arm `arm` (name, build digest, epilogue, evidence).

    kernel_log: the engine's kernel-selection evidence (`kernel_log.read_kernel_log(path)`), if the
    arm ran inside vLLM; it must name the vLLM class the kernel runs, when the kernel declares one.
    """
    if kernel_log is not None:
        require_consistent(kernel_log, kernel)
    epilogue = getattr(kernel, "epilogue", None)
    evidence = kernel.evidence() if callable(getattr(kernel, "evidence", None)) else None
    return Treatment(arm=arm, kernel=kernel.name, kernel_build_digest=kernel_build_digest(kernel),
                     epilogue_model=None if epilogue is None else epilogue.name,
                     kernel_evidence=None if evidence is None else json.loads(json.dumps(evidence, default=str)),
                     kernel_log=kernel_log)


def build_predicate(*, inputs: Mapping[str, Mapping[str, Any]] | None = None, seed: int | None = None,
                    treatment: Treatment | None = None, arms: Mapping[str, Treatment] | None = None,
                    parameters: Mapping[str, Any] | None = None, protocol: Mapping[str, Any] | None = None,
                    created_at: str | None = None) -> dict[str, Any]:
    """The standard predicate of an alibi manifest.

    inputs: what the artifact was computed from, each a ResourceDescriptor (`resource(name, path)`)
      under a conventional key: `checkpoint`, `prompts`, `tokenizer`, `quantization_config`, `tiles`;
    seed: the random seed, if any; treatment: the kernel arm that produced a single-arm artifact;
    arms: the treatments of a two-arm artifact (a comparison report), by arm label;
    parameters: artifact-specific settings (capture M, scale regimes, ...), plain JSON;
    protocol: the pre-registration record (`alibi.governance.prereg.ProtocolRecord.as_dict()`);
    created_at: the one timestamp (default: now, UTC). toolkit and environment are filled in here.
    """
    for key, value in (inputs or {}).items():
        if not isinstance(value, Mapping) or "name" not in value or "digest" not in value:
            raise InputError(f"input {key!r} must be a resource {{name, digest: {{sha256}}}}; build it with "
                             "alibi.governance.resource(name, path)")
        digest_set(value["digest"].get("sha256") if isinstance(value["digest"], Mapping) else value["digest"])

    return {
        "toolkit": toolkit_record(),
        "environment": environment_record(),
        "inputs": {k: dict(v) for k, v in sorted((inputs or {}).items())},
        "seed": seed,
        "treatment": None if treatment is None else treatment.as_dict(),
        "arms": None if arms is None else {k: t.as_dict() for k, t in sorted(arms.items())},
        "parameters": dict(parameters or {}),
        "protocol": None if protocol is None else dict(protocol),
        "run": {"created_at": created_at or utc_now()},
    }


def strip_timestamp(statement: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of `statement` without `TIMESTAMP_FIELD` (for byte comparisons of reruns)."""
    copy = json.loads(json.dumps(statement))
    node = copy
    for key in TIMESTAMP_FIELD[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(TIMESTAMP_FIELD[-1], None)
    return copy


def _listing(path: Path) -> tuple[str, frozenset[str]] | None:
    """A manifest's kind and subject names, or None when it is not a manifest alibi can read (`read_manifest`)."""
    try:
        m = read_manifest(path)
    except InputError:
        return None
    return m.kind, frozenset(s.name for s in m.subjects)


atomic.register_manifest_reader(_listing)  # the replace check of alibi.io.atomic reads manifests through it

__all__ = [
    "KINDS", "MANIFEST_NAME", "STATEMENT_TYPE", "TIMESTAMP_FIELD", "Manifest", "Subject", "Treatment",
    "build_predicate", "build_statement", "canonical_json", "digest_path", "digest_set", "digest_tree", "engine_treatment",
    "folder_files", "kernel_build_digest", "manifest_path", "predicate_type", "read_manifest", "resource",
    "sha256_bytes", "sha256_file", "statement_problems", "strip_timestamp", "treatment_of", "utc_now",
    "subject_problems", "verify_files", "write_manifest",
]
