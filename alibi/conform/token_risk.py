"""Check 7's input: a flip analysis (`flips.json`) brought to `alibi conform --replay` or an experiment's `replay:`.

Argument. Tiles carry no tokens, so `token-level-risk` can only be judged on a teacher-forced
replay of a model with the same two kernels. The flip rate is read from the `FlipAnalysis` that
`alibi analyze flips` wrote (never from a number typed in), the file's sha256 is recorded in the
report, and the analysis must be of the pair under test: when both arms name alibi kernels,
their set must equal the conform pair's (the order does not matter: a flip is symmetric).
Arms read from another tool's records name no alibi kernel; that pairing cannot be checked and
the report says so (`pair_checked: false`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alibi.conform import checks
from alibi.errors import InputError
from alibi.governance.verified import verified_file
from alibi.tokens.flips import FLIPS_FILE, FlipAnalysis
from alibi.tokens.steps import ALIBI_SHAPE

DEFAULT_FLIP_THRESHOLD = 0.05


@dataclass(frozen=True)
class ReplayEvidence:
    """A flip analysis as check 7 uses it.

    path: the flips.json read (the file itself when a folder was given); sha256: digest of the bytes read; bound: the workload's
    flip-rate bound (`--flip-threshold`); flip_rate, n_flips, n_positions: from the analysis;
    kernels: the two arms' kernels as their records name them; alibi_kernels: both arms are alibi
    arms, so `kernels` are registry names; verified: the arms passed the identity contract.
    """

    path: str
    sha256: str
    bound: float
    flip_rate: float
    n_flips: int
    n_positions: int
    kernels: tuple[str | None, str | None]
    alibi_kernels: bool
    verified: bool

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "bound": self.bound, "flip_rate": self.flip_rate,
                "n_flips": self.n_flips, "n_positions": self.n_positions, "kernels": list(self.kernels),
                "pair_checked": self.alibi_kernels, "identity_verified": self.verified}

    def resource(self) -> dict[str, Any]:
        """The manifest input descriptor of the flips.json, pinned to the bytes that were read."""
        return {"name": self.path, "digest": {"sha256": self.sha256}}

    def verdict(self) -> checks.Verdict:
        """Check 7 on this replay."""
        return checks.token_level_risk(self.flip_rate, self.bound, evidence=self.as_dict())

    def require_pair(self, kernel_a: str, kernel_b: str) -> None:
        """InputError unless the analysis is of this kernel pair (checkable only for alibi arms)."""
        if self.alibi_kernels and sorted(map(str, self.kernels)) != sorted((kernel_a, kernel_b)):
            raise InputError(f"--replay {self.path}: the flip analysis compares {self.kernels[0]} with "
                             f"{self.kernels[1]}, not {kernel_a} with {kernel_b}; replay the pair under test")


def check_bound(bound: Any, where: str = "--flip-threshold") -> float:
    """The flip-rate bound as a float in [0, 1]; InputError otherwise."""
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not math.isfinite(bound) \
            or not 0 <= bound <= 1:
        raise InputError(f"{where} must be a flip rate between 0 and 1, got {bound!r}")
    return float(bound)


def load_replay(path: str | os.PathLike, bound: float = DEFAULT_FLIP_THRESHOLD) -> ReplayEvidence:
    """Read `path` (a flips.json, or the folder holding one) through `FlipAnalysis.from_json`, once its manifest
    (kind `flip-analysis`) vouches for every byte of its folder (`alibi.governance.verified`)."""
    bound = check_bound(bound)
    p = Path(path)
    f = p / FLIPS_FILE if p.is_dir() else p
    if not f.is_file():
        raise InputError(f"--replay {f}: no such flip analysis; pass the flips.json written by `alibi analyze flips`")
    verified = verified_file(f, ("flip-analysis",), fix="pass --replay the flips.json `alibi analyze flips` wrote, "
                             "its folder as it wrote it")
    fa = FlipAnalysis.from_json(verified.text(), f"--replay {f}")
    return ReplayEvidence(path=str(f), sha256=verified.sha256, bound=bound, flip_rate=fa.flip_rate,
                          n_flips=fa.n_flips, n_positions=fa.n_positions, kernels=(fa.arm_a.kernel, fa.arm_b.kernel),
                          alibi_kernels=fa.arm_a.shape == fa.arm_b.shape == ALIBI_SHAPE
                          and None not in (fa.arm_a.kernel, fa.arm_b.kernel),
                          verified=fa.identity.verified)


__all__ = ["DEFAULT_FLIP_THRESHOLD", "ReplayEvidence", "check_bound", "load_replay"]
