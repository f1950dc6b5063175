"""The identity contract: two arms may be joined only if nothing but the declared treatment differs.

Argument. A difference between two arms' outputs can be attributed to the kernel only if every
other input (checkpoint, prompts, tokenizer, quantization config, seed, toolkit commit, software
and hardware) was identical. Each arm's manifest records those inputs; the contract compares the
two manifests field by field and fails closed on

- any field that differs outside the declared treatment (the message names the field),
- any malformed digest (a DigestSet that is not 64 lowercase hex),
- any covered file whose bytes no longer match its digest, or that is missing or unlisted,
- missing kernel evidence (`treatment.kernel`, `.kernel_build_digest`, `.epilogue_model`), without
  which a difference could not be attributed to a kernel at all. An arm that ran inside an engine
  may instead carry the engine's kernel-selection log (`treatment.kernel_log`): the log names what
  ran, whether `kernel` is null (no alibi kernel models it) or names a kernel that declares no epilogue
  model on this machine (vLLM's oneDNN GEMM on an op library nobody measured).

Excluded from the comparison are exactly: the timestamp `predicate.run.created_at`, the declared
treatment fields, and the subjects' digests — the covered files are the arms' *outputs*, which
are expected to differ; their names must agree and their bytes must match their own manifest.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alibi.errors import InputError
from alibi.governance.manifest import (
    TIMESTAMP_FIELD,
    manifest_path,
    sha256_file,
    statement_problems,
    verify_files,
)
from alibi.io import jsonio

CONTRACT = "alibi-identity/v1"
# Named treatments: the manifest fields each one allows to differ.
TREATMENTS: dict[str, tuple[str, ...]] = {
    "kernel": ("predicate.treatment",),
    "checkpoint": ("predicate.inputs.checkpoint",),
    "none": (),
}
# Fields that follow from another: a treatment that lets the first differ lets these differ too,
# since they cannot stay equal when it changes. A capture records its checkpoint twice: as the
# input (`inputs.checkpoint`: name and file digest) and as the digest of its tensors
# (`parameters.model_tensors_digest`, the same for any sharding); two checkpoints differ in both.
# Whether the checkpoint matched its own manifest (`checkpoint_verified_against_manifest`) does
# not follow from its content: a difference there is evidence quality and stays a violation.
FOLLOWS_FROM: dict[str, tuple[str, ...]] = {
    "predicate.inputs.checkpoint": ("predicate.parameters.model_tensors_digest",),
}
KERNEL_EVIDENCE = ("kernel", "kernel_build_digest", "epilogue_model")
_TIMESTAMP = ".".join(TIMESTAMP_FIELD)


class IdentityViolation(InputError):
    """Two arms' manifests break the identity contract: exit 1, as `alibi manifest verify A B` (README)."""

    exit_code = 1


@dataclass(frozen=True)
class IdentityRecord:
    """The outcome of one contract check, to embed in any output that joins the two arms.

    a, b: the manifest paths as given; a_sha256, b_sha256: digests of the manifest files;
    treatment: the fields allowed to differ; differing: treatment fields that do differ;
    problems: every violation (empty when verified); allow_unverified: the caller proceeded
    despite problems (only ever True when asked for explicitly).
    """

    a: str
    b: str
    a_sha256: str
    b_sha256: str
    treatment: tuple[str, ...]
    differing: tuple[str, ...]
    problems: tuple[str, ...]
    allow_unverified: bool = False

    @property
    def verified(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "contract": CONTRACT,
            "a": {"manifest": self.a, "sha256": self.a_sha256},
            "b": {"manifest": self.b, "sha256": self.b_sha256},
            "treatment": list(self.treatment),
            "differing": list(self.differing),
            "verified": self.verified,
            "problems": list(self.problems),
            "allow_unverified": self.allow_unverified,
        }


def treatment_fields(treatment: Iterable[str]) -> tuple[str, ...]:
    """Expand treatment names (`kernel`, `checkpoint`, `none`) and dotted paths (`inputs.checkpoint`) to field prefixes.

    Each field brings the fields that follow from it (`FOLLOWS_FROM`): declaring a checkpoint the
    treatment also allows its tensor digest to differ, wherever the field is named from.
    """
    fields: list[str] = []
    for item in treatment:
        if item in TREATMENTS:
            fields += TREATMENTS[item]
        elif item and all(part for part in item.split(".")):
            fields.append(item if item.startswith("predicate.") else f"predicate.{item}")
        else:
            raise InputError(f"treatment {item!r} is neither one of {', '.join(TREATMENTS)} nor a dotted "
                             "predicate field such as inputs.checkpoint")
    derived = [d for f in fields for source, follows in FOLLOWS_FROM.items()
               if _under(source, f) or _under(f, source) for d in follows]
    return tuple(dict.fromkeys(fields + derived))


def flatten(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Leaf (path, value) pairs of a JSON value; empty objects and lists are leaves."""
    if isinstance(node, dict) and node:
        for key in sorted(node):
            yield from flatten(node[key], f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(node, list) and node:
        for i, value in enumerate(node):
            yield from flatten(value, f"{prefix}[{i}]")
    else:
        yield prefix, node


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith((prefix + ".", prefix + "["))


def _show(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def _load(path: str | os.PathLike) -> tuple[Path, Any]:
    p = manifest_path(path)
    if not p.is_file():
        raise InputError(f"{p}: no such manifest; pass a manifest.json or the artifact folder holding one")
    return p, jsonio.read(p)


def _logged_selections(kernel_log: Any) -> bool:
    """Whether a treatment's `kernel_log` (alibi.governance.kernel_log) records at least one selection."""
    return isinstance(kernel_log, Mapping) and bool(kernel_log.get("selections"))


def _kernel_evidence_problems(statement: Mapping[str, Any]) -> list[str]:
    predicate = statement.get("predicate") if isinstance(statement, Mapping) else None
    predicate = predicate if isinstance(predicate, Mapping) else {}
    holders: list[tuple[str, Any]]
    if predicate.get("treatment") is not None or not predicate.get("arms"):
        holders = [("predicate.treatment", predicate.get("treatment"))]
    else:
        arms = predicate["arms"]
        holders = [(f"predicate.arms.{k}", v) for k, v in sorted(arms.items())] if isinstance(arms, Mapping) \
            else [("predicate.arms", arms)]
    problems = []
    for where, holder in holders:
        if not isinstance(holder, Mapping):
            problems.append(f"field {where} is missing: kernel evidence is required to attribute a difference")
            continue
        if _logged_selections(holder.get("kernel_log")):
            continue  # an engine arm (vLLM): its own kernel-selection log names the kernel that ran
        for key in KERNEL_EVIDENCE:
            if holder.get(key) in (None, "", {}):
                problems.append(f"field {where}.{key} is missing: kernel evidence is required")
    return problems


def _subject_names(statement: Any) -> set[Any]:
    """The subject names of a statement; a `subject` that is not a list (already reported by
    `statement_problems`) contributes none."""
    subject = statement.get("subject") if isinstance(statement, dict) else None
    return {s.get("name") for s in subject if isinstance(s, dict)} if isinstance(subject, list) else set()


def compare_manifests(a: str | os.PathLike, b: str | os.PathLike,
                      treatment: Iterable[str] = ("kernel",)) -> IdentityRecord:
    """Check the identity contract between manifests `a` and `b` (files or artifact folders).

    treatment: the names or dotted predicate fields allowed to differ (default: the kernel).
    Returns the record; never raises for a contract violation (see `require_identity`).
    """
    fields = treatment_fields(treatment)
    (pa, sa), (pb, sb) = _load(a), _load(b)
    problems: list[str] = []
    for label, p, s in (("A", pa, sa), ("B", pb, sb)):
        shape = statement_problems(s)
        problems += [f"{label} ({p}): {msg}" for msg in shape]
        if not shape:
            problems += [f"{label} ({p}): {msg}" for msg in verify_files(p)]
        problems += [f"{label} ({p}): {msg}" for msg in _kernel_evidence_problems(s)]

    flat_a = dict(flatten({k: v for k, v in sa.items() if k != "subject"})) if isinstance(sa, dict) else {}
    flat_b = dict(flatten({k: v for k, v in sb.items() if k != "subject"})) if isinstance(sb, dict) else {}
    differing = []
    for path in sorted(set(flat_a) | set(flat_b)):
        if path == _TIMESTAMP:
            continue
        in_a, in_b = path in flat_a, path in flat_b
        if in_a and in_b and flat_a[path] == flat_b[path] and type(flat_a[path]) is type(flat_b[path]):
            continue
        if any(_under(path, f) for f in fields):
            differing.append(path)
        elif not in_b:
            problems.append(f"field {path}: A has {_show(flat_a[path])}, B has no such field")
        elif not in_a:
            problems.append(f"field {path}: B has {_show(flat_b[path])}, A has no such field")
        else:
            problems.append(f"field {path} differs: A={_show(flat_a[path])}, B={_show(flat_b[path])}")

    names_a, names_b = _subject_names(sa), _subject_names(sb)
    problems += [f"subject {n}: only in A" for n in sorted(names_a - names_b, key=str)]
    problems += [f"subject {n}: only in B" for n in sorted(names_b - names_a, key=str)]
    return IdentityRecord(a=str(a), b=str(b), a_sha256=sha256_file(pa), b_sha256=sha256_file(pb),
                          treatment=fields, differing=tuple(differing), problems=tuple(problems))


def require_identity(a: str | os.PathLike, b: str | os.PathLike, treatment: Iterable[str] = ("kernel",),
                     allow_unverified: bool = False) -> IdentityRecord:
    """The gate every analysis that joins two arms calls first.

    Returns the `IdentityRecord` to embed in the analysis output. Raises IdentityViolation
    naming every offending field unless `allow_unverified`, in which case the record carries the
    problems and `allow_unverified=True`, so the output shows that it rests on unverified inputs.
    """
    record = compare_manifests(a, b, treatment)
    if record.problems and not allow_unverified:
        listing = "; ".join(record.problems)
        raise IdentityViolation(f"{a} and {b} break the identity contract: {listing}. Fix the inputs, or "
                                "pass --allow-unverified to proceed anyway (it is recorded in the output)")
    if allow_unverified:
        record = IdentityRecord(**{**record.__dict__, "allow_unverified": True})
    return record


__all__ = ["CONTRACT", "FOLLOWS_FROM", "KERNEL_EVIDENCE", "TREATMENTS", "IdentityRecord", "IdentityViolation",
           "compare_manifests", "flatten", "require_identity", "treatment_fields"]
