"""Constructed replay arms for the flip-analysis tests: real `ArmRecords` and real `replay` manifests."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from alibi.governance.manifest import (
    build_predicate,
    resource,
    treatment_of,
    write_manifest,
)
from alibi.kernels.registry import get_kernel
from alibi.tokens.records import ArmRecords, TokenRecord, write_records

KERNEL_A = "emulator:w_then_a"
KERNEL_B = "emulator:a_then_w"
CREATED = "2026-01-01T00:00:00Z"


def prompt_sha(window: int) -> str:
    return hashlib.sha256(f"window {window}".encode()).hexdigest()


def record(window: int, position: int, top1: int, margin: float, *, forced: int = 5,
           logits: str | None = None, sha: str | None = None) -> TokenRecord:
    """One scored position (forced token 5 unless given); the log-probabilities agree with the margin."""
    return TokenRecord(window=window, prompt_sha256=sha or prompt_sha(window), position=position,
                       forced_id=forced, forced_logprob=-0.5, top1_id=top1,
                       top1_logprob=-0.5, top2_logprob=-0.5 - margin, margin=margin, logits_sha256=logits)


def records_from(margins: Sequence[Sequence[float]], flips: Sequence[Sequence[bool]], *, arm: str,
                 context: int = 4) -> list[TokenRecord]:
    """Window w, position context+j: margin margins[w][j]; arm B's top-1 differs where flips[w][j]."""
    out = []
    for w, (ms, fs) in enumerate(zip(margins, flips)):
        for j, (m, f) in enumerate(zip(ms, fs)):
            top1 = 7 if arm == "b" and f else 5
            out.append(record(w, context + j, top1, m))
    return out


def inputs(root: Path, *, checkpoint: bytes = b"weights", prompts: bytes = b'{"window": 0}\n') -> dict[str, Path]:
    root.mkdir(parents=True, exist_ok=True)
    (root / "model.safetensors").write_bytes(checkpoint)
    (root / "prompts.jsonl").write_bytes(prompts)
    (root / "tokenizer.json").write_text('{"vocab": {}}')
    return {"checkpoint": root / "model.safetensors", "prompts": root / "prompts.jsonl",
            "tokenizer": root / "tokenizer.json"}


def write_arm(folder: Path, records: Iterable[TokenRecord], *, kernel: str, arm: str, inputs: dict[str, Path],
              context: int = 4, positions: int | None = None, windows: Sequence[int] | None = None,
              created_at: str = CREATED, records_text: str | None = None) -> Path:
    """An arm folder as `alibi replay teacher-forced` writes it: records.json + a `replay` manifest."""
    records = tuple(records)
    windows = tuple(dict.fromkeys(r.window for r in records)) if windows is None else tuple(windows)
    per_window = max((sum(r.window == w for r in records) for w in windows), default=0)
    arm_records = ArmRecords(kernel=kernel, context=context, positions=per_window if positions is None else positions,
                             windows=windows, records=records)
    folder.mkdir(parents=True)
    if records_text is None:
        write_records(arm_records, folder)
    else:  # records written by hand (e.g. a NaN margin the ArmRecords writer refuses), then pinned
        (folder / "records.json").write_text(records_text)
    predicate = build_predicate(inputs={k: resource(k, p) for k, p in inputs.items()},
                                treatment=treatment_of(get_kernel(kernel), arm),
                                parameters={"context": context, "positions": arm_records.positions,
                                            "windows": len(windows)}, created_at=created_at)
    write_manifest(folder, "replay", predicate)
    return folder


def write_pair(root: Path, margins, flips, **kw) -> tuple[Path, Path]:
    """Two arms over the same inputs that differ only in the kernel."""
    ins = inputs(root / "inputs")
    a = write_arm(root / "arm-a", records_from(margins, flips, arm="a"), kernel=KERNEL_A, arm="a", inputs=ins, **kw)
    b = write_arm(root / "arm-b", records_from(margins, flips, arm="b"), kernel=KERNEL_B, arm="b", inputs=ins, **kw)
    return a, b


def write_flips(root: Path, margins, flips, *, kernels: tuple[str, str] = (KERNEL_A, KERNEL_B)) -> Path:
    """A real flips.json from two constructed arms (small bootstrap: the tests that use it read the flip rate)."""
    from alibi.tokens.flips import FLIPS_FILE, analyze_flips

    ins = inputs(root / "inputs")
    a = write_arm(root / "arm-a", records_from(margins, flips, arm="a"), kernel=kernels[0], arm="a", inputs=ins)
    b = write_arm(root / "arm-b", records_from(margins, flips, arm="b"), kernel=kernels[1], arm="b", inputs=ins)
    analyze_flips(a, b, root / "flips", bootstrap=20)
    return root / "flips" / FLIPS_FILE
