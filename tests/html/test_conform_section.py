"""The conform section reads report.json as `Report`: one-line errors naming the field, what the ulp figure can
show, one row per tile."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from alibi.conform.differences import ElementDifference
from alibi.conform.results import Report
from alibi.errors import InputError
from alibi.html.sections.conform import near_zero, render_text, tile_rows, ulp_counts

REPO = Path(__file__).resolve().parents[2]
H200_DEFAULT = REPO / "analysis/results/h200/conform-default/report.json"


def _element(a, b, ulp, row=0, column=0):
    return {"row": row, "column": column, "a_bits": "0x0000", "b_bits": "0x8000", "a": a, "b": b, "ulp": ulp}


def test_a_report_of_another_schema_is_refused_in_one_line_naming_the_file(fired_report):
    doc = {**fired_report, "schema": "alibi.conform/v9"}
    with pytest.raises(InputError) as err:
        render_text(json.dumps(doc), "runs/x/report.json")
    assert "runs/x/report.json" in str(err.value) and "'alibi.conform/v9'" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_missing_or_mistyped_field_is_named_by_its_path(fired_report):
    doc = copy.deepcopy(fired_report)
    del doc["tiles"][1]["n_differing"]
    with pytest.raises(InputError, match=r"r\.json\.tiles\[1\]: missing field 'n_differing' of UnitResult"):
        render_text(json.dumps(doc), "r.json")
    doc = copy.deepcopy(fired_report)
    doc["tiles"][0]["M"] = True  # JSON true is not a row count
    with pytest.raises(InputError, match=r"r\.json\.tiles\[0\]\.M: expected an integer, got True"):
        render_text(json.dumps(doc), "r.json")
    with pytest.raises(InputError, match="not valid JSON"):
        render_text("{", "r.json")


def test_near_zero_means_a_zero_of_either_sign_or_a_sign_change():
    def e(a, b):
        return near_zero(ElementDifference(0, 0, "", "", a, b, 0))

    assert e(0.0, -0.0) and e(1e-3, -1e-3) and e(0.0, 2.0)
    assert not e(1.0, 1.0078125) and not e(-2.0, -2.015625)
    assert not e("inf", 1.0) and not e(-1.0, "nan")  # a non-finite value is never near zero


def test_ulp_counts_put_near_zero_and_non_finite_elements_apart(fired_report):
    doc = copy.deepcopy(fired_report)
    real = next(u for u in doc["tiles"] if u["regime"] == "real")
    real["differences"]["elements"] = [_element(1.0, 1.0078125, 1), _element(0.0, -0.0, 0),
                                       _element(0.001, -0.001, 30000), _element("inf", 1.0, None),
                                       _element(-3.0, -3.03125, 2)]
    for u in doc["tiles"]:
        if u is not real:
            u["differences"]["elements"] = []
    counts = {c.regime: c for c in ulp_counts(Report.from_json(json.dumps(doc)))}
    assert counts["real"].away == {1: 1, 2: 1} and counts["real"].near_zero == {0: 1, 30000: 1}
    assert counts["real"].nonfinite == 1 and counts["pow2"].total == 0


def test_a_report_without_per_element_differences_says_what_its_ulp_figure_shows_instead():
    text = H200_DEFAULT.read_text(encoding="utf-8")
    report = Report.from_json(text)
    assert ulp_counts(report) is None  # written on the H200 before units carried `differences`
    body = str(render_text(text, str(H200_DEFAULT)).body)
    assert "records no per-element distances" in body and "near-zero elements cannot be told apart" in body
    assert "largest ulp distance" in body


def test_a_page_with_per_element_differences_says_how_many_of_them_it_shows(fired_report):
    body = str(render_text(json.dumps(fired_report), "r.json").body)
    listed = sum(len(u["differences"]["elements"]) for u in fired_report["tiles"])
    total = sum(u["differences"]["count"] for u in fired_report["tiles"])
    assert listed < total  # 37 differ per unit, 32 are listed
    assert f"Shown: the {listed} elements report.json lists, of {total} differing" in body


def test_one_row_per_tile_carries_each_regime_and_the_tiles_headroom(fired_report):
    rows = tile_rows(Report.from_json(json.dumps(fired_report)))
    assert [r.name for r in rows] == list(dict.fromkeys(u["tile"] for u in fired_report["tiles"]))
    for r in rows:
        units = [u for u in fired_report["tiles"] if u["tile"] == r.name]
        assert set(r.by_regime) == {u["regime"] for u in units}
        assert {u["headroom_bits"] for u in units} == {r.headroom_bits}  # the accumulator ignores the scales
        assert r.differing == sum(u["n_differing"] for u in units)
