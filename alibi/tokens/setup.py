"""What every replay command checks before it loads a model, and the manifest its output carries.

A replay reads a checkpoint and a pinned prompt set and writes one output folder. Before anything
heavy runs, the request is validated (`resolve_span`, `check_output`) so that bad input costs one
line and exit 2 with nothing written; then `open_inputs` verifies the checkpoint against its own
manifest and the prompt set's tokenizer against the checkpoint's (as `alibi eval` does), and
records both as resources.

The identity contract. Two arms of one comparison must carry manifests that differ only in
`predicate.treatment` (kernel, build digest, epilogue, arm label). So everything else a replay
manifest records is a function of the request alone: the input digests under fixed resource names
(`checkpoint`, `prompts`, `tokenizer` — never a path or a folder name, which may differ between two
machines that hold the same bytes), the span (windows, context, positions), the device and the
toolkit/environment from `build_predicate`. Two arms run on different checkpoints or prompt sets
then fail the contract at `predicate.inputs.checkpoint.digest.sha256` or
`predicate.inputs.prompts.digest.sha256`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alibi.errors import InputError
from alibi.governance.manifest import Treatment, build_predicate, digest_set, read_manifest, resource, treatment_of
from alibi.governance.prereg import ProtocolViolation, require_locked
from alibi.io import atomic

MANIFEST_KIND = "replay"


def note_lines(quiet: bool = False):
    """A one-argument callback printing plain lines to stderr (silent with `quiet`): what
    `alibi.tokens.flips.analyze_flips` takes for its progress."""
    if quiet:
        return None

    def emit(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    return emit


@dataclass(frozen=True)
class Span:
    """Which part of the prompt set a replay reads.

    windows: the prompt-set window indices, in order; context: T, tokens before the first scored
    (or compared) position; positions: P, positions per window; window_tokens: L, tokens per window.
    Tokens 0 … T+P−1 of each window are fed (`fed` = T+P ≤ L).
    """

    windows: tuple[int, ...]
    context: int
    positions: int
    window_tokens: int

    @property
    def fed(self) -> int:
        return self.context + self.positions

    def as_dict(self) -> dict[str, Any]:
        return {"windows": list(self.windows), "context": self.context, "positions": self.positions,
                "fed_tokens": self.fed, "window_tokens": self.window_tokens}


def resolve_windows(prompts, windows: int | None, where: str) -> tuple[int, ...]:
    """The first `windows` window indices of the set (all when None); InputError naming the first
    index that does not exist."""
    if windows is None:
        return tuple(range(prompts.windows))
    if windows < 1:
        raise InputError(f"--windows {windows}: must be at least 1")
    if windows > prompts.windows:
        raise InputError(f"--windows {windows}: window index {prompts.windows} is out of range, {where} has windows "
                         f"0..{prompts.windows - 1}; ask for at most {prompts.windows} windows")
    return tuple(range(windows))


def resolve_span(prompts, windows: int | None, context: int | None, positions: int | None,
                 where: str | os.PathLike) -> Span:
    """Validate a (windows, context, positions) request against the prompt set `prompts`.

    Defaults: all windows; context T = L//2; positions P = L − T. Requires T ≥ 1, P ≥ 1 and
    T + P ≤ L (every fed token is a pinned token of the window).
    """
    length = prompts.tokens
    t = length // 2 if context is None else context
    if t < 1:
        raise InputError(f"--context {t}: must be at least 1 (the first scored position needs a preceding token)")
    p = length - t if positions is None else positions
    if p < 1:
        raise InputError(f"--positions {p}: must be at least 1" + ("" if positions is not None else
                         f" (--context {t} leaves none of the {length} tokens per window)"))
    if t + p > length:
        raise InputError(f"--context {t} + --positions {p} = {t + p} exceeds the {length} tokens per window of "
                         f"{where}; ask for at most {length} tokens in all")
    return Span(resolve_windows(prompts, windows, str(where)), t, p, length)


def _overlap(a: Path, b: Path) -> bool:
    a, b = a.resolve(), b.resolve()
    return a == b or a in b.parents or b in a.parents


def check_output(out: str | os.PathLike, inputs: Mapping[str, str | os.PathLike | None], overwrite: bool) -> Path:
    """Refuse an output folder that is, contains or lies inside an input (`inputs`: flag → path),
    and an existing one unless `overwrite` — and even then only an empty folder or an earlier
    replay output (a folder whose manifest is of kind `replay`) holding nothing alibi did not
    write (`atomic.check_replaceable`), never an arbitrary folder."""
    out = Path(out)
    for flag, path in inputs.items():
        if path is not None and _overlap(out, Path(path)):
            raise InputError(f"--out {out}: overlaps {flag} {path}; write the replay to a separate folder")
    if (out.exists() or out.is_symlink()) and not overwrite:
        raise InputError(f"--out {out}: already exists; choose another folder or pass --overwrite")
    atomic.check_writable_dir(out)
    atomic.check_replaceable(out, kind=MANIFEST_KIND)
    return out


@dataclass(frozen=True)
class ReplayInputs:
    """A verified checkpoint and prompt set: `prompts` (a loaded `PromptSet`), `resources` (the
    manifest inputs `checkpoint`, `prompts`, `tokenizer`), and whether the checkpoint was verified
    against a manifest of its own (`checkpoint_verified`)."""

    model_dir: Path
    prompts: Any
    resources: Mapping[str, Mapping[str, Any]]
    checkpoint_verified: bool


def load_prompts(prompts_dir: str | os.PathLike):
    # deferred: keeps torch out of start-up
    from alibi.model.prompts import load_prompt_set

    return load_prompt_set(prompts_dir)


def open_inputs(model_dir: str | os.PathLike, prompts) -> ReplayInputs:
    """Verify the checkpoint (against its manifest when it has one) and that `prompts` was tokenized
    with its tokenizer; return the inputs as manifest resources."""
    # deferred: keeps torch out of start-up
    from alibi.model.checkpoint import checkpoint_resource, tokenizer_digest, verified_checkpoint
    from alibi.model.prompts import require_tokenizer_match

    model_dir = Path(model_dir)
    checked = verified_checkpoint(model_dir)
    require_tokenizer_match(prompts, model_dir)
    resources = {"checkpoint": checkpoint_resource("checkpoint", model_dir, checked),
                 "prompts": {"name": "prompts", "digest": digest_set(prompts.digest)},
                 "tokenizer": {"name": "tokenizer", "digest": digest_set(tokenizer_digest(model_dir))}}
    return ReplayInputs(model_dir, prompts, resources, bool(checked["verified"]))


def replay_predicate(inputs: ReplayInputs, lm, arm: str, parameters: Mapping[str, Any],
                     protocol: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The manifest predicate of one arm's replay output: inputs, the kernel treatment as `arm`,
    the parameters plus the device and checkpoint verification, toolkit and environment, and the
    protocol record (`locked_protocol`) of a pre-registered replay."""
    treatment = None if lm.kernel is None else treatment_of(lm.kernel, arm)
    params = {**parameters, "device": lm.device.type, "execution": lm.execution.as_dict(),
              "checkpoint_verified_against_manifest": inputs.checkpoint_verified}
    return build_predicate(inputs=inputs.resources, treatment=treatment, parameters=params, protocol=protocol)


def locked_protocol(prereg: str | os.PathLike | None) -> dict[str, Any] | None:
    """The record a replay measured under the protocol folder `prereg` carries in its manifest
    (`predicate.protocol`: folder, lock hash, amendment-head hash, number of amendments), so that
    "locked before measured" rests on the manifest, not on git history or self-reported times.
    ProtocolViolation (one line, exit 2) when the folder is not locked or changed without an
    amendment. None without `prereg`."""
    if prereg is None:
        return None

    return require_locked(prereg).as_dict()


def recheck_protocol(prereg: str | os.PathLike | None, before: Mapping[str, Any] | None) -> None:
    """After measuring, before anything is written: the protocol still has the head it had when the
    replay started (ProtocolViolation otherwise: an amendment during the run, nothing is written)."""
    if prereg is None or before is None:
        return

    now = require_locked(prereg)
    if now.head_sha256 != before["head_sha256"]:
        raise ProtocolViolation(f"protocol {prereg} was amended while the replay ran (head {before['head_sha256']} "
                                f"-> {now.head_sha256}); nothing was written: run the replay again under the new head")


def combined_predicate(arm_dirs: Mapping[str, str | os.PathLike], parameters: Mapping[str, Any],
                       protocol: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The predicate of a folder holding several arms' outputs (label → arm folder): the inputs of the
    first arm (the arms' own manifests hold theirs; the caller has checked them against each other),
    each arm's treatment under its label, `parameters`, and `protocol` (which every arm's manifest must
    record too: InputError naming the arm otherwise). No kernel is imported here: the treatments are
    read back from the arms' manifests, as the arms' own processes recorded them."""
    arms, inputs = {}, None
    for label, folder in arm_dirs.items():
        predicate = read_manifest(folder).predicate
        inputs = predicate["inputs"] if inputs is None else inputs
        if (predicate.get("protocol") or None) != (None if protocol is None else dict(protocol)):
            raise InputError(f"{folder}: its manifest records protocol {predicate.get('protocol')!r}, not the one this "
                             f"replay runs under ({None if protocol is None else dict(protocol)!r}); run both arms "
                             "under the same locked protocol")
        t = predicate.get("treatment")
        if t is None:
            continue
        digest = (t.get("kernel_build_digest") or {}).get("sha256")
        arms[label] = Treatment(arm=t["arm"], kernel=t["kernel"], kernel_build_digest=digest,
                                epilogue_model=t.get("epilogue_model"), kernel_evidence=t.get("kernel_evidence"))
    return build_predicate(inputs=inputs, arms=arms or None, parameters=parameters, protocol=protocol)
