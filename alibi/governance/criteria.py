"""Acceptance criteria of a pre-registered study, evaluated by code.

A locked protocol's `analysis.yaml` states, before any measurement, what must be true of the
results. Each criterion names a *source* (a result file of the study: a conform report, a flip
analysis, a greedy-agreement record), a *metric* inside it (a dotted path into the result's JSON;
for a conform report also the derived metrics of `conform_report_metrics`), a comparison and a
value. The value is a number, a boolean, or `$other.metric`, another metric of the same source
(so "logits identical at every position" reads `logits_identical == $n_positions`).

    criteria:
      - id: T1-logits
        prediction: on the pow2 checkpoint both arms give bitwise-identical logits
        source: pow2
        metric: logits_identical
        op: "=="
        value: $n_positions

Argument. A criterion holds only if its metric exists, is not null, and satisfies the
comparison; a missing or null metric makes it *inapplicable*, which is reported as such and never
counts as support. The study's verdict is `pass` only when every criterion holds.

The evaluation is written beside the results as `criteria.json` (schema `alibi-criteria/v1`),
with the sha256 of every source file and the protocol's lock and head hashes, so a reader can tell
exactly which bytes were judged against which locked text.
"""

from __future__ import annotations

import importlib
import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from alibi.errors import InputError
from alibi.io.digests import sha256_bytes
from alibi.governance.prereg import require_locked
from alibi.governance.verified import verified_file
from alibi.io import jsonio, yamlio
from alibi.io.typed import TypedResult

SCHEMA = "alibi-criteria/v1"
CRITERIA_FILE = "criteria.json"
OPS = {"==": operator.eq, "!=": operator.ne, "<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}


class StudyVerdict(StrEnum):
    """A study judged: every criterion holds, one does not, or none fails but one is inapplicable."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class Criterion:
    """One pre-registered acceptance criterion: `source.metric op value` (see the module docstring)."""

    id: str
    prediction: str
    source: str
    metric: str
    op: str
    value: Any


@dataclass(frozen=True)
class Outcome:
    """A criterion judged: `holds` is True/False, or None when inapplicable (`reason` says why);
    `observed` and `expected` are the compared values."""

    criterion: Criterion
    holds: bool | None
    observed: Any
    expected: Any
    reason: str

    def _layout_out(self, doc: dict[str, Any]) -> dict[str, Any]:
        """As stored: the criterion's fields beside the judgement, in one object (`alibi.io.typed`)."""
        return {**doc.pop("criterion"), **doc}

    @classmethod
    def _layout_in(cls, doc: dict[str, Any], where: str) -> dict[str, Any]:
        names = [f.name for f in fields(Criterion)]
        return {"criterion": {k: doc.pop(k) for k in names if k in doc}, **doc}


@dataclass(frozen=True)
class Evaluation(TypedResult):
    """All criteria of a study judged against its results.

    verdict: `pass` (every criterion holds), `fail` (one does not), or `inconclusive` (none fails,
    one is inapplicable); sources: name → {path, sha256} of each result file read; protocol: the
    protocol's folder, lock and head hashes (None when evaluated outside a protocol).
    """

    SCHEMA = SCHEMA
    JSON_INDENT = 2
    JSON_SORT_KEYS = True
    REMEDY = "judge the criteria again (`alibi prereg evaluate`)"
    FILE = CRITERIA_FILE

    verdict: StudyVerdict
    outcomes: tuple[Outcome, ...]
    sources: Mapping[str, Mapping[str, str]]
    protocol: Mapping[str, Any] | None
    schema: str = SCHEMA


def parse_criteria(raw: Any, where: str) -> tuple[Criterion, ...]:
    """Criteria from the `criteria:` list of an analysis file; InputError naming `where` and the entry."""
    if not isinstance(raw, list) or not raw:
        raise InputError(f"{where}: `criteria` must be a non-empty list of {{id, prediction, source, metric, op, value}}")
    out: list[Criterion] = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            raise InputError(f"{where}: criteria[{i}] is not a mapping")
        missing = [k for k in Criterion.__dataclass_fields__ if k not in entry]
        extra = sorted(set(entry) - set(Criterion.__dataclass_fields__))
        if missing or extra:
            raise InputError(f"{where}: criteria[{i}] " + (f"lacks {', '.join(missing)}" if missing else
                                                           f"has unknown key(s) {', '.join(extra)}"))
        c = Criterion(**{k: entry[k] for k in Criterion.__dataclass_fields__})
        if c.op not in OPS:
            raise InputError(f"{where}: criteria[{i}] ({c.id}): op {c.op!r} is not one of {' '.join(OPS)}")
        if not all(isinstance(getattr(c, k), str) and getattr(c, k) for k in ("id", "source", "metric")):
            raise InputError(f"{where}: criteria[{i}]: id, source and metric must be non-empty strings")
        out.append(c)
    ids = [c.id for c in out]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise InputError(f"{where}: criterion id {dup[0]!r} appears twice; ids must be unique")
    return tuple(out)


def load_criteria(analysis_file: str | Path) -> tuple[Criterion, ...]:
    """The `criteria:` of an analysis YAML file (aliases refused, like every YAML alibi reads)."""
    path = Path(analysis_file)
    doc = yamlio.load(path)  # aliases refused, bounded depth, one-line messages
    if not isinstance(doc, Mapping) or "criteria" not in doc:
        raise InputError(f"{path}: has no `criteria:` list; state the acceptance criteria before measuring")
    return parse_criteria(doc["criteria"], str(path))


def lookup(doc: Any, dotted: str) -> tuple[bool, Any]:
    """(found, value) of a dotted path in nested mappings (list items by integer index)."""
    node = doc
    for part in dotted.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def judge(criterion: Criterion, doc: Mapping[str, Any]) -> Outcome:
    """One criterion against one source document."""
    found, observed = lookup(doc, criterion.metric)
    if not found or observed is None:
        return Outcome(criterion, None, observed, criterion.value,
                       f"{criterion.source}.{criterion.metric} is {'null' if found else 'absent'}: inapplicable")
    expected = criterion.value
    if isinstance(expected, str) and expected.startswith("$"):
        found_e, expected = lookup(doc, expected[1:])
        if not found_e or expected is None:
            return Outcome(criterion, None, observed, None,
                           f"{criterion.source}.{criterion.value[1:]} is absent or null: inapplicable")
    comparable = (_is_number(observed) and _is_number(expected)) or type(observed) is type(expected)
    if not comparable or (criterion.op not in ("==", "!=") and not _is_number(observed)) or \
            (_is_number(observed) and not math.isfinite(observed)):
        return Outcome(criterion, None, observed, expected,
                       f"cannot compare {observed!r} with {expected!r}: inapplicable")
    holds = bool(OPS[criterion.op](observed, expected))
    return Outcome(criterion, holds, observed, expected,
                   f"{criterion.metric} = {observed!r} {'satisfies' if holds else 'violates'} {criterion.op} {expected!r}")


def evaluate(criteria: tuple[Criterion, ...], documents: Mapping[str, Mapping[str, Any]],
             sources: Mapping[str, Mapping[str, str]], protocol: Mapping[str, Any] | None = None) -> Evaluation:
    """Judge every criterion against its source document (a criterion naming an unknown source is
    inapplicable). `sources` records where each document came from."""
    outcomes = []
    for c in criteria:
        if c.source not in documents:
            outcomes.append(Outcome(c, None, None, c.value, f"source {c.source!r} was not given: inapplicable"))
        else:
            outcomes.append(judge(c, documents[c.source]))
    if any(o.holds is False for o in outcomes):
        verdict = StudyVerdict.FAIL
    elif any(o.holds is None for o in outcomes):
        verdict = StudyVerdict.INCONCLUSIVE
    else:
        verdict = StudyVerdict.PASS
    return Evaluation(verdict, tuple(outcomes), dict(sources), None if protocol is None else dict(protocol))


# The result types whose documents carry consistency checks of their own (`from_dict`), by schema prefix: a
# source of one of these is read through it, so a document that contradicts itself is refused, not judged.
_TYPED_SOURCES = {"alibi.conform/": ("alibi.conform.results", "Report"),
                  "alibi-flips/": ("alibi.tokens.flips", "FlipAnalysis"),
                  "alibi.matrix/": ("alibi.conform.matrix", "Matrix")}
SOURCE_FIX = "pass a result file as the alibi command that wrote it left it, its folder's manifest intact"


def read_source(path: str | Path, *, verify: bool = True) -> tuple[dict[str, Any], dict[str, str]]:
    """A result JSON file as a document (conform reports get their derived metrics added) and its
    {path, sha256}.

    verify: the file is read only once the manifest covering it vouches for every byte of its folder
    (`alibi.governance.verified`); False only for a caller that wrote the file itself a moment ago,
    before its manifest (`alibi run`). The document must name its `schema`; one of a type with
    consistency checks of its own (a conform report, a flip analysis, a matrix) is read through that
    type, so a document that contradicts itself is refused (InputError naming the file)."""
    p = Path(path)
    if verify:
        verified = verified_file(p, None, fix=SOURCE_FIX)
        data, sha256 = verified.data, verified.sha256
    else:
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise InputError(f"{p}: cannot be read ({exc.strerror}); {SOURCE_FIX}") from None
        sha256 = sha256_bytes(data)
    doc = jsonio.loads(data, str(p))
    if not isinstance(doc, dict) or not isinstance(doc.get("schema"), str):
        raise InputError(f"{p}: not an alibi result (a JSON object naming its `schema`); {SOURCE_FIX}")
    for prefix, (module, name) in _TYPED_SOURCES.items():
        if doc["schema"].startswith(prefix):
            # imported by name: the result types bring torch and numpy, which start-up does without
            getattr(importlib.import_module(module), name).from_dict(doc, str(p))
    if doc["schema"].startswith("alibi.conform/"):
        doc = {**doc, **conform_report_metrics(doc)}
    return doc, {"path": str(p), "sha256": sha256}


def conform_report_metrics(report: Mapping[str, Any]) -> dict[str, Any]:
    """Derived metrics of a conform report, for criteria:

    `regimes_summary.<regime>.{units, differing_units, n_differing, n_elements, differing_fraction,
    max_ulp}` summed over the report's tiles, and `check_counts.<check>.{fired, passed,
    inapplicable}` counted over units (a unit's verdict for that check), overall and per regime
    (`regimes_summary.<regime>.checks.<check>...`: the invariance checks run in one regime only)."""
    regimes: dict[str, dict[str, Any]] = {}
    checks: dict[str, dict[str, int]] = {}
    for unit in report.get("tiles", []):
        r = regimes.setdefault(unit["regime"], {"units": 0, "differing_units": 0, "n_differing": 0,
                                                "n_elements": 0, "max_ulp": 0, "checks": {}})
        r["units"] += 1
        r["differing_units"] += int(unit["n_differing"] > 0)
        r["n_differing"] += int(unit["n_differing"])
        r["n_elements"] += int(unit["n_elements"])
        if unit.get("max_ulp") is not None:
            r["max_ulp"] = max(r["max_ulp"], unit["max_ulp"])
        for name, v in unit.get("verdicts", {}).items():
            status = "inapplicable" if not v["applicable"] else "fired" if v["fired"] else "passed"
            for counts in (checks, r["checks"]):
                counts.setdefault(name, {"fired": 0, "passed": 0, "inapplicable": 0})[status] += 1
    for r in regimes.values():
        r["differing_fraction"] = r["n_differing"] / r["n_elements"] if r["n_elements"] else None
    return {"regimes_summary": regimes, "check_counts": checks}


# The layer study's analysis.yaml predates `criteria:`; its four thresholds and the checks its
# protocol names for P1–P6 translate into criteria over the run's conform report like this.
def layer_study_criteria(params: Mapping[str, Any]) -> tuple[Criterion, ...]:
    """Criteria of `prereg/smollm2-layer-verification` from its analysis.yaml keys (source `report`)."""
    c: list[Criterion] = []
    checks = {"P1": ("lossless-fp32-entry", "int32-no-overflow"), "P2": ("pow2-identity",),
              "P3": ("real-scale-tolerance",), "P4": ("epilogue-model",),
              "P5": ("exact-accumulator", "shared-operands"), "P6": ("m-invariance", "run-to-run")}
    for pid, names in checks.items():
        for name in names:
            c.append(Criterion(f"{pid}-{name}-fired", f"{name} fires on no unit", "report",
                               f"check_counts.{name}.fired", "==", 0))
    for name in ("lossless-fp32-entry", "int32-no-overflow", "epilogue-model", "shared-operands"):
        c.append(Criterion(f"applicable-{name}", f"{name} is applicable on every unit", "report",
                           f"check_counts.{name}.inapplicable", "==", 0))
    # The invariance checks run once per tile, in the real-scale regime; checks 5 and 6 each
    # belong to one regime.
    for regime, name in (("real", "m-invariance"), ("real", "run-to-run"), ("pow2", "pow2-identity"),
                         ("real", "real-scale-tolerance")):
        c.append(Criterion(f"applicable-{name}", f"{name} is applicable on every {regime}-scale unit", "report",
                           f"regimes_summary.{regime}.checks.{name}.inapplicable", "==", 0))
    c.append(Criterion("P3-ulp", "every real-scale difference is within the ulp threshold", "report",
                       "regimes_summary.real.max_ulp", "<=", params["ulp_threshold"]))
    c.append(Criterion("P3-rare", "differing elements are rare under real scales", "report",
                       "regimes_summary.real.differing_fraction", "<=", params["max_differing_fraction_real"]))
    c.append(Criterion("P3-some", "the two scale orders differ somewhere under real scales", "report",
                       "regimes_summary.real.n_differing", ">=", params["min_differing_elements_real"]))
    c.append(Criterion("P2-count", "no element differs under pow2 scales", "report",
                       "regimes_summary.pow2.n_differing", "<=", params["max_differing_elements_pow2"]))
    return tuple(c)


def study_criteria(prereg_folder: str | Path) -> tuple[Criterion, ...]:
    """The criteria of a protocol folder: its analysis.yaml `criteria:`, or the layer study's
    legacy thresholds translated by `layer_study_criteria`."""
    path = Path(prereg_folder) / "analysis.yaml"
    doc = yamlio.load(path)  # aliases refused, bounded depth, one-line messages
    if isinstance(doc, Mapping) and "criteria" in doc:
        return parse_criteria(doc["criteria"], str(path))
    legacy = ("ulp_threshold", "max_differing_fraction_real", "min_differing_elements_real", "max_differing_elements_pow2")
    if isinstance(doc, Mapping) and all(k in doc for k in legacy):
        return layer_study_criteria(doc)
    raise InputError(f"{path}: states no acceptance criteria (`criteria:` list); add them before measuring")


def evaluate_study(prereg_folder: str | Path, sources: Mapping[str, str | Path], *, verify: bool = True) -> Evaluation:
    """Evaluate a locked protocol's criteria against result files (`name → path`): the protocol is
    verified first (`require_locked`), each result against its manifest (`read_source`; `verify=False`
    only for results the caller has just written, before their manifest), and the protocol's lock and
    head hashes go into the evaluation."""
    record = require_locked(prereg_folder)
    criteria = study_criteria(prereg_folder)
    documents, digests = {}, {}
    for name, path in sources.items():
        documents[name], digests[name] = read_source(path, verify=verify)
    return evaluate(criteria, documents, digests, record.as_dict())
