"""report.json against its published JSON Schema, and the rule that a changed field needs a new version."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

jsonschema = pytest.importorskip("jsonschema", reason="needs jsonschema (pip install 'integer-alibi[test]')")

from alibi.conform.pipeline import Pair, run_conformance, source_from_preset
from alibi.conform.results import ADDED_IN_V2, SCHEMA, SCHEMA_FILE, V1, KernelRecord, Report, UnitResult
from alibi.errors import InputError
from alibi.kernels.registry import get_kernel

ROOT = Path(__file__).resolve().parents[2]
# Every schema file ever published, with the sha256 of its bytes. A published file never changes:
# to change a field, write docs/schemas/alibi.conform.vN+1.schema.json, bump alibi.conform.results.SCHEMA,
# and add the new file here.
PUBLISHED = {
    "docs/schemas/alibi.conform.v2.schema.json": "9ef305f3e339cc78c265f6ad6df257496f46a48efd00c43cacdec0972945f13a",
}


def schema() -> dict:
    return json.loads((ROOT / SCHEMA_FILE).read_text())


@pytest.fixture(scope="module")
def report() -> Report:
    """A real report with bias, two bias modes and both regimes (CPU kernels, small)."""
    pair = Pair(get_kernel("torch-cpu"), get_kernel("emulator:a_then_w"), "schema test")
    return run_conformance(pair, source_from_preset("smollm2-135m-bias", seed=0, rows=8), ("real", "pow2"))


def test_a_real_report_validates_against_the_published_schema_of_its_version(report):
    doc = json.loads(report.to_json())
    assert doc["schema"] == SCHEMA == schema()["$id"]
    jsonschema.Draft202012Validator(schema()).validate(doc)


def test_the_schema_file_of_the_current_version_is_published_and_unchanged():
    assert SCHEMA_FILE in PUBLISHED, f"{SCHEMA_FILE} is not in PUBLISHED: a new schema version must be listed"
    for name, digest in PUBLISHED.items():
        got = hashlib.sha256((ROOT / name).read_bytes()).hexdigest()
        assert got == digest, f"{name} changed after it was published: write a new schema version instead"


@pytest.mark.parametrize("cls, where", [(Report, None), (UnitResult, "unit"), (KernelRecord, "kernel")])
def test_every_field_of_the_result_types_is_in_the_schema_and_nothing_else(cls, where):
    """Adding, removing or renaming a field of a result type fails here until the schema version changes."""
    s = schema()
    node = s if where is None else s["$defs"][where]
    fields = {f.name for f in dataclasses.fields(cls)}
    assert set(node["properties"]) == fields
    assert node["additionalProperties"] is False


def test_a_report_missing_a_field_or_carrying_an_extra_one_is_invalid(report):
    doc = json.loads(report.to_json())
    validator = jsonschema.Draft202012Validator(schema())
    del doc["tiles"][0]["explained"]
    assert not validator.is_valid(doc)
    doc = json.loads(report.to_json())
    doc["tiles"][0]["extra"] = 1
    assert not validator.is_valid(doc)


def test_report_json_round_trips_through_the_types_byte_for_byte(report):
    text = report.to_json()
    again = Report.from_json(text)
    assert again == report
    assert again.to_json() == text


def test_a_report_of_another_schema_version_is_refused_naming_the_versions_it_reads(report):
    doc = json.loads(report.to_json())
    doc["schema"] = "alibi.conform/v0"
    with pytest.raises(InputError, match="schema is 'alibi.conform/v0', expected 'alibi.conform/v2' or "
                                         "'alibi.conform/v1'"):
        Report.from_dict(doc)


V1_REPORTS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "analysis/results").rglob("report.json")
                    if '"alibi.conform/v1"' in p.read_text(encoding="utf-8"))


def test_the_committed_v1_reports_are_found():
    assert len(V1_REPORTS) >= 6


@pytest.mark.parametrize("path", V1_REPORTS)
def test_a_committed_v1_report_reads_as_a_report_and_writes_back_the_same_document(path):
    """v1 units lack the fields v2 added (read as None) and, in the oldest, `differences`; the report keeps its
    schema and is written back as v1 (the same bytes, but for a file written with sorted keys)."""
    text = (ROOT / path).read_text(encoding="utf-8")
    report = Report.from_json(text, path)
    assert report.schema == V1 and report.tiles
    assert all(getattr(u, f) is None for u in report.tiles for f in ADDED_IN_V2)
    assert json.loads(report.to_json()) == json.loads(text)
    if list(json.loads(text)["tiles"][0]) == list(json.loads(report.to_json())["tiles"][0]):  # keys not sorted
        assert report.to_json() == text
