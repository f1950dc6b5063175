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

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

from alibi.errors import InputError
from alibi.io import atomic
from alibi.io.digests import sha256_bytes

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
class ArmRecords:
    """One arm's teacher-forced run.

    kernel: the registry name of the kernel its quantized Linears ran (None for a dense model);
    context: tokens of context before the first scored position; positions: scored positions per
    window; windows: the prompt-set window indices scored, in order; records: every scored
    position, window-major then position order.
    """

    kernel: str | None
    context: int
    positions: int
    windows: tuple[int, ...]
    records: tuple[TokenRecord, ...]
    schema: str = SCHEMA

    def to_json(self) -> str:
        doc = {"schema": self.schema, "kernel": self.kernel, "context": self.context, "positions": self.positions,
               "windows": list(self.windows), "records": [asdict(r) for r in self.records]}
        return json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "records.json") -> "ArmRecords":
        """Parse and validate; InputError naming `where` and the first problem."""
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, RecursionError, UnicodeError) as exc:
            raise InputError(f"{where}: not valid JSON ({str(exc).splitlines()[0]}); the file is empty, "
                             "truncated or not a records file: re-run the replay arm") from None
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise InputError(f"{where}: not an alibi teacher-forced records file (schema must be {SCHEMA!r})")
        try:
            records = tuple(_record(r, where, i) for i, r in enumerate(doc["records"]))
            arm = cls(kernel=doc["kernel"], context=int(doc["context"]), positions=int(doc["positions"]),
                      windows=tuple(int(w) for w in doc["windows"]), records=records)
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{where}: malformed records file ({exc!r}); re-run the replay arm") from None
        return arm


_TYPES = {f.name: f.type for f in fields(TokenRecord)}


def _record(raw: Any, where: str, index: int) -> TokenRecord:
    if not isinstance(raw, dict):
        raise InputError(f"{where}: record {index} is not an object")
    missing = [n for n in _TYPES if n not in raw and n != "logits_sha256"]
    if missing:
        raise InputError(f"{where}: record {index} lacks {', '.join(missing)}")
    rec = TokenRecord(**{n: raw.get(n) for n in _TYPES})
    for name in ("window", "position", "forced_id", "top1_id"):
        if not isinstance(getattr(rec, name), int) or isinstance(getattr(rec, name), bool):
            raise InputError(f"{where}: record {index}: {name} must be an integer")
    for name in ("forced_logprob", "top1_logprob", "top2_logprob", "margin"):
        value = getattr(rec, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise InputError(f"{where}: record {index} (window {rec.window}, position {rec.position}): "
                             f"{name} is {value!r}, not a finite number")
    return rec


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
