"""The conform/run section: verdict, pair, evidence, checks, figures and the per-tile table.

It reads `report.json` (schema `alibi.conform/v1`, written by `alibi conform` and, as
`report/report.json`, by `alibi run`) into `ConformReport`, a typed view of the fields the page
shows; the template reads only that view. The view reads `report.json` itself rather than through
the conformance package so that re-rendering a folder needs neither torch nor a kernel.

What the figures can show depends on what the report holds, and the captions say which: headroom
and differing counts are in every unit; an ulp-distance histogram needs per-element distances,
which units carry in `differences` (positions, both values and the ulp distance of each differing
element, capped per unit). Reports written before that field existed hold only each unit's largest
distance, so for them the page draws differing units by largest distance and says so.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from alibi.conform.report import RegimeTotals, explanation, why_sentence
from alibi.conform.results import Report
from alibi.errors import InputError
from alibi.html import figures
from alibi.html.render import FigureView, RenderedSection, format_count, render_fragment
from alibi.html.sections import Section

# v2 (alibi.conform.results) adds predicted/observed and near-zero fields; the page reads the fields both share,
# so the committed v1 reports still render.
SCHEMAS = ("alibi.conform/v1", "alibi.conform/v2")
REPORT_FILES = ("report.json", "report/report.json")
DIFFERENCES_SCHEMA = "alibi.differences/v1"
# Tiles shown before the rest of the differing ones fold away under <details>.
TOP_TILES = 25
# Differing elements listed per unit in the table (report.json holds up to its cap).
ELEMENTS_SHOWN = 8
STATUS_WORD = {"passed": "passed", "fired": "FIRED", "inapplicable": "inapplicable"}


class _Reader:
    """Typed access to one JSON object; every failure names the file and the field path."""

    def __init__(self, doc: Any, where: str, path: str = "") -> None:
        if not isinstance(doc, dict):
            raise InputError(f"{where}: field {path or '(top level)'} is not an object; is this an alibi conform "
                             "report.json?")
        self.doc, self.where, self.path = doc, where, path

    def _bad(self, key: str, expected: str) -> InputError:
        value = repr(self.doc.get(key, "<missing>"))
        value = value if len(value) <= 40 else value[:37] + "..."
        return InputError(f"{self.where}: field {self.path}{key} is {value}, expected {expected}; "
                          "re-run the command that wrote it")

    def get(self, key: str, kind: type | tuple[type, ...], *, optional: bool = False, default: Any = None) -> Any:
        if key not in self.doc:
            if optional:
                return default
            raise self._bad(key, getattr(kind, "__name__", str(kind)))
        value = self.doc[key]
        if value is None and optional:
            return default
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds:  # JSON true is not a count
            raise self._bad(key, " or ".join(k.__name__ for k in kinds))
        if not isinstance(value, kinds):
            raise self._bad(key, " or ".join(k.__name__ for k in kinds))
        return value

    def child(self, key: str) -> _Reader:
        return _Reader(self.get(key, dict), self.where, f"{self.path}{key}.")

    def children(self, key: str) -> list[_Reader]:
        return [_Reader(d, self.where, f"{self.path}{key}[{i}].") for i, d in enumerate(self.get(key, list))]


@dataclass(frozen=True)
class Arm:
    """One kernel arm: its name, declared epilogue, whether and how it ran, and its evidence record."""

    label: str
    name: str
    epilogue_model: str | None
    available: bool
    how: str
    evidence: Mapping[str, Any]

    @classmethod
    def read(cls, r: _Reader, label: str) -> Arm:
        return cls(label, r.get("name", str), r.get("epilogue_model", str, optional=True),
                   r.get("available", bool), r.get("how", str), r.get("evidence", dict, optional=True, default={}))


@dataclass(frozen=True)
class CheckSummary:
    """One check over all units: status, threshold, the sentence, and unit counts."""

    check: str
    status: str
    threshold: float | None
    detail: str
    units: int | None
    applicable: int | None
    fired: int | None

    @property
    def word(self) -> str:
        return STATUS_WORD[self.status]

    @classmethod
    def read(cls, r: _Reader) -> CheckSummary:
        status = r.get("status", str)
        if status not in STATUS_WORD:
            raise r._bad("status", "passed, fired or inapplicable")
        ev = r.child("evidence") if isinstance(r.doc.get("evidence"), dict) else None
        count = (lambda k: ev.get(k, int, optional=True)) if ev else (lambda k: None)
        return cls(r.get("check", str), status, r.get("threshold", (int, float), optional=True), r.get("detail", str),
                   count("units"), count("applicable"), count("fired"))


@dataclass(frozen=True)
class UnitVerdict:
    check: str
    status: str
    detail: str


@dataclass(frozen=True)
class ElementDiff:
    """One differing output element: position, both bit patterns and values (float, or inf/nan text), ulp."""

    row: int
    column: int
    a_bits: str
    b_bits: str
    a: float | str
    b: float | str
    ulp: int | None

    @property
    def finite(self) -> bool:
        return isinstance(self.a, (int, float)) and isinstance(self.b, (int, float))

    @property
    def near_zero(self) -> bool:
        """A value is zero (either sign) or the two values have opposite signs: the distance counts through zero."""
        if not self.finite:
            return False
        a, b = float(self.a), float(self.b)
        return a == 0.0 or b == 0.0 or math.copysign(1.0, a) != math.copysign(1.0, b)


@dataclass(frozen=True)
class Unit:
    """One tile under one scale regime, as report.json records it."""

    tile: str
    regime: str
    fmt: str
    M: int
    K: int
    N: int
    n_elements: int
    n_differing: int
    max_ulp: int | None
    bitwise_equal: bool
    max_abs_acc: int | None
    headroom_bits: float | None
    prediction: str | None
    verdicts: tuple[UnitVerdict, ...]
    over_threshold: int | None  # check 6's count of elements beyond its threshold (real regime)
    differences_count: int | None  # None: this report predates per-element `differences`
    differences_cap: int | None
    differences: tuple[ElementDiff, ...]
    n_predicted: int | None = None  # predicted against observed (v2 reports; None: no prediction could be made)
    explained: bool | None = None
    cause: str | None = None

    @property
    def fired(self) -> list[UnitVerdict]:
        return [v for v in self.verdicts if v.status == "fired"]

    @classmethod
    def read(cls, r: _Reader) -> Unit:
        verdicts, over = [], None
        for check, raw in r.get("verdicts", dict).items():
            v = _Reader(raw, r.where, f"{r.path}verdicts.{check}.")
            status = v.get("status", str)
            if status not in STATUS_WORD:
                raise v._bad("status", "passed, fired or inapplicable")
            verdicts.append(UnitVerdict(check, status, v.get("detail", str)))
            if check == "real-scale-tolerance" and isinstance(raw.get("evidence"), dict):
                over = v.child("evidence").get("n_over_threshold", int, optional=True)
        count = cap = None
        elements: list[ElementDiff] = []
        if "differences" in r.doc:
            d = r.child("differences")
            if d.get("schema", str) != DIFFERENCES_SCHEMA:
                raise d._bad("schema", repr(DIFFERENCES_SCHEMA))
            count, cap = d.get("count", int), d.get("cap", int)
            for e in d.children("elements"):
                elements.append(ElementDiff(e.get("row", int), e.get("column", int), e.get("a_bits", str),
                                            e.get("b_bits", str), e.get("a", (int, float, str)),
                                            e.get("b", (int, float, str)), e.get("ulp", int, optional=True)))
        return cls(r.get("tile", str), r.get("regime", str), r.get("fmt", str, optional=True, default="int8"),
                   r.get("M", int), r.get("K", int), r.get("N", int), r.get("n_elements", int),
                   r.get("n_differing", int), r.get("max_ulp", int, optional=True), r.get("bitwise_equal", bool),
                   r.get("max_abs_acc", int, optional=True), r.get("headroom_bits", (int, float), optional=True),
                   r.get("prediction", str, optional=True), tuple(verdicts), over, count, cap, tuple(elements),
                   r.get("n_predicted", int, optional=True), r.get("explained", bool, optional=True),
                   r.get("cause", str, optional=True))


@dataclass(frozen=True)
class Why:
    """Why the arms differ, as report.md and the terminal say it: the sentence drawn from the checks
    (`alibi.conform.report.why_sentence`) and, per regime, predicted against observed with the causes named."""

    sentence: str
    regimes: tuple[tuple[str, str], ...]  # (regime, `Explanation.line()`), regimes with a prediction only

    @classmethod
    def of(cls, doc: dict[str, Any], where: str) -> Why:
        try:
            report = Report.from_dict(doc)
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{where}: not a conform report this version reads ({str(exc)[:200]}); re-run the "
                             "command that wrote it") from None
        lines = tuple((r, ex.line()) for r in report.regimes if (ex := explanation(report, r)) is not None)
        return cls(why_sentence(report), lines)


@dataclass(frozen=True)
class ConformReport:
    """The page's view of one conform report (see the module docstring)."""

    schema: str
    created_at: str | None
    arms: tuple[Arm, Arm]
    selection: str
    verdict: str
    equivalence: str
    inconclusive_because: tuple[str, ...]
    source: Mapping[str, Any]
    seed: int | None
    regimes: tuple[str, ...]
    checks: tuple[CheckSummary, ...]
    units: tuple[Unit, ...]
    environment: Mapping[str, Any]
    why: Why | None = None  # None for v1 reports, written before predicted/explained existed

    @classmethod
    def from_json(cls, text: str, where: str = "report.json") -> ConformReport:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: not valid JSON ({exc}); re-run the command that wrote it") from None
        r = _Reader(doc, where)
        schema = doc.get("schema")
        if schema not in SCHEMAS:
            raise InputError(f"{where}: schema {schema!r} is not one of {', '.join(SCHEMAS)}, the conform reports "
                             "this toolkit renders; render it with the alibi version that wrote it")
        verdict = r.get("verdict", str)
        if verdict not in ("pass", "fail", "inconclusive"):
            raise r._bad("verdict", "pass, fail or inconclusive")
        return cls(schema, r.get("created_at", str, optional=True),
                   (Arm.read(r.child("kernel_a"), "a"), Arm.read(r.child("kernel_b"), "b")),
                   r.get("selection", str), verdict, r.get("equivalence", str),
                   tuple(r.get("inconclusive_because", list, optional=True, default=[])),
                   r.get("source", dict), r.get("seed", int, optional=True), tuple(r.get("regimes", list)),
                   tuple(CheckSummary.read(c) for c in r.children("checks")),
                   tuple(Unit.read(u) for u in r.children("tiles")), r.get("environment", dict),
                   Why.of(doc, where) if schema == "alibi.conform/v2" else None)

    def totals(self) -> list[RegimeTotals]:
        out = []
        for regime in self.regimes:
            units = [u for u in self.units if u.regime == regime]
            ulps = [u.max_ulp for u in units if u.max_ulp is not None]
            out.append(RegimeTotals(regime, len(units), sum(u.bitwise_equal for u in units),
                                    sum(u.n_elements for u in units), sum(u.n_differing for u in units),
                                    max(ulps) if ulps else None))
        return out


@dataclass(frozen=True)
class TileRow:
    """One tile across its regimes: the table's row."""

    index: int
    name: str
    shape: tuple[int, int, int]
    fmt: str
    max_abs_acc: int | None
    headroom_bits: float | None
    prediction: str | None
    by_regime: Mapping[str, Unit]
    fired: tuple[tuple[str, UnitVerdict], ...]  # (regime, verdict)

    @property
    def differing(self) -> int:
        return sum(u.n_differing for u in self.by_regime.values())

    @property
    def clean(self) -> bool:
        return self.differing == 0 and not self.fired


def tile_rows(report: ConformReport) -> list[TileRow]:
    """Tiles in report order, each with its units per regime. Headroom comes from the first unit: the exact
    accumulator does not depend on the scales, so every regime of a tile records the same value."""
    order: dict[str, list[Unit]] = {}
    for u in report.units:
        order.setdefault(u.tile, []).append(u)
    rows = []
    for i, (name, units) in enumerate(order.items()):
        first = units[0]
        rows.append(TileRow(i, name, (first.M, first.K, first.N), first.fmt, first.max_abs_acc, first.headroom_bits,
                            first.prediction, {u.regime: u for u in units},
                            tuple((u.regime, v) for u in units for v in u.fired)))
    return rows


def sorted_rows(rows: list[TileRow]) -> list[TileRow]:
    """Most differing elements first, then most fired verdicts, then report order."""
    return sorted(rows, key=lambda t: (-t.differing, -len(t.fired), t.index))


def _headroom_figure(rows: list[TileRow]) -> FigureView:
    title = "Headroom to 2²⁴ per tile"
    int8 = [t for t in rows if t.fmt == "int8"]
    if not int8:
        return FigureView.absent(title, "No int8 tile in this report: fp8 accumulators are fp32 sums, so there is "
                                        "no integer headroom to show.")
    chart = figures.headroom_chart([t.name for t in int8], [t.headroom_bits for t in int8])
    lo = min((t for t in int8 if t.headroom_bits is not None), key=lambda t: t.headroom_bits, default=None)
    caption = ("Bits of headroom of each tile's exact accumulator below 2²⁴, log2(2²⁴ / max|acc|) (headroom_bits; "
               "the accumulator does not depend on the scales, so one value per tile). Below zero (red) some "
               "accumulator exceeds 2²⁴ and may round on entering fp32: check 3 fires.")
    if lo is not None:
        caption += f" Smallest: {lo.headroom_bits:.2f} bits ({lo.name}, max|acc| = {format_count(lo.max_abs_acc)})."
    if len(int8) < len(rows):
        caption += f" {len(rows) - len(int8)} fp8 tile(s) have no integer accumulator and are left out."
    return FigureView.of(title, caption, chart)


def _differing_figure(report: ConformReport, rows: list[TileRow]) -> FigureView:
    series = {r: [t.by_regime[r].n_differing if r in t.by_regime else None for t in rows] for r in report.regimes}
    chart = figures.differing_chart([t.name for t in rows], series)
    caption = ("Output elements whose bit patterns differ between arm a and arm b (n_differing), per tile and "
               "scale regime, on a symmetric-log axis: a tile with no difference has no bar.")
    if "pow2" in report.regimes and any(t.fmt == "int8" for t in rows):
        caption += (" Under pow2 weight scales every scale order rounds alike, so two int8 kernels that differ only "
                    "in their scale order leave no pow2 bar (a bias handled differently still can).")
    return FigureView.of(f"Differing elements per tile, {' and '.join(report.regimes)} scales", caption, chart)


def ulp_counts(report: ConformReport) -> list[figures.UlpCounts] | None:
    """Per regime, the listed differing elements by ulp distance, near-zero ones apart; None when the report's
    units carry no per-element `differences` (written before that field existed)."""
    with_elements = [u for u in report.units if u.differences_count is not None]
    if not with_elements:
        return None
    counts = []
    for regime in report.regimes:
        away: Counter[int] = Counter()
        near: Counter[int] = Counter()
        nonfinite = 0
        for u in with_elements:
            if u.regime != regime:
                continue
            for e in u.differences:
                if e.ulp is None:
                    nonfinite += 1
                elif e.near_zero:
                    near[e.ulp] += 1
                else:
                    away[e.ulp] += 1
        counts.append(figures.UlpCounts(regime, dict(away), dict(near), nonfinite))
    return counts


def _ulp_figure(report: ConformReport) -> FigureView:
    title = "Ulp distance of the differing elements"
    counts = ulp_counts(report)
    if counts is not None:
        with_elements = [u for u in report.units if u.differences_count is not None]
        listed = sum(len(u.differences) for u in with_elements)
        total = sum(u.differences_count or 0 for u in with_elements)
        truncated = [u for u in with_elements if (u.differences_count or 0) > len(u.differences)]
        caption = ("Differing elements by ulp distance between the two arms' outputs (distance between the ordered "
                   "integer images of the bit patterns; +0 and −0 differ in bits at distance 0). Near-zero elements, "
                   "where a value is zero or the two values have opposite signs, are shown apart: their distance "
                   "counts the steps through zero and reflects cancellation in the sum, not the kernels. ")
        if truncated:
            cap = max(u.differences_cap or 0 for u in truncated)
            caption += (f"Shown: the {format_count(listed)} elements report.json lists, of {format_count(total)} "
                        f"differing; {len(truncated)} unit(s) list only their first {cap} (row-major), so this is a "
                        "sample of those units, not their full distribution.")
        else:
            caption += f"Shown: all {format_count(total)} differing elements (every unit lists all of its own)."
        return FigureView.of(title, caption, figures.ulp_histogram_chart(counts))
    hist = {r: dict(Counter(u.max_ulp for u in report.units if u.regime == r and not u.bitwise_equal
                            and u.max_ulp is not None)) for r in report.regimes}
    over = sum(u.over_threshold or 0 for u in report.units)
    threshold = next((c.threshold for c in report.checks if c.check == "real-scale-tolerance"), None)
    caption = ("This report.json records no per-element distances (it was written before units carried "
               "differences), so no histogram of elements can be drawn, and near-zero elements cannot be told "
               "apart. Shown instead: the units that differ, by their largest ulp distance (max_ulp). ")
    caption += (f"Check 6 counted {format_count(over)} real-scale element(s) beyond its threshold of "
                f"{threshold:g} ulp." if threshold is not None else "")
    return FigureView.of(title + " (largest per unit)", caption.strip(), figures.max_ulp_chart(hist))


def _fired_names(t: TileRow) -> list[str]:
    return list(dict.fromkeys(v.check for _, v in t.fired))


def render_report(report: ConformReport) -> RenderedSection:
    rows = tile_rows(report)
    ordered = sorted_rows(rows)
    differing = [t for t in ordered if not t.clean]
    clean = [t for t in ordered if t.clean]
    a, b = report.arms
    body = render_fragment(
        "conform.html.j2", report=report, a=a, b=b, totals=report.totals(), checks=report.checks,
        fired_checks=[c.check for c in report.checks if c.status == "fired"],
        figures=[_headroom_figure(rows), _differing_figure(report, rows), _ulp_figure(report)],
        top=differing[:TOP_TILES], more=differing[TOP_TILES:], clean=clean, n_tiles=len(rows),
        elements_shown=ELEMENTS_SHOWN, fired_names=_fired_names, evidence_text=evidence_text,
        source_items=_plain_items(report.source), environment_items=_plain_items(report.environment))
    return RenderedSection("conform", f"Conformance: {a.name} vs {b.name}", body)


def evidence_text(evidence: Mapping[str, Any]) -> str:
    """A kernel's evidence record as indented JSON (the page escapes it)."""
    return json.dumps(evidence, indent=2, sort_keys=True, ensure_ascii=False)


def _plain_items(d: Mapping[str, Any]) -> list[tuple[str, str]]:
    def text(v: Any) -> str:
        if isinstance(v, (dict, list)):
            return json.dumps(v, sort_keys=True, ensure_ascii=False)
        return "n/a" if v is None else str(v)

    return [(str(k), text(v)) for k, v in d.items()]


def render_text(text: str, where: str) -> RenderedSection:
    return render_report(ConformReport.from_json(text, where))


SECTION = Section(key="conform", files=REPORT_FILES, render=render_text)

__all__ = ["REPORT_FILES", "SCHEMAS", "SECTION", "ConformReport", "Why", "TileRow", "render_report", "render_text",
           "sorted_rows", "tile_rows"]
