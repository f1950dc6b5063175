"""Per-position records published by another tool, read into `ArmSteps` so the same statistics apply.

The paper's companion repository publishes teacher-forcing records in two JSON shapes (field
names exactly as published; see ../shared/environment.md):

- **per-prompt list**: `[[{pos, chosen_id, chosen_lp, top1_id, top1_lp, top2_lp, margin}, ...], ...]`,
  one element per prompt. `chosen_id` is the teacher-forced (actual next) token. The prompt of a
  step is the index of its element (0-based), so two such files join on (element index, pos).
  The shape carries no identity at all: an analysis of it is *unverified* and runs only with
  `--allow-unverified`.
- **manifest envelope**: `{"manifest": {...}, "records": [{"prompt_sha", "steps": [{pos, chosen_lp,
  top1_id, margin}, ...]}, ...]}`. Two envelopes join on (prompt_sha, pos), so the order of the
  records does not matter. Their manifests pass the identity contract field by field
  (`compare_envelopes`): the arms may differ only in the published treatment fields
  `TREATMENT_FIELDS`; the identity fields `IDENTITY_FIELDS` must be present in both; any other
  field that differs or is present in one manifest only breaks the contract.

Every number is checked: ids and positions are integers, log-probabilities and margins finite,
margins ≥ 0 (top-1 minus top-2 cannot be negative). A bad value is refused naming the file, the
prompt, the step and the field.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from alibi.errors import InputError
from alibi.governance.identity import IdentityRecord, flatten
from alibi.tokens.steps import ENVELOPE_SHAPE, LIST_SHAPE, ArmSteps, Step

LIST_FIELDS = ("pos", "chosen_id", "chosen_lp", "top1_id", "top1_lp", "top2_lp", "margin")
ENVELOPE_STEP_FIELDS = ("pos", "chosen_lp", "top1_id", "margin")
TREATMENT_FIELDS = ("arm", "kernel_class", "kernel_selection_env", "kernel_log_sha256", "kernel_log_lines",
                    "command_sha256")
IDENTITY_FIELDS = ("prompt_list_sha256", "rails_sha256", "checkpoint_digest", "quantization_config_sha256",
                   "tokenizer_files_sha256", "parent_revision", "vllm_version", "image_digest")
_INTEGERS = {"pos", "chosen_id", "top1_id"}


def _value(step: Any, name: str, where: str) -> int | float:
    if name not in step:
        raise InputError(f"{where}: lacks the field {name!r}; the record does not have the published shape")
    value = step[name]
    if name in _INTEGERS:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InputError(f"{where}: {name} is {value!r}, not a non-negative integer")
        return value
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise InputError(f"{where}: {name} is {value!r}, not a finite number; the arm's run is broken")
    if name == "margin" and value < 0:
        raise InputError(f"{where}: margin {value!r} is negative (top-1 minus top-2 cannot be)")
    return float(value)


def _steps(raw: Any, fields: tuple[str, ...], where: str) -> list[dict[str, int | float]]:
    if not isinstance(raw, list):
        raise InputError(f"{where}: is not a list of step records")
    out = []
    for j, step in enumerate(raw):
        here = f"{where}, step {j}"
        if not isinstance(step, dict):
            raise InputError(f"{here}: is not an object")
        out.append({name: _value(step, name, here) for name in fields})
    return out


def read_list_shape(doc: list, given: str, file: Path, sha256: str) -> ArmSteps:
    """The per-prompt list shape (module docstring): prompt = element index, forced token = `chosen_id`."""
    if not doc:
        raise InputError(f"{file}: the list holds no prompt; nothing to analyse")
    steps = []
    for i, prompt in enumerate(doc):
        for s in _steps(prompt, LIST_FIELDS, f"{file}: prompt {i}"):
            steps.append(Step(prompt=i, position=int(s["pos"]), top1_id=int(s["top1_id"]), margin=s["margin"],
                              forced_id=int(s["chosen_id"])))
    if not steps:
        raise InputError(f"{file}: no prompt holds a step record; nothing to analyse")
    return ArmSteps(path=given, shape=LIST_SHAPE, records_file=str(file), records_sha256=sha256, kernel=None,
                    steps=tuple(steps))


def read_envelope(doc: dict, given: str, file: Path, sha256: str) -> ArmSteps:
    """The manifest envelope (module docstring): prompt = `prompt_sha`; the manifest is kept for the identity check."""
    manifest, records = doc["manifest"], doc["records"]
    if not isinstance(manifest, dict):
        raise InputError(f"{file}: `manifest` is not an object")
    if not isinstance(records, list) or not records:
        raise InputError(f"{file}: `records` is not a non-empty list")
    steps = []
    for i, rec in enumerate(records):
        where = f"{file}: record {i}"
        if not isinstance(rec, dict) or "steps" not in rec:
            raise InputError(f"{where}: is not an object with `prompt_sha` and `steps`")
        sha = rec.get("prompt_sha")
        if not isinstance(sha, str) or not sha:
            raise InputError(f"{where}: prompt_sha is {sha!r}, not a non-empty string")
        for s in _steps(rec["steps"], ENVELOPE_STEP_FIELDS, f"{where} (prompt_sha {sha[:12]})"):
            steps.append(Step(prompt=sha, position=int(s["pos"]), top1_id=int(s["top1_id"]), margin=s["margin"]))
    if not steps:
        raise InputError(f"{file}: no record holds a step; nothing to analyse")
    kernel = manifest.get("kernel_class")
    return ArmSteps(path=given, shape=ENVELOPE_SHAPE, records_file=str(file), records_sha256=sha256,
                    kernel=kernel if isinstance(kernel, str) else None, steps=tuple(steps),
                    envelope_manifest=manifest)


def _under(path: str, fields: tuple[str, ...]) -> bool:
    return any(path == f or path.startswith((f + ".", f + "[")) for f in fields)


def compare_envelopes(a: ArmSteps, b: ArmSteps) -> IdentityRecord:
    """The identity contract between two envelopes' manifests, field by field (never raises for a violation).

    Argument: a difference between the arms can be put down to the kernel only if everything the
    published manifest records about the inputs is equal; the treatment fields are the kernel.
    An identity field missing from a manifest is a problem even when it is missing from both: its
    equality would then be assumed, not checked.
    """
    ma, mb = a.envelope_manifest or {}, b.envelope_manifest or {}
    problems = [f"field manifest.{name} is missing from {label} ({arm.records_file})"
                for label, arm, m in (("A", a, ma), ("B", b, mb)) for name in IDENTITY_FIELDS if name not in m]
    flat_a, flat_b = dict(flatten(dict(ma))), dict(flatten(dict(mb)))
    differing = []
    for path in sorted(set(flat_a) | set(flat_b)):
        in_a, in_b = path in flat_a, path in flat_b
        if in_a and in_b and flat_a[path] == flat_b[path] and type(flat_a[path]) is type(flat_b[path]):
            continue
        if _under(path, TREATMENT_FIELDS):
            differing.append(f"manifest.{path}")
        elif not in_b:
            problems.append(f"field manifest.{path}: A has {flat_a[path]!r}, B has no such field")
        elif not in_a:
            problems.append(f"field manifest.{path}: B has {flat_b[path]!r}, A has no such field")
        else:
            problems.append(f"field manifest.{path} differs: A={flat_a[path]!r}, B={flat_b[path]!r}")
    return IdentityRecord(a=a.records_file, b=b.records_file, a_sha256=a.records_sha256, b_sha256=b.records_sha256,
                          treatment=tuple(f"manifest.{f}" for f in TREATMENT_FIELDS), differing=tuple(differing),
                          problems=tuple(dict.fromkeys(problems)))


__all__ = ["ENVELOPE_STEP_FIELDS", "IDENTITY_FIELDS", "LIST_FIELDS", "TREATMENT_FIELDS", "compare_envelopes",
           "read_envelope", "read_list_shape"]
