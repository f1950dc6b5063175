"""A check's outcome (`Verdict`, with its `Status`), the check identifiers in report order, and how verdicts combine.

Torch-free, so that reading a report (`alibi.conform.results`) costs no torch import; the checks
themselves are in `alibi.conform.checks`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from alibi.errors import InputError, one_line, shown

# Check identifiers, in report order, with the paper's number where it has one.
CHECKS: dict[str, str] = {
    "shared-operands": "1. both arms received bitwise-identical operands and scales",
    "int32-no-overflow": "2. the int32 accumulator cannot wrap at this K",
    "lossless-fp32-entry": "3. every accumulator is ≤ 2^24 and enters fp32 exactly",
    "exact-accumulator": "4. exposed int32 accumulators equal the exact reference",
    "pow2-identity": "5. under power-of-two weight scales the outputs are bitwise equal",
    "real-scale-tolerance": "6. under real scales the outputs differ by at most the ulp threshold",
    "token-level-risk": "7. teacher-forced token flip rate within the workload's bound",
    "epilogue-model": "each arm's output equals its declared epilogue model bit for bit",
    "predicted-differences": "the arms differ exactly where their declared epilogue models, applied to the exact "
                             "accumulator, differ",
    "m-invariance": "a row's output does not depend on M or on the row's position",
    "run-to-run": "each arm gives the same bits when run twice",
}
EXACT = {name: name not in ("real-scale-tolerance", "token-level-risk") for name in CHECKS}
DEFAULT_ULP_THRESHOLD = 1


class Status(StrEnum):
    """What a check did on a unit: found a violation, applied and found none, or decided nothing."""

    PASSED = "passed"
    FIRED = "fired"
    INAPPLICABLE = "inapplicable"


@dataclass(frozen=True)
class Verdict:
    """One check's outcome on one unit of evidence (a tile under one scale regime, or a summary).

    fired: the check found a violation; applicable: its inputs exist and its precondition holds
    (when False, `fired` is False and the check decided nothing); exact: an exact (bitwise or
    integer) check rather than a tolerance check; threshold: the tolerance, for tolerance checks;
    detail: one human-readable sentence; evidence: the numbers behind it.
    """

    check: str
    fired: bool
    applicable: bool
    detail: str
    threshold: float | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        return EXACT[self.check]

    @property
    def status(self) -> Status:
        return Status.INAPPLICABLE if not self.applicable else (Status.FIRED if self.fired else Status.PASSED)

    def _layout_out(self, doc: dict[str, Any]) -> dict[str, Any]:
        """As stored: `exact` and `status` written for readers, after `applicable` (`alibi.io.typed`)."""
        return {"check": doc["check"], "fired": doc["fired"], "applicable": doc["applicable"], "exact": self.exact,
                "status": self.status.value,
                "threshold": doc["threshold"], "detail": doc["detail"], "evidence": doc["evidence"]}

    @classmethod
    def _layout_in(cls, doc: dict[str, Any], where: str) -> dict[str, Any]:
        """`exact` and `status` are derived, so they are checked against the check and fired/applicable, not stored."""
        exact, status = doc.pop("exact", None), doc.pop("status", None)
        check, fired, applicable = doc.get("check"), doc.get("fired"), doc.get("applicable")
        if check not in CHECKS:
            raise InputError(f"{one_line(where)}.check: {shown(check, 60)} is not a check of this version "
                             f"({', '.join(CHECKS)})")
        if isinstance(fired, bool) and isinstance(applicable, bool):
            derived = Status.INAPPLICABLE if not applicable else (Status.FIRED if fired else Status.PASSED)
            if (status is not None and status != derived) or (exact is not None and exact != EXACT[check]):
                raise InputError(f"{one_line(where)}: status/exact of check {check!r} do not follow from "
                                 "fired/applicable")
        return doc


def fired(check: str, detail: str, **kw: Any) -> Verdict:
    """A verdict for a check that found a violation."""
    return Verdict(check, True, True, detail, **kw)


def passed(check: str, detail: str, **kw: Any) -> Verdict:
    """A verdict for an applicable check that found nothing."""
    return Verdict(check, False, True, detail, **kw)


def inapplicable(check: str, detail: str, **kw: Any) -> Verdict:
    """A verdict for a check whose inputs are missing or whose precondition fails (never a pass)."""
    return Verdict(check, False, False, detail, **kw)


def combine(verdicts: list[Verdict]) -> Verdict:
    """One summary verdict for a check over many units: fired if any unit fired, applicable if any applied."""
    check = verdicts[0].check
    applicable = [v for v in verdicts if v.applicable]
    fired = [v for v in applicable if v.fired]
    threshold = next((v.threshold for v in verdicts if v.threshold is not None), None)
    ev = {"units": len(verdicts), "applicable": len(applicable), "fired": len(fired),
          "inapplicable": len(verdicts) - len(applicable)}
    if not applicable:
        reasons = sorted({v.detail for v in verdicts})
        return Verdict(check, False, False, "inapplicable: " + "; ".join(reasons[:3]), threshold, ev)
    if fired:
        return Verdict(check, True, True, f"fired on {len(fired)} of {len(applicable)} applicable units; first: "
                       f"{fired[0].detail}", threshold, ev)
    return Verdict(check, False, True, f"passed on all {len(applicable)} applicable units", threshold, ev)
