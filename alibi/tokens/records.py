"""Teacher-forced records: what one arm predicted at each scored position of a pinned text.

One arm's run is a folder:

    records.json    `ArmRecords` (schema `alibi-teacher-forced/v1`, below)
    manifest.json   alibi manifest (kind `replay`): checkpoint, prompt set, tokenizer, kernel
                    treatment and build digest, toolkit and environment

Per scored position (`TokenRecord`): the window of the prompt set, the sha256 of that window's
token ids, the position `p` of the predicted token inside the window (the model has seen tokens
`0 … p−1`, all from the pinned text: teacher forcing), the forced token (the text's actual token
at `p`) with its log-probability, the model's top-1 token, the top-1 and top-2 log-probabilities,
the margin `top1_logit − top2_logit` in fp32 (equal to the log-probability gap), and the sha256 of
the position's fp32 logit row (little-endian bytes), so two arms' logits can be compared bitwise
without storing them. Log-probabilities are fp32 `log_softmax` of the fp32 logits, stored as the
float64 value of that fp32 number.

A flip between two arms at one (window, position) is `top1_id` of A ≠ `top1_id` of B.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from alibi.errors import InputError
from alibi.io import atomic
from alibi.io.digests import sha256_bytes
from alibi.io.typed import TypedResult

SCHEMA = "alibi-teacher-forced/v1"
RECORDS_FILE = "records.json"


@dataclass(frozen=True)
class TokenRecord:
    """One scored position of one window (see the module docstring for each field)."""

    window: int
    prompt_sha256: str
    position: int
    forced_id: int
    forced_logprob: float
    top1_id: int
    top1_logprob: float
    top2_logprob: float
    margin: float
    logits_sha256: str | None = None

    @property
    def key(self) -> tuple[int, int]:
        """The join key of two arms: (window, position)."""
        return (self.window, self.position)


@dataclass(frozen=True)
class ArmRecords(TypedResult):
    """One arm's teacher-forced run.

    kernel: the registry name of the kernel its quantized Linears ran (None for a dense model);
    context: tokens of context before the first scored position; positions: scored positions per
    window; windows: the prompt-set window indices scored, in order; records: every scored
    position, window-major then position order.
    """

    SCHEMA = SCHEMA
    JSON_SORT_KEYS = True
    REMEDY = "re-run the replay arm"
    FILE = RECORDS_FILE

    kernel: str | None
    context: int
    positions: int
    windows: tuple[int, ...]
    records: tuple[TokenRecord, ...]
    schema: str = SCHEMA


def window_sha256(ids: torch.Tensor) -> str:
    """sha256 of a window's token ids as int32 little-endian bytes (the `prompt_sha256` field)."""
    return sha256_bytes(ids.reshape(-1).to(torch.int32).contiguous().numpy().astype("<i4").tobytes())


def logits_sha256(row: torch.Tensor) -> str:
    """sha256 of one fp32 logit row's little-endian bytes (the `logits_sha256` field)."""
    return sha256_bytes(row.detach().to(torch.float32).cpu().contiguous().numpy().astype("<f4").tobytes())


def write_records(arm: ArmRecords, folder: str | Path) -> Path:
    """Write `folder/records.json` atomically."""
    return atomic.write_text(Path(folder) / RECORDS_FILE, arm.to_json())


def read_records(path: str | Path) -> ArmRecords:
    """Read an arm folder (or its records.json); InputError for anything that is not one."""
    p = Path(path)
    f = p / RECORDS_FILE if p.is_dir() else p
    try:
        text = f.read_text(encoding="utf-8")
    except (OSError, UnicodeError) as exc:
        raise InputError(f"{f}: cannot read the records file ({exc.__class__.__name__}: {exc}); "
                         "pass an arm folder written by `alibi replay teacher-forced`") from None
    return ArmRecords.from_json(text, str(f))
