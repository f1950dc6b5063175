"""Kernel-selection evidence from an engine's log: vLLM's "Selected <kernel class> for <layer>" lines.

vLLM chooses a linear kernel per quantization scheme at load time and logs the choice
(vllm/model_executor/kernels/linear/__init__.py, `logger.info_once("Selected %s for %s", ...)`),
e.g. `INFO 12-01 09:46:00 [__init__.py:671] Selected CutlassInt8ScaledMMLinearKernel for
CompressedTensorsW8A8Int8`. Which kernel ran is the treatment of an engine arm, so a manifest
records those lines, and the identity contract compares them as treatment fields: they live under
`predicate.treatment.kernel_log`, which the `kernel` treatment allows to differ and every other
treatment requires to be equal.

What is recorded (`KernelLog`): the log file's name and sha256, the matching messages in file
order (from "Selected" on: the timestamp and process prefix vary between runs of the same
choice, the message does not), and the distinct (kernel class, target) pairs. A log with no such
line is refused (one line, exit 2): it cannot evidence a kernel choice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alibi.errors import InputError, one_line, shown
from alibi.io.digests import digest_set, sha256_bytes
from alibi.io.typed import TypedResult

SCHEMA = "alibi.kernel-log/1"
# One identifier between "Selected" and "for": vLLM's other "Selected ..." messages ("Selected
# backend X is not valid for", "Selected MLA prefill backend ...") have several words there.
SELECTED = re.compile(r"\bSelected ([A-Za-z_][A-Za-z0-9_]*) for ([A-Za-z_][\w.\-]*)")


@dataclass(frozen=True)
class KernelSelection:
    """One choice: vLLM's kernel class (`kernel_class`) for a scheme or layer (`target`)."""

    kernel_class: str
    target: str


@dataclass(frozen=True)
class KernelLog(TypedResult):
    """The kernel-selection evidence of one log file.

    name: the log file's name as given; sha256: of its bytes; lines: every matching message, in
    file order, from "Selected" to the end of the target; selections: the distinct pairs, in order
    of first appearance.
    """

    SCHEMA = SCHEMA
    REMEDY = "record the engine's log again (`--kernel-log`)"

    name: str
    sha256: str
    lines: tuple[str, ...]
    selections: tuple[KernelSelection, ...]
    schema: str = SCHEMA

    @property
    def kernel_classes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.kernel_class for s in self.selections))

    def _layout_out(self, doc: dict[str, Any]) -> dict[str, Any]:
        """As stored: the schema first, the log's sha256 as a digest set (`alibi.io.typed`)."""
        return {"schema": doc["schema"], "name": doc["name"], "log_digest": digest_set(doc["sha256"]),
                "lines": doc["lines"], "selections": doc["selections"]}

    @classmethod
    def _layout_in(cls, doc: dict[str, Any], where: str) -> dict[str, Any]:
        digest = doc.pop("log_digest", None)
        if not isinstance(digest, dict):
            raise InputError(f"{one_line(where)}.log_digest: expected a digest set {{\"sha256\": …}}, got "
                             f"{shown(digest, 60)}")
        return {**doc, "sha256": digest_set(digest.get("sha256"))["sha256"]}


def parse_kernel_log(data: bytes, name: str) -> KernelLog:
    """The evidence in log bytes `data` (UTF-8; undecodable bytes are replaced, the digest is of the bytes)."""
    lines, seen = [], {}
    for line in data.decode("utf-8", errors="replace").splitlines():
        for m in SELECTED.finditer(line):
            lines.append(m.group(0))
            seen.setdefault((m.group(1), m.group(2)), None)
    if not lines:
        raise InputError(f"{name}: no line 'Selected <kernel class> for <layer>' in it; pass the log of the vLLM "
                         "run (vLLM logs its linear-kernel choice at INFO level when it loads the model)")
    return KernelLog(name=name, sha256=sha256_bytes(data), lines=tuple(lines),
                     selections=tuple(KernelSelection(k, t) for k, t in seen))


def read_kernel_log(path: str | Path) -> KernelLog:
    """Read and parse a log file; InputError (one line) if it is missing, unreadable or has no selection."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise InputError(f"--kernel-log {p}: cannot read it ({exc.strerror}); pass the vLLM log file") from None
    return parse_kernel_log(data, p.name)


def require_consistent(log: KernelLog, kernel: Any) -> None:
    """InputError unless the log selected the vLLM class(es) that `kernel` runs (when it declares any)."""
    declared = tuple(getattr(kernel, "vllm_linear_kernels", ()) or ())
    if not declared:
        return
    other = [k for k in log.kernel_classes if k not in declared]
    if other:
        raise InputError(f"{log.name}: vLLM selected {', '.join(other)}, but kernel {kernel.name!r} runs "
                         f"{', '.join(declared)}; record the kernel that ran")


__all__ = ["SCHEMA", "KernelLog", "KernelSelection", "parse_kernel_log", "read_kernel_log",
           "require_consistent"]
