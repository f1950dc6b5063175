"""The records of one arm as every shape reads them: `Step` (one scored position) and `ArmSteps` (one arm).

`alibi.tokens.arms.read_arm` reads any accepted shape into these; `alibi.tokens.foreign` holds the
two shapes another tool publishes. The shape names are the `shape` of an `ArmSteps`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from alibi.tokens.records import SCHEMA as ALIBI_SHAPE

LIST_SHAPE = "per-prompt-list"
ENVELOPE_SHAPE = "manifest-envelope"
SHAPES = (ALIBI_SHAPE, LIST_SHAPE, ENVELOPE_SHAPE)


@dataclass(frozen=True)
class Step:
    """One scored position, in the fields all three shapes share.

    prompt: the prompt part of the join key — the window index (alibi arm, list shape: the
    element's index) or the prompt's sha (envelope); position: the scored position in the prompt;
    top1_id: the arm's top-1 token; margin: top-1 minus top-2 logit (finite, ≥ 0);
    prompt_sha256, forced_id, logits_sha256: carried where the shape has them (else None) and
    compared between the arms at each joined key.
    """

    prompt: int | str
    position: int
    top1_id: int
    margin: float
    prompt_sha256: str | None = None
    forced_id: int | None = None
    logits_sha256: str | None = None

    @property
    def key(self) -> tuple[int | str, int]:
        return (self.prompt, self.position)


@dataclass(frozen=True)
class ArmSteps:
    """One arm, read.

    path: as given on the command line; shape: one of `SHAPES`; records_file: the JSON file read;
    records_sha256: its digest; kernel: the kernel its records name (alibi registry name, the
    envelope's `kernel_class`; None for the list shape); steps: in file order; manifest_path:
    the alibi manifest beside the records (alibi shape only); envelope_manifest: the envelope's
    `manifest` object (envelope shape only).
    """

    path: str
    shape: str
    records_file: str
    records_sha256: str
    kernel: str | None
    steps: tuple[Step, ...]
    manifest_path: str | None = None
    envelope_manifest: Mapping[str, Any] | None = None

    @property
    def prompts(self) -> tuple[int | str, ...]:
        """Prompt keys in order of first appearance in the records."""
        return tuple(dict.fromkeys(s.prompt for s in self.steps))


__all__ = ["ALIBI_SHAPE", "ENVELOPE_SHAPE", "LIST_SHAPE", "SHAPES", "ArmSteps", "Step"]
