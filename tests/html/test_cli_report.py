"""`alibi report html DIR`: re-render a result folder from its JSON, never breaking a manifest."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from alibi.cli import main
from alibi.governance.manifest import verify_files
from alibi.html import render_folder
from alibi.html.sections.conform import SCHEMAS

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "analysis/results/h200"
# The layer study's report: 210 tiles × 2 regimes. "A few seconds" on the 2 shared CPU cores CI has; rendering
# it took 1.5-2.7 s there, so 10 s fails only on a real slowdown, not on a busy machine.
RENDER_BUDGET_S = 10.0
SIZE_BUDGET_BYTES = 3_000_000


def test_a_manifest_pinned_folder_gets_its_page_beside_it_with_the_same_bytes_conform_wrote(fired_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(fired_run, run)
    assert main(["report", "html", str(run)]) == 0
    beside = tmp_path / "run.report.html"
    assert beside.read_bytes() == (run / "report.html").read_bytes()  # rendering is a function of report.json
    assert verify_files(run) == []  # nothing was added inside the pinned folder


def test_an_out_inside_a_pinned_folder_is_refused_in_one_line_and_nothing_is_written(fired_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(fired_run, run)
    before = sorted(p.name for p in run.iterdir())
    assert main(["report", "html", str(run), "--out", str(run / "page.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "alibi manifest verify" in err and f"--out {run}.report.html" in err
    assert sorted(p.name for p in run.iterdir()) == before and verify_files(run) == []


def test_a_folder_no_manifest_covers_gets_report_html_beside_its_json(fired_run, tmp_path):
    plain = tmp_path / "plain" / "report"
    plain.mkdir(parents=True)
    shutil.copy(fired_run / "report.json", plain / "report.json")
    assert main(["report", "html", str(tmp_path / "plain")]) == 0  # a run folder: report/report.json
    assert (plain / "report.html").read_bytes() == (fired_run / "report.html").read_bytes()


def test_a_folder_without_a_result_is_refused_naming_what_was_looked_for(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["report", "html", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "holds no result to render" in err and "report/report.json" in err
    assert list((tmp_path / "empty").iterdir()) == []


def test_a_report_of_another_schema_is_refused_and_nothing_is_written(fired_run, tmp_path, capsys):
    folder = tmp_path / "odd"
    folder.mkdir()
    doc = json.loads((fired_run / "report.json").read_text(encoding="utf-8"))
    assert doc["schema"] in SCHEMAS  # a schema the page reads, so only the change below can refuse it
    (folder / "report.json").write_text(json.dumps({**doc, "schema": "alibi.conform/v0"}), encoding="utf-8")
    assert main(["report", "html", str(folder)]) == 2
    assert "alibi.conform/v0" in capsys.readouterr().err and not (folder / "report.html").exists()


def test_the_committed_h200_default_run_renders_beside_its_pinned_folder(tmp_path):
    copy = tmp_path / "conform-default"
    shutil.copytree(H200 / "conform-default", copy)
    assert verify_files(copy) == []
    assert main(["report", "html", str(copy)]) == 0
    page = (tmp_path / "conform-default.report.html").read_text(encoding="utf-8")
    assert "<code>cutlass</code> vs <code>triton</code>" in page and verify_files(copy) == []


def test_the_420_unit_layer_study_renders_within_budget():
    start = time.perf_counter()
    page = render_folder(H200 / "smollm2-layer-verification")
    seconds = time.perf_counter() - start
    size = len(page.html.encode("utf-8"))
    assert page.html.count('<td class="name mono">') == 210  # every tile, each with both regimes in its row
    assert size < SIZE_BUDGET_BYTES, size
    assert seconds < RENDER_BUDGET_S, seconds
