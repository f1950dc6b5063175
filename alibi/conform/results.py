"""The conformance results as types: one `UnitResult` per tile and regime, one `Report` per run.

`report.json` is `Report.to_json()`; every consumer (`alibi.conform.report`, `alibi.html`, `alibi.testing`,
`alibi.experiment`, `alibi.controls.mutant_matrix`, `alibi conform --resume`) reads it back through
`Report.from_json` / `UnitResult.from_dict`, never by string keys of its own. The layout is
published as a JSON Schema, `docs/schemas/alibi.conform.v2.schema.json` (fields and meaning:
docs/report.md); tests validate real reports against it, and a schema file, once published, never
changes: a field that changes needs a new schema version.

This module imports no torch: reading a report costs nothing at CLI start-up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

from alibi.conform.differences import Differences
from alibi.conform.verdict import Verdict

SCHEMA = "alibi.conform/v2"
SCHEMA_FILE = "docs/schemas/alibi.conform.v2.schema.json"


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
    """

    tile: str
    regime: str
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
    differences: Differences
    max_abs_acc: int | None
    headroom_bits: float | None
    prediction: str | None
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

    def as_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["differences"] = self.differences.as_dict()
        d["verdicts"] = {v.check: v.to_dict() for v in self.verdicts}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> UnitResult:
        kw = {f.name: d[f.name] for f in fields(cls)}
        kw["differences"] = Differences.from_dict(d["differences"])
        kw["verdicts"] = tuple(Verdict.from_dict(v) for v in d["verdicts"].values())
        return cls(**kw)


@dataclass(frozen=True)
class KernelRecord:
    """One arm as the report names it: registry name, declared epilogue model, how it ran here, and the
    evidence of its last launch that produced an output (versions, device, build digest)."""

    name: str
    epilogue_model: str | None
    available: bool
    how: str
    evidence: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KernelRecord:
        return cls(**{f.name: d[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class Report:
    """The `report.json` document: the pair, the source, the per-check summary and every unit.

    verdict: `pass` (no check fired and every required check applied), `fail` (a check fired) or
    `inconclusive`; equivalence: `bitwise` when every unit is bitwise equal; created_at: the only
    wall-clock field (None under `alibi run`, whose manifest holds the time), kept from the first
    start when a run is resumed. environment: `alibi.governance.environment.environment_record()`,
    the record the folder's manifest carries too. replay: the flip analysis check 7 was judged on.
    """

    created_at: str | None
    kernel_a: KernelRecord
    kernel_b: KernelRecord
    selection: str
    verdict: str
    equivalence: str
    inconclusive_because: tuple[str, ...]
    source: dict[str, Any]
    seed: int | None
    regimes: tuple[str, ...]
    checks: tuple[Verdict, ...]
    tiles: tuple[UnitResult, ...]
    environment: dict[str, Any]
    replay: dict[str, Any] | None = None
    schema: str = field(default=SCHEMA)

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
        return 1 if self.verdict == "fail" else 0

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"schema": self.schema, "created_at": self.created_at,
                             "kernel_a": self.kernel_a.as_dict(), "kernel_b": self.kernel_b.as_dict(),
                             "selection": self.selection, "verdict": self.verdict, "equivalence": self.equivalence,
                             "inconclusive_because": list(self.inconclusive_because), "source": self.source,
                             "seed": self.seed, "regimes": list(self.regimes),
                             "checks": [v.to_dict() for v in self.checks],
                             "tiles": [u.as_dict() for u in self.tiles], "environment": self.environment}
        if self.replay is not None:
            d["replay"] = self.replay
        return d

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, sort_keys=False, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        if d.get("schema") != SCHEMA:
            raise ValueError(f"report: schema {d.get('schema')!r}, expected {SCHEMA!r} (re-run `alibi conform` "
                             "to write a report this version reads)")
        return cls(created_at=d["created_at"], kernel_a=KernelRecord.from_dict(d["kernel_a"]),
                   kernel_b=KernelRecord.from_dict(d["kernel_b"]), selection=d["selection"], verdict=d["verdict"],
                   equivalence=d["equivalence"], inconclusive_because=tuple(d["inconclusive_because"]),
                   source=d["source"], seed=d["seed"], regimes=tuple(d["regimes"]),
                   checks=tuple(Verdict.from_dict(v) for v in d["checks"]),
                   tiles=tuple(UnitResult.from_dict(u) for u in d["tiles"]), environment=d["environment"],
                   replay=d.get("replay"))

    @classmethod
    def from_json(cls, text: str) -> Report:
        return cls.from_dict(json.loads(text))


__all__ = ["SCHEMA", "SCHEMA_FILE", "KernelRecord", "Report", "UnitResult"]
