"""Conformance reports: `report.json` (the document), `report.md` (for people), `junit.xml` (for CI).

All three are rendered in memory first and written atomically, `report.json` last: a folder with
a `report.json` holds a complete report, and a failed run leaves no new report behind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from alibi import atomic
from alibi.checks import CHECKS

STATUS_WORD = {"passed": "passed", "fired": "FIRED", "inapplicable": "inapplicable"}


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=False, allow_nan=False) + "\n"


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The human-readable summary printed at the end of `alibi conform`."""
    a, b = report["kernel_a"], report["kernel_b"]
    lines = [f"alibi conform: {a['name']} ({a['epilogue_model']}) vs {b['name']} ({b['epilogue_model']})",
             f"  why this pair: {report['selection']}",
             f"  arm a runs as: {a['how']}", f"  arm b runs as: {b['how']}",
             f"  source: {report['source'].get('label', report['source'])}; regimes: {', '.join(report['regimes'])}"]
    for c in report["checks"]:
        lines.append(f"  {STATUS_WORD[c['status']]:>12}  {c['check']:<22} {c['detail']}")
    for regime in report["regimes"]:
        units = [u for u in report["tiles"] if u["regime"] == regime]
        equal = sum(u["bitwise_equal"] for u in units)
        differing = sum(u["n_differing"] for u in units)
        elements = sum(u["n_elements"] for u in units)
        ulps = [u["max_ulp"] for u in units if u["max_ulp"] is not None]
        lines.append(f"  {regime:>5} scales: {equal}/{len(units)} tiles bitwise equal, {differing} of {elements} "
                     f"elements differ, max ulp {max(ulps) if ulps else 'n/a'}")
    lines.append(f"  verdict: {report['verdict'].upper()} ({report['equivalence']})")
    for why in report.get("inconclusive_because", []):
        lines.append(f"    inconclusive: {why}")
    return lines


def to_markdown(report: dict[str, Any]) -> str:
    a, b = report["kernel_a"], report["kernel_b"]
    out = [f"# Conformance report: `{a['name']}` vs `{b['name']}`", "",
           f"**Verdict: {report['verdict']}** ({report['equivalence']})."
           + (f" Created {report['created_at']}." if report.get("created_at") else ""), "",
           f"- arm a: `{a['name']}`, declared epilogue `{a['epilogue_model']}`, runs as: {a['how']}",
           f"- arm b: `{b['name']}`, declared epilogue `{b['epilogue_model']}`, runs as: {b['how']}",
           f"- pair chosen: {report['selection']}",
           f"- source: {report['source'].get('label')}; seed {report['seed']}; regimes {', '.join(report['regimes'])}",
           "", "## Checks", "", "| check | status | threshold | detail |", "|---|---|---|---|"]
    for c in report["checks"]:
        thr = "" if c["threshold"] is None else c["threshold"]
        out.append(f"| {c['check']} | {c['status']} | {thr} | {c['detail']} |")
    out += ["", "## Tiles", "",
            "| tile | regime | M | K | N | differing | max ulp | bitwise | max abs acc | headroom bits | fired |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for u in report["tiles"]:
        fired = ", ".join(k for k, v in u["verdicts"].items() if v["fired"]) or "-"
        head = "" if u["headroom_bits"] is None else f"{u['headroom_bits']:.2f}"
        out.append(f"| {u['tile']} | {u['regime']} | {u['M']} | {u['K']} | {u['N']} | {u['n_differing']} / "
                   f"{u['n_elements']} | {u['max_ulp']} | {u['bitwise_equal']} | {u['max_abs_acc']} | {head} | {fired} |")
    env = report["environment"]
    out += ["", "## Environment", "", *(f"- {k}: {v}" for k, v in env.items()), ""]
    return "\n".join(out)


def to_junit(report: dict[str, Any]) -> str:
    """One test suite per check, one test case per tile and regime; inapplicable cases are skipped."""
    root = ET.Element("testsuites", name="alibi.conform")
    for check in CHECKS:
        suite = ET.SubElement(root, "testsuite", name=f"alibi.{check}")
        counts = {"tests": 0, "failures": 0, "skipped": 0}
        for u in report["tiles"]:
            v = u["verdicts"][check]
            case = ET.SubElement(suite, "testcase", classname=f"alibi.{check}", name=f"{u['tile']}[{u['regime']}]")
            counts["tests"] += 1
            if v["status"] == "fired":
                counts["failures"] += 1
                ET.SubElement(case, "failure", message=v["detail"]).text = json.dumps(v["evidence"])
            elif v["status"] == "inapplicable":
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=v["detail"])
        for k, n in counts.items():
            suite.set(k, str(n))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def write_reports(report: dict[str, Any], out: str | Path) -> list[Path]:
    """Render all three formats, then write them atomically (report.json last)."""
    out = Path(out)
    atomic.check_writable_dir(out)
    rendered = {"report.md": to_markdown(report), "junit.xml": to_junit(report), "report.json": to_json(report)}
    return [atomic.write_text(out / name, text) for name, text in rendered.items()]
