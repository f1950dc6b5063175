"""Conformance reports: `report.json` (the document), `report.md` (for people), `junit.xml` (for CI).

All three are rendered in memory first and written atomically, `report.json` last: a folder with
a `report.json` holds a complete report, and a failed run leaves no new report behind.

`report.md` answers the question in its first lines: the verdict, per scale regime how many tiles
are bitwise equal and how many elements differ, and why they differ in one sentence drawn from
the checks (see `why_sentence`). The tile table lists the differing tiles first, each marked, with
its first differing element; `report.json` holds every unit with the positions and both values of
its differing elements (`alibi.conform.differences`, capped per unit). The fields are documented in
docs/report.md.

Everything here reads the typed report (`alibi.conform.results.Report`). This module imports no torch, so
the CLI can import it at start-up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from alibi.conform.results import KernelRecord, Report, UnitResult
from alibi.conform.verdict import CHECKS, Status
from alibi.errors import one_line
from alibi.io import atomic, jsonio

STATUS_WORD = {Status.PASSED: "passed", Status.FIRED: "FIRED", Status.INAPPLICABLE: "inapplicable"}
# How many differing elements `report.md` shows per tile (report.json lists up to the cap of
# `alibi.conform.differences`): one cell of the tile table.
MD_POSITIONS = 1


@dataclass(frozen=True)
class RegimeTotals:
    """One scale regime summed over its units: tiles, bitwise-equal tiles, elements, differing elements, max ulp."""

    regime: str
    tiles: int
    equal_tiles: int
    elements: int
    differing: int
    max_ulp: int | None

    def line(self, width: int = 0) -> str:
        ulp = "n/a" if self.max_ulp is None else self.max_ulp
        return (f"{self.regime:>{width}} scales: {self.equal_tiles}/{self.tiles} tiles bitwise equal, "
                f"{self.differing:,} of {self.elements:,} elements differ, max ulp {ulp}")


def regime_totals(report: Report) -> list[RegimeTotals]:
    """Per regime, in the report's order, the totals over its units."""
    out = []
    for regime in report.regimes:
        units = report.units(regime)
        ulps = [u.max_ulp for u in units if u.max_ulp is not None]
        out.append(RegimeTotals(regime, len(units), sum(u.bitwise_equal for u in units),
                                sum(u.n_elements for u in units), sum(u.n_differing for u in units),
                                max(ulps) if ulps else None))
    return out


@dataclass(frozen=True)
class Explanation:
    """Predicted against observed over a report: units whose differences the declared models predict
    exactly (`explained`), of the units where a prediction could be made, and the causes named."""

    units: int
    explained: int
    predicted_elements: int
    causes: tuple[str, ...]

    def line(self) -> str:
        causes = f" (cause: {', '.join(self.causes)})" if self.causes else ""
        return (f"predicted by the declared models: {self.explained}/{self.units} units exactly, "
                f"{self.predicted_elements:,} predicted differing elements{causes}")


def explanation(report: Report, regime: str | None = None) -> Explanation | None:
    """Predicted against observed over the report's units (those of `regime` only, when given); None when no unit
    could be predicted (fp8, or an arm that declares no model)."""
    judged = [u for u in report.units(regime) if u.explained is not None]
    if not judged:
        return None
    causes = tuple(dict.fromkeys(u.cause for u in judged if u.cause))
    return Explanation(len(judged), sum(bool(u.explained) for u in judged), sum(u.n_predicted or 0 for u in judged),
                       causes)


def units_from_disk_line(report: Report) -> str | None:
    """How many units a resumed run read from an earlier run's units folder (None when it computed all)."""
    n = report.source.get("units_from_disk")
    if not n:
        return None
    how = ("recomputed here and bit-identical (--verify-units)" if report.source.get("units_verified") else
           "checked against the plan, the run's ledger, the unit schema and its invariants, not recomputed "
           "(--verify-units recomputes them)")
    return f"units from disk: {n:,} of {report.source.get('units', len(report.tiles)):,} read from an earlier run, {how}"


def exercised_line(report: Report) -> str | None:
    """What of the two declarations the source exercised (`alibi.conform.exercised`), for a source that claims
    every attribute (the default); None for other sources."""
    accounting = report.source.get("exercised")
    if not isinstance(accounting, dict):
        return None
    arms = accounting.get("arms", {})
    gaps = sum(len(by_ctx) for rec in arms.values() for by_ctx in rec.get("not_shown", {}).values())
    gaps += sum(1 for rec in arms.values() if rec.get("declares")
                for ctx in accounting.get("required_contexts", []) if ctx not in rec.get("contexts", []))
    where = " and ".join(sorted({c.split()[0] for c in accounting.get("required_contexts", [])})) + \
        " outputs, decode and prefill M"
    narrow = [f"`{rec.get('kernel')}`" for rec in arms.values() if rec.get("bias") == "output dtype only"]
    bias = (f"; bias in the output dtype only ({' and '.join(narrow)} declares no float32 bias: the float32-bias "
            "probes were left out)" if narrow else "")
    if gaps:
        return (f"exercised: {gaps} attribute(s) of the declarations not exercised ({where} required; see "
                f"inconclusive){bias}")
    return f"exercised: scale order, intermediate rounding and bias mode of both declarations, in {where}{bias}"


def equivalence_words(report: Report) -> str:
    """The report's `equivalence` as words next to the verdict: what the outputs are, not a second verdict
    (`FAIL (bitwise)` read as a contradiction)."""
    return "outputs bitwise equal" if report.equivalence == "bitwise" else "outputs not bitwise equal"


def summary_lines(report: Report) -> list[str]:
    """The human-readable summary printed at the end of `alibi conform`."""
    a, b = report.kernel_a, report.kernel_b
    lines = [f"alibi conform: {a.name} ({declared(a)}) vs {b.name} ({declared(b)})",
             f"  why this pair: {report.selection}",
             f"  arm a runs as: {a.how}", f"  arm b runs as: {b.how}",
             f"  source: {report.source.get('label', report.source)}; regimes: {', '.join(report.regimes)}"]
    if (line := units_from_disk_line(report)) is not None:
        lines.append(f"  {line}")
    for c in report.checks:
        lines.append(f"  {STATUS_WORD[c.status]:>12}  {c.check:<22} {c.detail}")
    for totals in regime_totals(report):
        lines.append(f"  {totals.line(width=5)}")
    if (ex := explanation(report)) is not None:
        lines.append(f"  {ex.line()}")
    if (line := exercised_line(report)) is not None:
        lines.append(f"  {line}")
    lines.append(f"  verdict: {report.verdict.upper()} ({equivalence_words(report)})")
    for why in report.inconclusive_because:
        lines.append(f"    inconclusive: {why}")
    return lines


def declared(kernel: KernelRecord) -> str:
    """An arm's declared epilogue model as the reports print it (never Python's `None`)."""
    return kernel.epilogue_model or "declares no epilogue model"


def undeclared_arms(report: Report) -> list[str]:
    """`arm a (`name`)` for each arm that declares no epilogue model."""
    return [f"arm {arm} (`{k.name}`)" for arm, k in (("a", report.kernel_a), ("b", report.kernel_b))
            if k.epilogue_model is None]


def why_sentence(report: Report) -> str:
    """Why the arms differ (or not), in one or two sentences that follow from the checks.

    The argument: if each arm equals its declared epilogue model bit for bit, then any
    difference between the arms is a difference between the two declared models — the scale
    order or the bias handling — and nothing else (predicted-differences names which, per unit);
    if an arm does not equal its model, the differences are unexplained; without declared models
    they cannot be attributed.
    """
    totals = {t.regime: t for t in regime_totals(report)}
    a, b = report.kernel_a, report.kernel_b
    differing = sum(t.differing for t in totals.values())
    fp8 = any(u.fmt != "int8" for u in report.tiles)
    model = report.check("epilogue-model")
    undeclared = undeclared_arms(report)
    if undeclared and model.status != "fired":
        who = " and ".join(undeclared)
        agree = "The arms agree in every bit, but " if differing == 0 else "The differences cannot be attributed: "
        return (f"{agree}{who} declare{'s' if len(undeclared) == 1 else ''} no epilogue model, so no claim is made "
                "about which epilogue it computes; run `alibi identify` to find which model to declare.")
    if model.status == "fired":
        return (f"At least one arm does not equal its declared epilogue model ({model.detail}), so the "
                "differences are not explained by the declared epilogues: that is a finding, not an expected "
                "rounding difference.")
    if model.status == "inapplicable":
        if differing == 0:
            return "The arms agree in every bit; no declared epilogue model could be checked."
        return f"The differences cannot be attributed to the epilogues: the epilogue-model check was {model.detail}."
    held = (f"Each arm equals its declared epilogue model bit for bit (`{a.epilogue_model}` and "
            f"`{b.epilogue_model}`" + (", each applied to its own fp32 accumulator" if fp8 else "") + ")")
    if differing == 0:
        return held + ", and the arms agree in every bit on every tile under every regime."
    ex = explanation(report)
    causes = []
    if fp8:
        causes.append("their fp32 accumulators (fp8 sums round in an implementation-defined order)")
    named = set(ex.causes) if ex else set()
    if any("scale order" in c for c in named):
        causes.append("the order in which they apply the activation and weight scales")
    if any("bias mode" in c for c in named):
        causes.append("how they add the bias")
    because = " and ".join(causes) if causes else "the two declared models"
    out = f"{held}, so every difference comes from {because}"
    if ex is not None:
        out += f": {ex.explained} of {ex.units} units differ exactly where the declared models predict"
    out += "."
    pow2 = totals.get("pow2")
    if pow2 is not None and not fp8:
        if pow2.differing == 0:
            out += " Under power-of-two weight scales the two orders round to the same bits, and no element differs."
        else:
            out += (f" Under power-of-two weight scales {pow2.differing:,} elements still differ: a scale order "
                    "cannot cause that; the declared models attribute it to the bias handling.")
    return out


def _md(value: Any) -> str:
    """A value as Markdown text: JSON spellings (`true`, `false`, `null` → n/a), thousands separators."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "n/a"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dict):  # e.g. the environment's torch flags: JSON, so booleans read `true`
        return json.dumps(value, sort_keys=False)
    return str(value)


def _first_positions(u: UnitResult) -> str:
    d = u.differences
    if d is None or not d.elements:  # None: a v1 report written before units listed their differences
        return ""
    shown = [f"({e.row}, {e.column}): {e.a_bits} → {e.b_bits} ({e.a} → {e.b})" for e in d.elements[:MD_POSITIONS]]
    more = d.count - len(shown)
    return "; ".join(shown) + (f"; +{more:,} more" if more > 0 else "")


def ordered_units(report: Report) -> list[UnitResult]:
    """The units with every differing one first; each group keeps the report's (execution) order."""
    units = report.tiles
    return [u for u in units if not u.bitwise_equal] + [u for u in units if u.bitwise_equal]


def to_markdown(report: Report) -> str:
    a, b = report.kernel_a, report.kernel_b
    seed_text = f"seed {report.seed}" if report.seed is not None else "no seed (the tiles were given, not drawn)"
    out = [f"# Conformance report: `{a.name}` vs `{b.name}`", "",
           f"**Verdict: {report.verdict}** ({equivalence_words(report)})."
           + (f" Created {report.created_at}." if report.created_at else ""), ""]
    out += [f"- {t.line()}" for t in regime_totals(report)]
    if (ex := explanation(report)) is not None:
        out.append(f"- {ex.line()}")
    out += ["", f"**Why:** {why_sentence(report)}", ""]
    for why in report.inconclusive_because:
        out.append(f"- inconclusive: {why}")
    out += [f"- arm {arm}: `{k.name}`, " + (f"declared epilogue `{k.epilogue_model}`" if k.epilogue_model else
                                            "declares no epilogue model (run `alibi identify`)") + f", runs as: {k.how}"
            for arm, k in (("a", a), ("b", b))]
    out += [f"- pair chosen: {report.selection}",
            f"- source: {report.source.get('label')}; {seed_text}; regimes {', '.join(report.regimes)}",
            *([f"- {line}"] if (line := units_from_disk_line(report)) is not None else []),
            "", "## Checks", "", "| check | status | threshold | detail |", "|---|---|---|---|"]
    for c in report.checks:
        thr = "" if c.threshold is None else c.threshold
        out.append(f"| {c.check} | {STATUS_WORD[c.status]} | {thr} | {c.detail} |")
    n_diff = sum(not u.bitwise_equal for u in report.tiles)
    out += ["", "## Tiles", "",
            f"{n_diff} of {len(report.tiles)} units differ; they come first, marked **≠**. Positions are "
            "(row, column) of the `[M, N]` output, values as bit patterns and numbers (arm a → arm b); "
            "report.json lists each unit's differing elements (`differences`, up to its `cap`). *Predicted* is "
            "the number of elements where the two declared models differ, *explained* whether the arms differ "
            "exactly there.", "",
            "| | tile | regime | M | K | N | differing | predicted | explained | cause | max ulp | bitwise equal "
            "| max abs acc | headroom bits | fired | first difference |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for u in ordered_units(report):
        fired = ", ".join(u.fired) or "-"
        head = "" if u.headroom_bits is None else f"{u.headroom_bits:.2f}"
        mark = "=" if u.bitwise_equal else "**≠**"
        out.append(f"| {mark} | {_cell(u.tile)} | {u.regime} | {u.M} | {u.K} | {u.N} | "
                   f"{_md(u.n_differing)} / {_md(u.n_elements)} | {_md(u.n_predicted)} | {_md(u.explained)} | "
                   f"{_md(u.cause) if u.cause else '-'} | {_md(u.max_ulp)} | "
                   f"{_md(u.bitwise_equal)} | {_md(u.max_abs_acc)} | {head} | {fired} | {_first_positions(u)} |")
    out += ["", "## Environment", "", *(f"- {k}: {_md(v)}" for k, v in report.environment.items()), ""]
    return "\n".join(out)


def _cell(text: str) -> str:
    """A Markdown table cell from an untrusted name: control characters escaped (a newline in a tile
    name would otherwise end the row and inject a heading), pipes and backticks escaped."""
    return one_line(str(text)).replace("|", "\\|").replace("`", "\\`")


def to_junit(report: Report) -> str:
    """One test suite per check, one test case per tile and regime; inapplicable cases are skipped."""
    root = ET.Element("testsuites", name="alibi.conform")
    for check in CHECKS:
        suite = ET.SubElement(root, "testsuite", name=f"alibi.{check}")
        counts = {"tests": 0, "failures": 0, "skipped": 0}
        for u in report.tiles:
            v = u.verdict(check)
            case = ET.SubElement(suite, "testcase", classname=f"alibi.{check}", name=f"{u.tile}[{u.regime}]")
            counts["tests"] += 1
            if v.status == "fired":
                counts["failures"] += 1
                ET.SubElement(case, "failure", message=v.detail).text = json.dumps(v.evidence)
            elif v.status == "inapplicable":
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=v.detail)
        for k, n in counts.items():
            suite.set(k, str(n))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def read_report(path: str | Path) -> Report:
    """A `report.json` (or the folder holding one) as a `Report`; InputError naming the file otherwise."""
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    return Report.from_dict(jsonio.read(path), str(path))


def write_reports(report: Report, out: str | Path) -> list[Path]:
    """Render all three formats, then write them atomically (report.json last)."""
    out = Path(out)
    atomic.check_writable_dir(out)
    rendered = {"report.md": to_markdown(report), "junit.xml": to_junit(report), "report.json": report.to_json()}
    return [atomic.write_text(out / name, text) for name, text in rendered.items()]
