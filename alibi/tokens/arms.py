"""One arm's per-position records, whichever tool wrote them: the input of `alibi analyze flips`.

Three shapes are read, each into an `ArmSteps` (the fields every shape shares):

- `alibi-teacher-forced/v1`: an arm folder written by `alibi replay teacher-forced` (`records.json`
  + `manifest.json`, see `alibi.tokens.records`), or that folder's `records.json`. Joined on
  (window, position); the identity of two arms is the alibi manifest contract.
- `per-prompt-list` and `manifest-envelope`: the two shapes another tool publishes
  (`alibi.tokens.foreign`); the types they are read into are in `alibi.tokens.steps`.

A folder is an alibi arm; a `.json` file is told apart by its top level: an object with the alibi
`schema` is an alibi records file, a list is the per-prompt list, an object holding `manifest` and
`records` is the envelope. Anything else is refused, naming the file and the shapes accepted.
"""

from __future__ import annotations

import json
from pathlib import Path

from alibi.errors import InputError
from alibi.governance.manifest import sha256_file
from alibi.governance.verified import verified_file
from alibi.tokens import foreign
from alibi.tokens.records import ArmRecords, RECORDS_FILE
from alibi.tokens.steps import ALIBI_SHAPE, ArmSteps, Step

REPLAY_KIND = "replay"

def _read_text(f: Path) -> str:
    try:
        text = f.read_text(encoding="utf-8")
    except (OSError, UnicodeError) as exc:
        raise InputError(f"{f}: cannot read the records file ({exc.__class__.__name__}: {exc}); pass an arm "
                         "folder written by `alibi replay teacher-forced` or a records .json file") from None
    if not text.strip():
        raise InputError(f"{f}: the records file is empty; re-run the arm that should have written it")
    return text


def read_arm(path: str | Path) -> ArmSteps:
    """Read an arm in any accepted shape (module docstring); InputError naming the file and the problem."""
    p = Path(path)
    if p.is_dir():
        return _alibi_arm(str(path), p / RECORDS_FILE, p)
    if not p.is_file():
        raise InputError(f"{p}: no such arm folder or records file; pass the folder written by "
                         "`alibi replay teacher-forced`, or a .json records file")
    if p.suffix.lower() != ".json":
        raise InputError(f"{p}: not a folder and not a .json file; pass an arm folder or a .json records file")
    text = _read_text(p)
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"{p}: not valid JSON ({str(exc).splitlines()[0]}); the file is truncated or damaged: "
                         "re-run the arm that wrote it") from None
    if isinstance(doc, dict) and doc.get("schema") == ALIBI_SHAPE:
        return _alibi_arm(str(path), p, p.parent)
    if isinstance(doc, list):
        return foreign.read_list_shape(doc, str(path), p, sha256_file(p))
    if isinstance(doc, dict) and "manifest" in doc and "records" in doc:
        return foreign.read_envelope(doc, str(path), p, sha256_file(p))
    raise InputError(f"{p}: not a records file of a known shape; expected an alibi records.json (schema "
                     f"{ALIBI_SHAPE!r}), a list with one list of step records per prompt, or an object with "
                     "`manifest` and `records`")


ARM_FIX = "pass the arm folder `alibi replay teacher-forced` wrote, as it wrote it (re-run a changed one)"


def _alibi_arm(given: str, records_file: Path, folder: Path) -> ArmSteps:
    """An alibi arm, read only once its manifest (kind `replay`) vouches for every file of its folder
    (`alibi.governance.verified`): a records file edited after the arm ran is refused, not analysed."""
    if not records_file.is_file():
        raise InputError(f"{folder}: holds no {RECORDS_FILE}; pass an arm folder written by "
                         "`alibi replay teacher-forced`")
    verified = verified_file(records_file, (REPLAY_KIND,), fix=ARM_FIX)
    text = verified.text()
    if not text.strip():
        raise InputError(f"{records_file}: the records file is empty; re-run the arm that should have written it")
    arm = ArmRecords.from_json(text, str(records_file))
    if not arm.records:
        raise InputError(f"{records_file}: holds no scored position; re-run the arm with --positions ≥ 1")
    windows = set(arm.windows)
    steps = []
    for i, r in enumerate(arm.records):
        where = f"{records_file}: record {i} (window {r.window}, position {r.position})"
        if r.window not in windows:
            raise InputError(f"{where}: window index {r.window} is out of range: the arm scored windows "
                             f"{_show_windows(arm.windows)}; the records file is damaged, re-run the arm")
        if r.position < 0:
            raise InputError(f"{where}: position {r.position} is negative; the records file is damaged")
        if r.margin < 0:
            raise InputError(f"{where}: margin {r.margin!r} is negative (top-1 minus top-2 cannot be); "
                             "the records file is damaged")
        steps.append(Step(prompt=r.window, position=r.position, top1_id=r.top1_id, margin=float(r.margin),
                          prompt_sha256=r.prompt_sha256, forced_id=r.forced_id, logits_sha256=r.logits_sha256))
    return ArmSteps(path=given, shape=ALIBI_SHAPE, records_file=str(records_file),
                    records_sha256=verified.sha256, kernel=arm.kernel, steps=tuple(steps),
                    manifest_path=str(verified.manifest.path))


def _show_windows(windows: tuple[int, ...]) -> str:
    if not windows:
        return "none"
    if list(windows) == list(range(windows[0], windows[0] + len(windows))):
        return f"{windows[0]}…{windows[-1]}"
    return ", ".join(map(str, windows[:8])) + (", …" if len(windows) > 8 else "")


__all__ = ["read_arm"]
