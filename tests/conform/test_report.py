"""report.md answers the question first; report.json says where the elements differ."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from faulty_kernels import divergent_tile

from alibi.cli import main
from alibi.conform.differences import DIFFERENCE_CAP
from alibi.conform.report import read_report, to_markdown, why_sentence
from alibi.conform.results import Report
from alibi.exact.emulator import EpilogueModel, run_model
from alibi.exact.numerics import bits, bitwise_equal_mask
from alibi.tiles.tile import save_tile

EMU = ["--kernel-a", "emulator:w_then_a", "--kernel-b", "emulator:a_then_w"]


@pytest.fixture(scope="module")
def conformed(tmp_path_factory):
    """conform over one tile on which the two orders agree and two on which they differ (real scales).

    Returns the typed report (read back through `read_report`, as every consumer reads it), the raw
    report.json document (whose layout one test asserts) and report.md."""
    root = tmp_path_factory.mktemp("report")
    (root / "tiles").mkdir()
    quiet = divergent_tile(seed=0)
    quiet = quiet.replace(name="agrees", s_a=torch.ones(quiet.M), s_w=torch.full((quiet.N,), 2.0**-10))
    save_tile(quiet, root / "tiles" / "0_agrees.safetensors")
    for i in (1, 2):
        save_tile(divergent_tile(seed=i).replace(name=f"differs{i}"), root / "tiles" / f"{i}_differs{i}.safetensors")
    assert main(["conform", *EMU, "--tiles", str(root / "tiles"), "--out", str(root / "r"), "--quiet"]) == 0
    doc = json.loads((root / "r" / "report.json").read_text())
    return read_report(root / "r"), doc, (root / "r" / "report.md").read_text()


def _expected_outputs(seed: int):
    t = divergent_tile(seed=seed)
    return run_model(EpilogueModel("w_then_a"), t), run_model(EpilogueModel("a_then_w"), t)


def test_report_md_opens_with_the_verdict_and_per_regime_totals(conformed):
    report, _, md = conformed
    diffs = [int((~bitwise_equal_mask(*_expected_outputs(s))).sum()) for s in (1, 2)]
    elements = sum(u.n_elements for u in report.units("real"))
    head = md.split("## Checks")[0]
    assert "**Verdict: pass** (outputs not bitwise equal)" in head
    assert f"- real scales: 1/3 tiles bitwise equal, {sum(diffs):,} of {elements:,} elements differ, max ulp 1" in head
    assert f"- pow2 scales: 3/3 tiles bitwise equal, 0 of {elements:,} elements differ, max ulp 0" in head


def test_report_md_says_why_in_a_sentence_drawn_from_the_checks(conformed):
    """Issue 12 adds predicted against observed to the sentence: all 6 units (3 tiles × 2 regimes) differ
    exactly where the two declared models predict, and the cause named is the scale order."""
    report, _, md = conformed
    assert [u.explained for u in report.tiles] == [True] * 6
    assert [u.cause for u in report.tiles if not u.bitwise_equal] == ["scale order", "scale order"]
    why = ("**Why:** Each arm equals its declared epilogue model bit for bit (`w_then_a+fma` and `a_then_w+fma`), "
           "so every difference comes from the order in which they apply the activation and weight scales: 6 of 6 "
           "units differ exactly where the declared models predict. Under power-of-two weight scales the two orders "
           "round to the same bits, and no element differs.")
    assert why in md


def test_report_md_lists_differing_tiles_first_marked_with_json_booleans_and_no_seed_none(conformed):
    _, _, md = conformed
    rows = [line for line in md.split("## Tiles")[1].split("## Environment")[0].splitlines()
            if line.startswith("| **≠** |") or line.startswith("| = |")]
    assert len(rows) == 6
    marks = [row.split("|")[1].strip() for row in rows]
    assert marks == ["**≠**", "**≠**", "=", "=", "=", "="]
    assert [row.split("|")[2].strip() for row in rows[:2]] == ["differs1", "differs2"]  # real regime, in order
    assert all("| false |" in row for row in rows[:2]) and all("| true |" in row for row in rows[2:])
    assert "True" not in md and "False" not in md
    assert "seed None" not in md and "no seed (the tiles were given, not drawn)" in md


def test_report_json_lists_each_differing_element_with_both_bit_patterns(conformed):
    """Reads the report.json document itself (not the typed report): the file's layout is what is asserted."""
    _, report, _ = conformed
    for u in report["tiles"]:
        d = u["differences"]
        assert d["count"] == u["n_differing"] and d["cap"] == DIFFERENCE_CAP
        if u["tile"] == "agrees" or u["regime"] == "pow2":
            assert d["elements"] == []
            continue
        out_a, out_b = _expected_outputs(int(u["tile"].removeprefix("differs")))
        want = (~bitwise_equal_mask(out_a, out_b)).nonzero().tolist()[:DIFFERENCE_CAP]
        assert [[e["row"], e["column"]] for e in d["elements"]] == want
        for e in d["elements"]:
            r, c = e["row"], e["column"]
            assert int(e["a_bits"], 16) == int(bits(out_a[r, c])) & 0xFFFF
            assert int(e["b_bits"], 16) == int(bits(out_b[r, c])) & 0xFFFF
            assert (e["a"], e["b"]) == (float(out_a[r, c]), float(out_b[r, c])) and e["ulp"] == 1


def test_a_tile_that_differs_from_its_declared_model_is_explained_as_a_finding():
    """A real report (the typed API takes a `Report`, not a hand-made dict): an arm that keeps its weight
    scale in bf16 breaks its declared model, and the sentence calls that a finding."""
    from faulty_kernels import Bf16ScaleEpilogue

    from alibi.conform.pipeline import Pair, run_conformance, source_from_tiles
    from alibi.kernels.registry import get_kernel

    pair = Pair(Bf16ScaleEpilogue(), get_kernel("emulator:a_then_w"), "test")
    report = run_conformance(pair, source_from_tiles([divergent_tile(seed=0)]), ["real"], invariance=False)
    assert report.check("epilogue-model").status == "fired"
    assert why_sentence(report).startswith("At least one arm does not equal its declared epilogue model")


def test_a_seeded_synthetic_report_names_its_seed(tmp_path):
    assert main(["conform", *EMU, "--synthetic", "tiny", "--seed", "3", "--out", str(tmp_path), "--quiet"]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "synthetic preset tiny (seed 3); seed 3;" in md
    assert md == to_markdown(Report.from_json((tmp_path / "report.json").read_text()))


def test_a_tile_name_with_a_newline_or_a_pipe_cannot_inject_markdown(conformed):
    """issue 16: tile names were pasted raw into report.md, so a newline in a name started a heading."""
    report = conformed[0]
    evil = dataclasses.replace(report.tiles[0], tile="evil\n# Injected heading | extra cell `code`")
    md = to_markdown(dataclasses.replace(report, tiles=(evil, *report.tiles[1:])))
    assert not any(line.startswith("# Injected") for line in md.splitlines())
    row = next(line for line in md.splitlines() if "evil" in line)
    assert "evil\\n# Injected heading \\| extra cell \\`code\\`" in row
    header = next(line for line in md.splitlines() if line.startswith("| | tile |"))
    assert row.replace("\\|", "").count("|") == header.count("|")
