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

from alibi.errors import InputError
from alibi.io.digests import digest_set, sha256_bytes

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
class KernelLog:
    """The kernel-selection evidence of one log file.

    name: the log file's name as given; sha256: of its bytes; lines: every matching message, in
    file order, from "Selected" to the end of the target; selections: the distinct pairs, in order
    of first appearance.
    """

    name: str
    sha256: str
    lines: tuple[str, ...]
    selections: tuple[KernelSelection, ...]
    schema: str = SCHEMA

    @property
    def kernel_classes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.kernel_class for s in self.selections))

    def to_json(self) -> dict[str, Any]:
        return {"schema": self.schema, "name": self.name, "log_digest": digest_set(self.sha256),
                "lines": list(self.lines),
                "selections": [{"kernel_class": s.kernel_class, "target": s.target} for s in self.selections]}

    @classmethod
    def from_json(cls, doc: Any) -> KernelLog:
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
            raise InputError(f"kernel_log: schema {found!r} is not {SCHEMA!r}")
        try:
            return cls(name=str(doc["name"]), sha256=digest_set(doc["log_digest"]["sha256"])["sha256"],
                       lines=tuple(str(x) for x in doc["lines"]),
                       selections=tuple(KernelSelection(str(s["kernel_class"]), str(s["target"]))
                                        for s in doc["selections"]))
        except (KeyError, TypeError) as exc:
            raise InputError(f"kernel_log: field {exc} is missing or malformed") from None


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
