"""The conform/run section: verdict, pair, evidence, checks, figures and the per-tile table.

It reads `report.json` (written by `alibi conform` and, as `report/report.json`, by `alibi run`) as the
`alibi.conform.results.Report` every consumer reads, of schema v2 or the v1 of older reports; the template
reads the report itself, grouped by tile (`TileRow`). Reading a report needs neither torch nor a kernel.

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

from alibi.conform.differences import ElementDifference
from alibi.conform.report import STATUS_WORD, explanation, regime_totals, why_sentence
from alibi.conform.results import SCHEMA, Report, UnitResult
from alibi.conform.verdict import Verdict
from alibi.html import figures
from alibi.html.render import FigureView, RenderedSection, format_count, render_fragment
from alibi.html.sections import Section

REPORT_FILES = ("report.json", "report/report.json")
# Tiles shown before the rest of the differing ones fold away under <details>.
TOP_TILES = 25
# Differing elements listed per unit in the table (report.json holds up to its cap).
ELEMENTS_SHOWN = 8


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
    by_regime: Mapping[str, UnitResult]
    fired: tuple[tuple[str, Verdict], ...]  # (regime, verdict)

    @property
    def differing(self) -> int:
        return sum(u.n_differing for u in self.by_regime.values())

    @property
    def clean(self) -> bool:
        return self.differing == 0 and not self.fired


def tile_rows(report: Report) -> list[TileRow]:
    """Tiles in report order, each with its units per regime. Headroom comes from the first unit: the exact
    accumulator does not depend on the scales, so every regime of a tile records the same value."""
    order: dict[str, list[UnitResult]] = {}
    for u in report.tiles:
        order.setdefault(u.tile, []).append(u)
    rows = []
    for i, (name, units) in enumerate(order.items()):
        first = units[0]
        rows.append(TileRow(i, name, (first.M, first.K, first.N), first.fmt, first.max_abs_acc, first.headroom_bits,
                            first.prediction, {u.regime: u for u in units},
                            tuple((u.regime, v) for u in units for v in u.verdicts if v.status == "fired")))
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


def _differing_figure(report: Report, rows: list[TileRow]) -> FigureView:
    series = {r: [t.by_regime[r].n_differing if r in t.by_regime else None for t in rows] for r in report.regimes}
    chart = figures.differing_chart([t.name for t in rows], series)
    caption = ("Output elements whose bit patterns differ between arm a and arm b (n_differing), per tile and "
               "scale regime, on a symmetric-log axis: a tile with no difference has no bar.")
    if "pow2" in report.regimes and any(t.fmt == "int8" for t in rows):
        caption += (" Under pow2 weight scales every scale order rounds alike, so two int8 kernels that differ only "
                    "in their scale order leave no pow2 bar (a bias handled differently still can).")
    return FigureView.of(f"Differing elements per tile, {' and '.join(report.regimes)} scales", caption, chart)


def near_zero(e: ElementDifference) -> bool:
    """A value is zero (either sign) or the two values have opposite signs: the distance counts through zero.
    Never for a non-finite value (stored as a string)."""
    if isinstance(e.a, str) or isinstance(e.b, str):
        return False
    a, b = float(e.a), float(e.b)
    return a == 0.0 or b == 0.0 or math.copysign(1.0, a) != math.copysign(1.0, b)


def ulp_counts(report: Report) -> list[figures.UlpCounts] | None:
    """Per regime, the listed differing elements by ulp distance, near-zero ones apart; None when the report's
    units carry no per-element `differences` (written before that field existed)."""
    with_elements = [u for u in report.tiles if u.differences is not None]
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
            for e in u.differences.elements:
                if e.ulp is None:
                    nonfinite += 1
                elif near_zero(e):
                    near[e.ulp] += 1
                else:
                    away[e.ulp] += 1
        counts.append(figures.UlpCounts(regime, dict(away), dict(near), nonfinite))
    return counts


def over_threshold(u: UnitResult) -> int | None:
    """Check 6's count of elements beyond its threshold in this unit (real regime), from its evidence."""
    for v in u.verdicts:
        if v.check == "real-scale-tolerance":
            n = v.evidence.get("n_over_threshold")
            return n if isinstance(n, int) and not isinstance(n, bool) else None
    return None


def _ulp_figure(report: Report) -> FigureView:
    title = "Ulp distance of the differing elements"
    counts = ulp_counts(report)
    if counts is not None:
        listed_by_unit = [u.differences for u in report.tiles if u.differences is not None]
        listed = sum(len(d.elements) for d in listed_by_unit)
        total = sum(d.count for d in listed_by_unit)
        truncated = [d for d in listed_by_unit if d.truncated]
        caption = ("Differing elements by ulp distance between the two arms' outputs (distance between the ordered "
                   "integer images of the bit patterns; +0 and −0 differ in bits at distance 0). Near-zero elements, "
                   "where a value is zero or the two values have opposite signs, are shown apart: their distance "
                   "counts the steps through zero and reflects cancellation in the sum, not the kernels. ")
        if truncated:
            cap = max(d.cap for d in truncated)
            caption += (f"Shown: the {format_count(listed)} elements report.json lists, of {format_count(total)} "
                        f"differing; {len(truncated)} unit(s) list only their first {cap} (row-major), so this is a "
                        "sample of those units, not their full distribution.")
        else:
            caption += f"Shown: all {format_count(total)} differing elements (every unit lists all of its own)."
        return FigureView.of(title, caption, figures.ulp_histogram_chart(counts))
    hist = {r: dict(Counter(u.max_ulp for u in report.tiles if u.regime == r and not u.bitwise_equal
                            and u.max_ulp is not None)) for r in report.regimes}
    over = sum(over_threshold(u) or 0 for u in report.tiles)
    threshold = next((c.threshold for c in report.checks if c.check == "real-scale-tolerance"), None)
    caption = ("This report.json records no per-element distances (it was written before units carried "
               "differences), so no histogram of elements can be drawn, and near-zero elements cannot be told "
               "apart. Shown instead: the units that differ, by their largest ulp distance (max_ulp). ")
    caption += (f"Check 6 counted {format_count(over)} real-scale element(s) beyond its threshold of "
                f"{threshold:g} ulp." if threshold is not None else "")
    return FigureView.of(title + " (largest per unit)", caption.strip(), figures.max_ulp_chart(hist))


def _fired_names(t: TileRow) -> list[str]:
    return list(dict.fromkeys(v.check for _, v in t.fired))


def unit_counts(summary: Verdict) -> tuple[int | None, int | None, int | None]:
    """A summary verdict's units, applicable units and fired units (`alibi.conform.verdict.combine`'s evidence);
    None for a count the evidence does not hold."""
    def count(key: str) -> int | None:
        n = summary.evidence.get(key)
        return n if isinstance(n, int) and not isinstance(n, bool) else None

    return count("units"), count("applicable"), count("fired")


def why(report: Report) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """Why the arms differ, as report.md and the terminal say it: the sentence drawn from the checks and, per
    regime with a prediction, predicted against observed with the causes named; None for a v1 report (written
    before predicted and explained existed)."""
    if report.schema != SCHEMA:
        return None
    lines = tuple((r, ex.line()) for r in report.regimes if (ex := explanation(report, r)) is not None)
    return why_sentence(report), lines


def render_report(report: Report) -> RenderedSection:
    rows = tile_rows(report)
    ordered = sorted_rows(rows)
    differing = [t for t in ordered if not t.clean]
    clean = [t for t in ordered if t.clean]
    a, b = report.kernel_a, report.kernel_b
    body = render_fragment(
        "conform.html.j2", report=report, a=a, b=b, totals=regime_totals(report), checks=report.checks,
        fired_checks=[c.check for c in report.checks if c.status == "fired"], why=why(report),
        status_word=STATUS_WORD, unit_counts=unit_counts,
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
    return render_report(Report.from_json(text, where))


SECTION = Section(key="conform", files=REPORT_FILES, kinds=("report", "experiment-run"),  # conform, run
                  render=render_text)

__all__ = ["REPORT_FILES", "SECTION", "TileRow", "near_zero", "over_threshold", "render_report",
           "render_text", "sorted_rows", "tile_rows", "ulp_counts", "unit_counts", "why"]
