"""`alibi.io.typed`, the one serializer: every result document of the package goes through it, every result type
round-trips through it, and every committed result file reads back through its type (issue 23, item 3).

A result document is found, not listed: any dataclass in `alibi/` with a `schema` field is one, so a new result
type cannot escape the round trip by being left out of a list here. Its instances are synthesized from its type
hints (two per type: every optional field None and lists of one, or every optional field set and lists of two),
with the few field values that a type's invariants pin named in `PINNED`.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import itertools
import json
import subprocess
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import alibi
from alibi.errors import InputError
from alibi.io.typed import TypedResult, from_plain, to_plain

PACKAGE = Path(alibi.__file__).resolve().parent
REPO = PACKAGE.parent


def result_classes() -> list[type]:
    """Every dataclass of the package with a `schema` field, found by reading the sources (nothing executes)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_bytes())
        for node in tree.body:
            if not isinstance(node, ast.ClassDef) or not any("dataclass" in ast.unparse(d) for d in node.decorator_list):
                continue
            if any(isinstance(s, ast.AnnAssign) and getattr(s.target, "id", None) == "schema" for s in node.body):
                module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
                found.append(getattr(importlib.import_module(module), node.name))
    return found


RESULTS = result_classes()


def test_the_scan_finds_the_result_documents():
    names = {c.__name__ for c in RESULTS}
    assert {"Report", "Differences", "Matrix", "DetectionMatrix", "BoundaryReport", "FlipAnalysis", "ArmRecords",
            "GreedyRun", "GreedyAgreement", "LocateResult", "PrefillDecodeResult", "VariationsReport",
            "DepthSweep", "RowsSweep", "DepthAnalysis", "Evaluation", "PairPrediction", "ConformBench", "KernelLog",
            "ShardRun"} <= names


@pytest.mark.parametrize("cls", RESULTS, ids=lambda c: c.__name__)
def test_every_result_document_is_a_typed_result_that_writes_no_json_of_its_own(cls):
    assert issubclass(cls, TypedResult) and dataclasses.is_dataclass(cls)
    assert cls.__dataclass_params__.frozen
    assert cls.SCHEMA and dataclasses.fields(cls)  # the version it writes
    own = {"to_json", "from_json", "to_dict", "as_dict"} & set(vars(cls))
    assert not own, f"{cls.__name__} defines {own}: read and write through alibi.io.typed.TypedResult"


def test_the_reflective_converter_exists_once():
    """No module but alibi/io/typed.py walks type hints to build results (flips.py once carried a copy)."""
    users = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if "get_type_hints" in p.read_text()]
    assert users == ["io/typed.py"]


# --- instances from type hints ------------------------------------------------------------------------

def _checks():
    from alibi.conform.verdict import CHECKS
    return list(CHECKS)


# Field values a type's invariants pin (a hook or a reader's check refuses anything else).
PINNED: dict[tuple[str, str], Any] = {
    ("KernelLog", "sha256"): "ab" * 32,
    ("FlipAnalysis", "n_positions"): 4,
    ("FlipAnalysis", "n_flips"): 1,
    ("FlipAnalysis", "flip_rate"): 0.25,
}


def example(hint: Any, variant: int, owner: str = "", name: str = "") -> Any:
    """A value of type `hint`: variant 0 leaves every optional value None and lists one item long; variant 1
    fills them and lists two (an int stands where a float belongs, as JSON may spell it)."""
    if (owner, name) in PINNED:
        return PINNED[(owner, name)]
    n = 1 + variant
    origin = typing.get_origin(hint)
    if hint is Any:
        return {"k": [1, "x", None, 2.5]}
    if origin in (typing.Union, types.UnionType):
        options = [o for o in typing.get_args(hint) if o is not type(None)]
        if type(None) in typing.get_args(hint) and variant == 0:
            return None
        return example(options[variant % len(options)], variant, owner, name)
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(example(args[0], variant, owner, name) for _ in range(n))
        return tuple(example(a, variant, owner, name) for a in args)
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        args = typing.get_args(hint)
        value = Any if not args else args[1]
        return {f"k{i}": example(value, variant, owner, name) for i in range(n)}
    if dataclasses.is_dataclass(hint):
        return instance(hint, variant)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return list(hint)[variant % len(hint)]
    return {bool: bool(variant), int: 3 + variant, float: (0.5, 2)[variant], str: f"s{variant}"}[hint]


def instance(cls: type, variant: int) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name == "schema":
            kwargs[f.name] = cls.SCHEMA
        else:
            kwargs[f.name] = example(hints[f.name], variant, cls.__name__, f.name)
    return cls(**kwargs)


def _fix(cls: type, x: Any) -> Any:
    """What the synthesizer cannot know: values tied to one another."""
    from alibi.conform.results import UnitResult
    from alibi.conform.verdict import Verdict

    def walk(v: Any) -> Any:
        if isinstance(v, Verdict):
            return dataclasses.replace(v, check=_checks()[hash(v.detail) % 3])
        if isinstance(v, UnitResult):  # verdicts are stored keyed by check: one per check
            return dataclasses.replace(walk_fields(v), verdicts=tuple(
                dataclasses.replace(walk(w), check=c) for w, c in zip(v.verdicts, _checks())))
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return walk_fields(v)
        if isinstance(v, tuple):
            return tuple(walk(i) for i in v)
        return v

    def walk_fields(v: Any) -> Any:
        return dataclasses.replace(v, **{f.name: walk(getattr(v, f.name)) for f in dataclasses.fields(v)
                                         if f.init})

    x = walk(x)
    if cls.__name__ == "Matrix":  # one cell per pair of distinct kernels, its totals the sums over its units
        from alibi.conform.matrix import PairStatus
        kernels = tuple(dataclasses.replace(k, name=f"kernel{i}") for i, k in enumerate(x.kernels))
        template = x.cells[0]
        cells = tuple(dataclasses.replace(
            template, kernel_a=a.name, kernel_b=b.name, status=PairStatus.UNEXPLAINED,
            n_elements=sum(u.n_elements for u in template.units),
            n_differing=sum(u.n_differing for u in template.units),
            units=tuple(dataclasses.replace(u, explained=False) for u in template.units))
            for a, b in itertools.combinations(kernels, 2))
        x = dataclasses.replace(x, kernels=kernels, cells=cells)
    if cls.__name__ == "GreedyRun":  # one sequence per window, each new_tokens long, one digest per token
        seqs = tuple(tuple(range(x.new_tokens)) for _ in x.windows)
        digests = None if x.logit_digests is None else tuple(tuple("d" * 16 for _ in s) for s in seqs)
        x = dataclasses.replace(x, sequences=seqs, logit_digests=digests)
    return x


@pytest.mark.parametrize("variant", [0, 1])
@pytest.mark.parametrize("cls", RESULTS, ids=lambda c: c.__name__)
def test_every_result_type_round_trips_through_json_to_the_same_object_and_bytes(cls, variant):
    x = _fix(cls, instance(cls, variant))
    text = x.to_json()
    back = cls.from_json(text, "x.json")
    assert back == x
    assert back.to_json() == text
    assert json.loads(text)["schema"] == cls.SCHEMA


def test_a_nested_result_round_trips_through_the_plain_functions():
    """A unit, which travels inside a report and inside the unit files of a resumable run."""
    from alibi.conform.results import UnitResult

    unit = _fix(UnitResult, instance(UnitResult, 1))
    plain = json.loads(json.dumps(to_plain(unit)))
    assert list(plain["verdicts"]) == [v.check for v in unit.verdicts]  # stored keyed by check
    assert from_plain(UnitResult, plain, "unit") == unit


# --- what the reader refuses --------------------------------------------------------------------------

def test_the_reader_names_the_field_path_of_a_wrong_type_a_missing_and_an_unknown_field():
    from alibi.conform.results import Report

    doc = json.loads(_fix(Report, instance(Report, 1)).to_json())
    doc["tiles"][1]["M"] = True  # JSON true is not a row count
    with pytest.raises(InputError, match=r"^r\.json\.tiles\[1\]\.M: expected an integer, got True; re-run"):
        Report.from_dict(doc, "r.json")
    doc = json.loads(_fix(Report, instance(Report, 1)).to_json())
    del doc["tiles"][0]["n_differing"]
    with pytest.raises(InputError, match=r"r\.json\.tiles\[0\]: missing field 'n_differing' of UnitResult"):
        Report.from_dict(doc, "r.json")
    doc = json.loads(_fix(Report, instance(Report, 1)).to_json())
    doc["kernel_a"]["extra"] = 1
    with pytest.raises(InputError, match=r"r\.json\.kernel_a: unknown field\(s\) extra of KernelRecord"):
        Report.from_dict(doc, "r.json")
    with pytest.raises(InputError, match=r"r\.json: schema is 'alibi\.conform/v9', expected 'alibi\.conform/v2'"):
        Report.from_dict({**doc, "schema": "alibi.conform/v9"}, "r.json")
    with pytest.raises(InputError, match="not valid JSON"):
        Report.from_json("{", "r.json")


def _enums(hint: Any, seen: set) -> set[type]:
    """Every enum type reachable from a type hint through dataclass fields and type arguments."""
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {hint}
    if dataclasses.is_dataclass(hint):
        if hint in seen:
            return set()
        seen.add(hint)
        return set().union(*(_enums(h, seen) for h in typing.get_type_hints(hint).values()))
    return set().union(set(), *(_enums(a, seen) for a in typing.get_args(hint)))


def test_verdicts_statuses_regimes_and_predictions_are_string_enums_written_as_their_strings():
    from alibi.conform.verdict import Status  # a verdict's derived status, written beside fired/applicable

    found = set().union({Status}, *(_enums(c, set()) for c in RESULTS))
    assert {e.__name__ for e in found} >= {"Status", "ReportVerdict", "Equivalence", "Regime", "Safety", "PairStatus",
                                           "PairVerdict", "StudyVerdict", "CheckCell", "Computed"}
    for e in found:
        assert issubclass(e, enum.StrEnum), f"{e.__name__}: a str enum, so f-strings, pages and JSON show its value"
        for member in e:
            assert f"{member}" == str(member) == member.value and json.dumps(member) == json.dumps(member.value)


def test_an_unknown_enum_string_is_refused_naming_the_ones_it_may_be():
    from alibi.conform.results import Report

    doc = json.loads(_fix(Report, instance(Report, 1)).to_json())
    with pytest.raises(InputError, match=r"r\.json\.verdict: expected one of 'pass', 'fail', 'inconclusive', got "
                                         r"'passed'"):
        Report.from_dict({**doc, "verdict": "passed"}, "r.json")
    doc["tiles"][0]["regime"] = "pow3"
    with pytest.raises(InputError, match=r"r\.json\.tiles\[0\]\.regime: expected one of 'real', 'pow2'"):
        Report.from_dict(doc, "r.json")


@pytest.mark.parametrize("hint, value, expected", [
    (int, 1.0, "an integer"), (int, True, "an integer"), (float, "1", "a finite number"), (bool, 0, "true or false"),
    (float | str, None, "a finite number or a string"), (tuple[int, int], [1], "a list of 2 items"),
    (dict[str, int], {"a": "1"}, "an integer"),
])
def test_a_value_that_does_not_fit_its_hint_is_refused(hint, value, expected):
    with pytest.raises(InputError, match=expected):
        from_plain(hint, value, "x")


def test_an_int_where_a_float_belongs_stays_an_int_so_the_bytes_survive_a_round_trip():
    assert from_plain(float, 1, "x") == 1 and type(from_plain(float, 1, "x")) is int
    assert from_plain(float | str, "inf", "x") == "inf" and from_plain(float | str, 1.5, "x") == 1.5


def test_a_result_holding_nan_is_a_bug_of_its_producer_and_is_not_written():
    with pytest.raises(ValueError, match="non-finite"):
        to_plain({"x": float("nan")})


# --- every committed result file (analysis/results) -------------------------------------------------

def _committed() -> list[tuple[str, type]]:
    by_schema = {s: c for c in RESULTS for s in (c.SCHEMA, *c.READS)}
    files = subprocess.run(["git", "ls-files", "--", "analysis/results/*.json"], cwd=REPO, capture_output=True,
                           text=True).stdout.split()
    out = []
    for f in files:
        try:
            doc = json.loads((REPO / f).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("schema") in by_schema:
            out.append((f, by_schema[doc["schema"]]))
    return out


COMMITTED = _committed() if (REPO / ".git").exists() else []


def test_the_committed_result_files_are_found():
    if not COMMITTED:
        pytest.skip("no git checkout here to list the committed files")
    assert len(COMMITTED) >= 80 and {c.__name__ for _, c in COMMITTED} >= {
        "Report", "FlipAnalysis", "GreedyRun", "DetectionMatrix", "Matrix", "DepthSweep", "Evaluation"}


@pytest.mark.parametrize("path, cls", COMMITTED, ids=[p for p, _ in COMMITTED])
def test_a_committed_result_file_reads_through_its_type_and_writes_back_the_same_bytes(path, cls):
    """A file of the schema a type writes today comes back byte for byte; one of an older schema it still
    reads (upgraded) keeps its schema, and the upgraded object round-trips."""
    text = (REPO / path).read_text(encoding="utf-8")
    result = cls.from_json(text, path)
    if result.schema == cls.SCHEMA:
        assert result.to_json() == text
    else:
        assert result.schema in cls.READS and cls.from_json(result.to_json(), path) == result
