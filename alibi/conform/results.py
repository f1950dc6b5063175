"""The conformance results as types: one `UnitResult` per tile and regime, one `Report` per run.

`report.json` is `Report.to_json()`; every consumer (`alibi.conform.report`, `alibi.html`, `alibi.testing`,
`alibi.experiment`, `alibi.controls.mutant_matrix`, `alibi conform --resume`) reads it back through
`Report.from_json` (a unit file, through `alibi.io.typed.from_plain(UnitResult, …)`), never by string keys of
its own. The layout is published as a JSON Schema, `docs/schemas/alibi.conform.v2.schema.json` (fields and
meaning: docs/report.md); tests validate real reports against it, and a schema file, once published, never
changes: a field that changes needs a new schema version.

Reports of schema v1 (`alibi.conform/v1`, committed under analysis/results) are read too: a v1 unit lacks the
predicted-against-observed and near-zero fields (read as None) and, in reports older still, `differences`
(read as None). Such a report keeps its schema, so a reader can tell what it cannot hold, and is written
back as v1.

This module imports no torch: reading a report costs nothing at CLI start-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from alibi.conform.differences import Differences
from alibi.conform.verdict import Verdict
from alibi.errors import InputError, one_line, shown
from alibi.io.typed import TypedResult

SCHEMA = "alibi.conform/v2"
SCHEMA_FILE = "docs/schemas/alibi.conform.v2.schema.json"
V1 = "alibi.conform/v1"
# The unit fields v2 added; a v1 unit reads them as None.
ADDED_IN_V2 = ("n_predicted", "explained", "cause", "near_zero_floor", "n_near_zero", "n_differing_near_zero",
               "max_ulp_above_floor", "max_rel_diff_above_floor")


class Regime(StrEnum):
    """The scales a unit ran under: the tile's own, or its weight scales rounded to powers of two."""

    REAL = "real"
    POW2 = "pow2"


class Safety(StrEnum):
    """The headroom prediction of an int8 tile from its exact accumulator (`alibi.exact.emulator.predict`): no
    int32 wrap and every accumulator exact in fp32, or not."""

    BITWISE_SAFE = "bitwise-safe"
    ELIGIBLE_TO_DIVERGE = "eligible-to-diverge"


class ReportVerdict(StrEnum):
    """A report's verdict: no check fired and every required check applied, a check fired, or neither."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


class Equivalence(StrEnum):
    """Whether the two arms' outputs are bitwise equal on every unit of a report."""

    BITWISE = "bitwise"
    NOT_BITWISE = "not bitwise"


@dataclass(frozen=True)
class UnitResult:
    """One tile under one scale regime, both arms run and every check applied.

    Sizes: M, K, N, n_elements (= M·N). Agreement: n_differing elements differ in any bit,
    max_ulp (finite pairs; None when there is none), bitwise_equal, differences (positions and both
    values, capped). Exact emulation (int8): max_abs_acc, headroom_bits (None when infinite),
    prediction (`bitwise-safe` / `eligible-to-diverge`). Predicted against observed (int8, both
    arms declaring a model): n_predicted elements where the two declared models applied to the
    exact accumulator differ; explained: the observed differing set equals that set; cause: what
    in the models differs where they differ (`scale order`, `bias mode`, or both), when explained
    and not empty. Near zero (real scales): near_zero_floor, the magnitude below which an element's
    exact value counts as near zero (2^-p · the tile's largest exact |value|, p the output's
    significand bits); n_near_zero such elements; n_differing_near_zero of them differ;
    max_ulp_above_floor and max_rel_diff_above_floor over the others. verdicts: one per check.
    In a unit of a v1 report the fields v2 added are None, and `differences` too where it predates them.
    """

    tile: str
    regime: Regime
    fmt: str
    M: int
    K: int
    N: int
    out_dtype: str
    bias: bool
    n_elements: int
    n_differing: int
    max_ulp: int | None
    bitwise_equal: bool
    differences: Differences | None
    max_abs_acc: int | None
    headroom_bits: float | None
    prediction: Safety | None
    n_predicted: int | None
    explained: bool | None
    cause: str | None
    near_zero_floor: float | None
    n_near_zero: int | None
    n_differing_near_zero: int | None
    max_ulp_above_floor: int | None
    max_rel_diff_above_floor: float | None
    pow2_scales_changed: int
    subnormal_scales: int
    verdicts: tuple[Verdict, ...]

    def verdict(self, check: str) -> Verdict:
        for v in self.verdicts:
            if v.check == check:
                return v
        raise KeyError(check)

    @property
    def fired(self) -> list[str]:
        return [v.check for v in self.verdicts if v.fired]

    def _layout_out(self, doc: dict[str, Any]) -> dict[str, Any]:
        """As stored: the verdicts as one object keyed by check (`alibi.io.typed`)."""
        return {**doc, "verdicts": {v["check"]: v for v in doc["verdicts"]}}

    @classmethod
    def _layout_in(cls, doc: dict[str, Any], where: str) -> dict[str, Any]:
        if not isinstance(doc.get("verdicts"), dict):
            raise InputError(f"{one_line(where)}.verdicts: expected an object keyed by check, got "
                             f"{shown(doc.get('verdicts'), 60)}")
        return {**doc, "verdicts": list(doc["verdicts"].values())}


@dataclass(frozen=True)
class KernelRecord:
    """One arm as the report names it: registry name, declared epilogue model, how it ran here, and the
    evidence of its last launch that produced an output (versions, device, build digest)."""

    name: str
    epilogue_model: str | None
    available: bool
    how: str
    evidence: dict[str, Any]


@dataclass(frozen=True)
class Report(TypedResult):
    """The `report.json` document: the pair, the source, the per-check summary and every unit.

    verdict: `pass` (no check fired and every required check applied), `fail` (a check fired) or
    `inconclusive`; equivalence: `bitwise` when every unit is bitwise equal; created_at: the only
    wall-clock field (None under `alibi run`, whose manifest holds the time), kept from the first
    start when a run is resumed. environment: `alibi.governance.environment.environment_record()`,
    the record the folder's manifest carries too. replay: the flip analysis check 7 was judged on.
    """

    SCHEMA = SCHEMA
    READS = (V1,)
    JSON_INDENT = 2
    REMEDY = "re-run `alibi conform` to write a report this version reads"
    FILE = "report.json"

    schema: str = field(default=SCHEMA, kw_only=True)  # first: the document names its schema first
    created_at: str | None
    kernel_a: KernelRecord
    kernel_b: KernelRecord
    selection: str
    verdict: ReportVerdict
    equivalence: Equivalence
    inconclusive_because: tuple[str, ...]
    source: dict[str, Any]
    seed: int | None
    regimes: tuple[Regime, ...]
    checks: tuple[Verdict, ...]
    tiles: tuple[UnitResult, ...]
    environment: dict[str, Any]
    replay: dict[str, Any] | None = None

    def check(self, name: str) -> Verdict:
        for v in self.checks:
            if v.check == name:
                return v
        raise KeyError(name)

    def units(self, regime: str | None = None) -> list[UnitResult]:
        return [u for u in self.tiles if regime is None or u.regime == regime]

    @property
    def exit_code(self) -> int:
        """0 unless a check fired (see `alibi.conform.pipeline.exit_code` for `--strict`)."""
        return 1 if self.verdict == ReportVerdict.FAIL else 0

    def _layout_out(self, doc: dict[str, Any]) -> dict[str, Any]:
        """As stored: `replay` only when check 7 was judged on one; a v1 report without v2's unit fields
        (`alibi.io.typed`)."""
        if doc["replay"] is None:
            del doc["replay"]
        if doc["schema"] == V1:
            doc["tiles"] = [{k: v for k, v in unit.items()
                             if k not in ADDED_IN_V2 and not (k == "differences" and v is None)}
                            for unit in doc["tiles"]]
        return doc

    @classmethod
    def _layout_in(cls, doc: dict[str, Any], where: str) -> dict[str, Any]:
        """A v1 report's units with the fields v2 added, as None."""
        if doc.get("schema") == V1 and isinstance(doc.get("tiles"), list):
            missing = dict.fromkeys(("differences", *ADDED_IN_V2))
            doc["tiles"] = [{**missing, **unit} if isinstance(unit, dict) else unit for unit in doc["tiles"]]
        return doc


__all__ = ["ADDED_IN_V2", "SCHEMA", "SCHEMA_FILE", "V1", "Equivalence", "KernelRecord", "Regime", "Report",
           "ReportVerdict", "Safety", "UnitResult"]
