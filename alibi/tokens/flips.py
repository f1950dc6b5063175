"""`analyze_flips`: how often two kernel arms pick different top-1 tokens, and how well arm A's margin
predicts where.

Order of work, each step failing closed before anything is written:

1. read both arms in any accepted shape (`alibi.tokens.arms`);
2. the identity contract: two alibi arms through `alibi.governance.require_identity` with the
   kernel as the only treatment; two envelopes field by field (`alibi.tokens.foreign`); a
   per-prompt list, or arms of different shapes, carry no comparable identity. A violation, or
   an arm without identity, raises `IdentityViolation` (exit 1) naming the field, unless
   `allow_unverified`, which is then recorded in the output;
3. the join (`alibi.tokens.join`): duplicate keys, different text at a joined key, no shared
   position are input errors; keys in one arm only are counted;
4. the statistics (`alibi.tokens.margin`), seeded: one `numpy.random.SeedSequence(seed)` spawns two
   independent streams, the first for the AUC bootstrap, the second for the Brier bootstrap;
5. the output folder, staged and renamed once: `flips.json` (`FlipAnalysis`, schema
   `alibi-flips/v1`), `flips.md`, `manifest.json` (kind `flip-analysis`).

The field-by-field meaning of `flips.json` is in docs/flips.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from alibi.errors import InputError, one_line
from alibi.governance.identity import (
    IdentityRecord,
    IdentityViolation,
    require_identity,
)
from alibi.governance.manifest import (
    Treatment,
    build_predicate,
    read_manifest,
    resource,
    sha256_file,
    write_manifest,
)
from alibi.governance.verified import read_verified
from alibi.io import atomic
from alibi.io.limits import MAX_BOOTSTRAP, check_count
from alibi.io.typed import TypedResult
from alibi.tokens.arms import read_arm
from alibi.tokens.foreign import compare_envelopes
from alibi.tokens.join import Joined, join_arms, require_same_keying
from alibi.tokens.margin import (
    CalibrationBin,
    Computed,
    LeaveOnePromptOut,
    MarginDecile,
    Status,
    average_precision,
    bootstrap_auc,
    calibrate,
    leave_one_prompt_out,
    margin_deciles,
    one_class_reason,
    roc_auc,
)
from alibi.tokens.steps import ALIBI_SHAPE, ENVELOPE_SHAPE, ArmSteps

SCHEMA = "alibi-flips/v1"
FLIPS_FILE = "flips.json"
SUMMARY_FILE = "flips.md"
KIND = "flip-analysis"
DEFAULT_BOOTSTRAP = 5000


@dataclass(frozen=True)
class ArmSource:
    """Where one arm came from: path as given, shape, the records file and its sha256, the manifest's
    sha256 (alibi arms), the kernel its records name, records read and prompts in it."""

    path: str
    shape: str
    records_file: str
    records_sha256: str
    manifest_sha256: str | None
    kernel: str | None
    n_records: int
    n_prompts: int


@dataclass(frozen=True)
class IdentityCheck:
    """How the two arms' identity was checked and what was found.

    method: `alibi-manifest` (require_identity on the arms' manifests), `envelope-manifest`
    (the envelopes' manifests field by field) or `none` (an arm carries no identity);
    verified: no problem found; allow_unverified: the analysis ran despite problems because it
    was asked to; problems: every violation, naming the field; differing: the treatment fields
    that do differ; record: the full identity record (`alibi-identity/v1`), None for `none`.
    """

    method: str
    verified: bool
    allow_unverified: bool
    problems: tuple[str, ...]
    differing: tuple[str, ...]
    record: Mapping[str, Any] | None


@dataclass(frozen=True)
class FlipAnalysis(TypedResult):
    """The result of `analyze_flips` (`flips.json`); every field is documented in docs/flips.md.

    A statistic that could not be computed is None, with a `statuses` entry giving the reason;
    no field is ever NaN.
    """

    SCHEMA = SCHEMA
    JSON_SORT_KEYS = True
    REMEDY = "pass the flips.json written by `alibi analyze flips`"
    FILE = FLIPS_FILE

    arm_a: ArmSource
    arm_b: ArmSource
    identity: IdentityCheck
    n_positions: int
    n_flips: int
    flip_rate: float
    n_prompts: int
    n_only_a: int
    n_only_b: int
    logits_compared: int
    logits_identical: int | None
    max_flip_margin: float | None
    roc_auc: float | None
    roc_auc_ci90: tuple[float, float] | None
    average_precision: float | None
    seed: int
    bootstrap: int
    bootstrap_skipped: int
    lopo_auc: LeaveOnePromptOut | None
    deciles: tuple[MarginDecile, ...]
    calibration_prompts: int
    evaluation_prompts: int
    n_calibration: int
    n_evaluation: int
    calibration_flip_rate: float | None
    bins: tuple[CalibrationBin, ...]
    brier_heldout: float | None
    brier_baseline: float | None
    brier_isotonic: float | None
    brier_heldout_ci90: tuple[float, float] | None
    brier_difference_ci90: tuple[float, float] | None
    statuses: tuple[Status, ...]
    schema: str = SCHEMA

    def status(self, statistic: str) -> Status:
        """The status entry of one statistic (KeyError if it has none)."""
        for s in self.statuses:
            if s.statistic == statistic:
                return s
        raise KeyError(statistic)

    @classmethod
    def from_dict(cls, doc: Any, where: str = "") -> FlipAnalysis:
        """The typed reading (`alibi.io.typed`), then the counts checked against each other."""
        analysis = super().from_dict(doc, where)
        if analysis.n_positions < 1 or not 0 <= analysis.n_flips <= analysis.n_positions \
                or analysis.flip_rate != analysis.n_flips / analysis.n_positions:
            raise InputError(f"{one_line(where or FLIPS_FILE)}: n_positions {analysis.n_positions}, n_flips "
                             f"{analysis.n_flips} and flip_rate {analysis.flip_rate} are inconsistent; the file was "
                             "edited or damaged")
        return analysis


def read_flips(path: str | os.PathLike) -> FlipAnalysis:
    """Read a flips.json (or the analysis folder holding one) once its manifest (kind `flip-analysis`) vouches
    for it (`alibi.governance.verified`); InputError naming the file if it is not one."""
    return read_verified(path, FlipAnalysis, (KIND,))


# identity ------------------------------------------------------------------------------------
def _violation(a: ArmSteps, b: ArmSteps, problems: tuple[str, ...]) -> IdentityViolation:
    return IdentityViolation(f"{a.path} and {b.path} break the identity contract: {'; '.join(problems)}. Fix the "
                             "inputs, or pass --allow-unverified to proceed anyway (it is recorded in the output)")


def check_identity(a: ArmSteps, b: ArmSteps, allow_unverified: bool = False) -> IdentityCheck:
    """The identity gate for two arms (module docstring, step 2)."""
    if a.shape == b.shape == ALIBI_SHAPE:
        record = require_identity(Path(a.manifest_path).parent, Path(b.manifest_path).parent, ("kernel",),
                                  allow_unverified=allow_unverified)
        method = "alibi-manifest"
    elif a.shape == b.shape == ENVELOPE_SHAPE:
        record = compare_envelopes(a, b)
        if record.problems and not allow_unverified:
            raise _violation(a, b, record.problems)
        record = IdentityRecord(**{**record.__dict__, "allow_unverified": allow_unverified})
        method = "envelope-manifest"
    else:
        lacking = [arm for arm in (a, b) if arm.shape not in (ALIBI_SHAPE, ENVELOPE_SHAPE)]
        problems = tuple(f"{arm.path}: a {arm.shape} records file carries no identity (checkpoint, prompts, "
                         "kernel), so nothing shows that only the kernel differs" for arm in lacking)
        if not lacking:
            problems = ((f"{a.path} ({a.shape}) and {b.path} ({b.shape}) record their identity in different "
                         "shapes that cannot be compared field by field"),)
        if not allow_unverified:
            raise _violation(a, b, problems)
        return IdentityCheck("none", False, True, problems, (), None)
    return IdentityCheck(method, record.verified, record.allow_unverified, record.problems, record.differing,
                         record.as_dict())


# statistics ----------------------------------------------------------------------------------
def _arm_source(arm: ArmSteps) -> ArmSource:
    return ArmSource(path=arm.path, shape=arm.shape, records_file=arm.records_file,
                     records_sha256=arm.records_sha256,
                     manifest_sha256=sha256_file(arm.manifest_path) if arm.manifest_path else None,
                     kernel=arm.kernel, n_records=len(arm.steps), n_prompts=len(arm.prompts))


def _status(name: str, reason: str | None) -> Status:
    return Status(name, Computed.UNDEFINED, reason) if reason else Status(name, Computed.OK)


def flip_statistics(joined: Joined, arm_a: ArmSource, arm_b: ArmSource, identity: IdentityCheck, *,
                    seed: int = 0, bootstrap: int = DEFAULT_BOOTSTRAP,
                    progress: Callable[[str], None] | None = None) -> FlipAnalysis:
    """Every statistic of `FlipAnalysis` from two joined arms (pure: no I/O)."""
    say = progress or (lambda _m: None)
    flip, margin, cluster = joined.flip, joined.margin_a, joined.cluster
    n_prompts = len(joined.prompts)
    auc_rng, brier_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    one_class = one_class_reason(flip)

    say(f"{joined.n_positions} positions in {n_prompts} prompts, {int(flip.sum())} flips; "
        f"AUC bootstrap over {bootstrap} replicates")
    ci = bootstrap_auc(flip, margin, cluster, n_prompts, bootstrap, auc_rng,
                       progress=lambda done, total: say(f"  AUC bootstrap {done}/{total}"))
    lopo, lopo_reason = leave_one_prompt_out(flip, margin, cluster, n_prompts)
    deciles = margin_deciles(flip, margin)
    say("calibration: fit on even prompts, Brier on odd prompts")
    cal = calibrate(flip, margin, cluster, n_prompts, bootstrap, brier_rng)

    empty_deciles = [d.decile for d in deciles if d.n == 0]
    empty_bins = [b.index for b in cal.bins if b.n_evaluation == 0]
    statuses = (
        _status("roc_auc", one_class),
        _status("roc_auc_ci90", ci.reason or None),
        _status("average_precision", one_class),
        _status("lopo_auc", lopo_reason or None),
        _status("deciles", f"decile(s) {', '.join(map(str, empty_deciles))} hold no position: tied margins share "
                           "a decile" if empty_deciles else None),
        _status("calibration", cal.reason or None),
        _status("bins", f"bin(s) {', '.join(map(str, empty_bins))} hold no held-out position" if empty_bins else None),
        _status("brier_heldout_ci90", cal.reason or (cal.brier_heldout_ci.reason if cal.brier_heldout_ci else None)),
        _status("max_flip_margin", "no flip" if not flip.any() else None),
        _status("logits_identical", "neither arm records logits_sha256 at a joined position"
                if joined.logits_compared == 0 else None),
    )
    interval = (lambda b: b.ci90 if b is not None else None)
    return FlipAnalysis(
        arm_a=arm_a, arm_b=arm_b, identity=identity,
        n_positions=joined.n_positions, n_flips=int(flip.sum()), flip_rate=int(flip.sum()) / joined.n_positions,
        n_prompts=n_prompts, n_only_a=joined.only_a, n_only_b=joined.only_b,
        logits_compared=joined.logits_compared,
        logits_identical=joined.logits_identical if joined.logits_compared else None,
        max_flip_margin=float(margin[flip].max()) if flip.any() else None,
        roc_auc=roc_auc(flip, margin), roc_auc_ci90=ci.ci90, average_precision=average_precision(flip, margin),
        seed=seed, bootstrap=bootstrap, bootstrap_skipped=ci.n_skipped,
        lopo_auc=lopo, deciles=deciles,
        calibration_prompts=cal.calibration_prompts, evaluation_prompts=cal.evaluation_prompts,
        n_calibration=cal.n_calibration, n_evaluation=cal.n_evaluation,
        calibration_flip_rate=cal.calibration_flip_rate, bins=cal.bins,
        brier_heldout=cal.brier_heldout, brier_baseline=cal.brier_baseline, brier_isotonic=cal.brier_isotonic,
        brier_heldout_ci90=interval(cal.brier_heldout_ci), brier_difference_ci90=interval(cal.brier_difference_ci),
        statuses=statuses)


# output --------------------------------------------------------------------------------------
def _num(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}g}"


def _ci(ci: tuple[float, float] | None) -> str:
    return "n/a" if ci is None else f"[{ci[0]:.4g}, {ci[1]:.4g}]"


def summary_lines(fa: FlipAnalysis) -> list[str]:
    """The few lines `alibi analyze flips` prints, and the head of flips.md."""
    ident = "verified" if fa.identity.verified else "UNVERIFIED (" + "; ".join(fa.identity.problems)[:300] + ")"
    identical = fa.logits_identical if fa.logits_identical is not None else "n/a"
    lines = [
        (f"arms: A {fa.arm_a.path} ({fa.arm_a.kernel or fa.arm_a.shape}), B {fa.arm_b.path} "
         f"({fa.arm_b.kernel or fa.arm_b.shape}); identity {fa.identity.method}: {ident}"),
        (f"positions {fa.n_positions} in {fa.n_prompts} prompts (only in A: {fa.n_only_a}, only in B: "
         f"{fa.n_only_b}); flips {fa.n_flips} (rate {_num(fa.flip_rate)})"),
        f"logits bitwise identical at {identical} of {fa.logits_compared} compared positions",
        (f"ROC-AUC of A's margin {_num(fa.roc_auc)} (prompt-bootstrap CI90 {_ci(fa.roc_auc_ci90)}, "
         f"B={fa.bootstrap}, seed {fa.seed}, {fa.bootstrap_skipped} one-class replicates skipped); "
         f"average precision {_num(fa.average_precision)}"),
        (f"held-out Brier {_num(fa.brier_heldout)} (CI90 {_ci(fa.brier_heldout_ci90)}) vs constant baseline "
         f"{_num(fa.brier_baseline)}; isotonic {_num(fa.brier_isotonic)}"),
    ]
    lines += [f"undefined: {s.statistic}: {s.reason}" for s in fa.statuses if s.status != Computed.OK]
    return lines


def to_markdown(fa: FlipAnalysis) -> str:
    out = ["# Flip analysis", "", *(f"- {line}" for line in summary_lines(fa)), ""]
    if fa.lopo_auc is not None:
        lo = fa.lopo_auc
        out += [(f"Leave-one-prompt-out AUC: mean {lo.mean:.4g}, min {lo.min:.4g} (prompt {lo.min_prompt}), "
                 f"max {lo.max:.4g} (prompt {lo.max_prompt}), defined for {lo.n_defined} of {lo.n_prompts} "
                 "prompts."), ""]
    out += ["## Flip rate per decile of A's margin", "", "| decile | positions | flips | flip rate | margin range |",
            "|---|---|---|---|---|"]
    for d in fa.deciles:
        span = "-" if d.margin_min is None else f"{d.margin_min:.4g} … {d.margin_max:.4g}"
        out.append(f"| {d.decile} | {d.n} | {d.n_flips} | {_num(d.flip_rate)} | {span} |")
    out += ["", (f"## Calibration (fit: {fa.calibration_prompts} even prompts, {fa.n_calibration} positions; "
                 f"held out: {fa.evaluation_prompts} odd prompts, {fa.n_evaluation} positions)"), ""]
    if fa.bins:
        out += ["| bin | margin | fit n | fit flips | p = (flips+1)/(n+2) | held-out n | held-out flip rate |",
                "|---|---|---|---|---|---|---|"]
        for b in fa.bins:
            lo = "−∞" if b.margin_low is None else f"{b.margin_low:.4g}"
            hi = "∞)" if b.margin_high is None else f"{b.margin_high:.4g}]"
            out.append(f"| {b.index} | ({lo}, {hi} | {b.n_calibration} | {b.flips_calibration} | "
                       f"{b.probability:.4g} | {b.n_evaluation} | {_num(b.flip_rate_evaluation)} |")
    else:
        out.append(f"Calibration undefined: {fa.status('calibration').reason}.")
    out += ["", "Field meanings: docs/flips.md.", ""]
    return "\n".join(out)


def _treatment(arm: ArmSteps) -> Treatment | None:
    """The kernel treatment an alibi arm's manifest records (None for other shapes or when absent)."""
    if arm.manifest_path is None:
        return None
    t = read_manifest(arm.manifest_path).predicate.get("treatment")
    if not isinstance(t, Mapping) or not isinstance(t.get("arm"), str) or not isinstance(t.get("kernel"), str):
        return None
    digest = t.get("kernel_build_digest")
    return Treatment(arm=t["arm"], kernel=t["kernel"],
                     kernel_build_digest=digest.get("sha256") if isinstance(digest, Mapping) else None,
                     epilogue_model=t.get("epilogue_model"), kernel_evidence=t.get("kernel_evidence"))


def _refuse_overlap(out: Path, arms: list[ArmSteps]) -> None:
    """The output replaces `out` wholesale, so it must not be, hold, or lie inside an input.

    The input of an alibi arm is its whole folder (its manifest covers every file there); of a
    foreign arm, its records file.
    """
    o = out.resolve()
    for arm in arms:
        root = (Path(arm.manifest_path).parent if arm.manifest_path else Path(arm.records_file)).resolve()
        if o == root or o in root.parents or (root.is_dir() and root in o.parents):
            raise InputError(f"--out {out}: overlaps the input {arm.path}; the analysis must not change its inputs, "
                             "choose an output folder outside the arm folders")


def write_analysis(fa: FlipAnalysis, out: str | os.PathLike, a: ArmSteps, b: ArmSteps) -> Path:
    """Stage flips.json, flips.md and the manifest, then rename the folder into place once."""
    treatments = {"a": _treatment(a), "b": _treatment(b)}
    predicate = build_predicate(
        inputs={"arm_a": resource(a.path, a.path), "arm_b": resource(b.path, b.path)}, seed=fa.seed,
        arms={k: t for k, t in treatments.items() if t is not None} if all(treatments.values()) else None,
        parameters={"schema": SCHEMA, "bootstrap": fa.bootstrap, "allow_unverified": fa.identity.allow_unverified,
                    "identity": {"method": fa.identity.method, "verified": fa.identity.verified},
                    "shapes": {"a": a.shape, "b": b.shape}, "kernels": {"a": a.kernel, "b": b.kernel}})
    with atomic.staged_dir(out) as stage:
        atomic.write_text(stage / FLIPS_FILE, fa.to_json())
        atomic.write_text(stage / SUMMARY_FILE, to_markdown(fa))
        write_manifest(stage, KIND, predicate)
    return Path(out)


def analyze_flips(arm_a: str | os.PathLike, arm_b: str | os.PathLike, out: str | os.PathLike, *, seed: int = 0,
                  bootstrap: int = DEFAULT_BOOTSTRAP, allow_unverified: bool = False,
                  progress: Callable[[str], None] | None = None) -> FlipAnalysis:
    """Join two arms, compute every statistic and write `out/` (module docstring); returns the analysis.

    arm_a, arm_b: arm folders or records .json files in any accepted shape; A's margin is the
    predictor. seed: the bootstrap seed (recorded); bootstrap: replicates per bootstrap (≥ 1);
    allow_unverified: proceed when the identity contract fails or cannot be checked (recorded).
    Raises IdentityViolation (exit 1) or InputError (exit 2); on either nothing is written.
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise InputError(f"--seed must be a non-negative integer, got {seed!r}")
    if not isinstance(bootstrap, int) or isinstance(bootstrap, bool) or bootstrap < 1:
        raise InputError(f"--bootstrap must be a positive number of replicates, got {bootstrap!r}")
    check_count(bootstrap, "--bootstrap", MAX_BOOTSTRAP, "replicates")
    out = Path(out)
    atomic.check_writable_dir(out)
    a, b = read_arm(arm_a), read_arm(arm_b)
    _refuse_overlap(out, [a, b])
    require_same_keying(a, b)
    identity = check_identity(a, b, allow_unverified)
    joined = join_arms(a, b)
    fa = flip_statistics(joined, _arm_source(a), _arm_source(b), identity, seed=seed, bootstrap=bootstrap,
                         progress=progress)
    write_analysis(fa, out, a, b)
    return fa


__all__ = ["DEFAULT_BOOTSTRAP", "FLIPS_FILE", "KIND", "SCHEMA", "SUMMARY_FILE", "ArmSource", "FlipAnalysis",
           "IdentityCheck", "analyze_flips", "check_identity", "flip_statistics", "read_flips", "summary_lines",
           "to_markdown", "write_analysis"]
