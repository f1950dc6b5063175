"""`alibi report html DIR`: re-render a result folder from its JSON, never breaking a manifest."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import alibi
from hostile import main_one_line
from alibi.cli import main
from alibi.conform.results import Report
from alibi.governance.manifest import build_predicate, verify_files, write_manifest
from alibi.html import render_folder

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "analysis/results/h200"
# The layer study's report: 210 tiles × 2 regimes = 420 units. Its rendering is held to a budget of work, not of
# seconds (which measure the machine as much as the code): lines of alibi's own code (templates included) executed,
# counted with sys.settrace. When the budget was set the render executed 251,113 lines, 598 per unit.
UNITS = 420
LINES_PER_UNIT_BUDGET = 1000
SIZE_BUDGET_BYTES = 3_000_000


def alibi_lines_executed(fn):
    """`fn()`'s result and the number of lines of code under alibi/ it executed (line events, one per line run)."""
    package = str(Path(alibi.__file__).parent) + os.sep
    lines = 0

    def local(frame, event, arg):
        nonlocal lines
        if event == "line":
            lines += 1
        return local

    def on_call(frame, event, arg):
        return local if frame.f_code.co_filename.startswith(package) else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        result = fn()
    finally:
        sys.settrace(previous)
    return result, lines


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


def test_a_folder_no_manifest_covers_is_refused_naming_its_json_and_nothing_is_written(fired_run, tmp_path, capsys):
    plain = tmp_path / "plain" / "report"
    plain.mkdir(parents=True)
    shutil.copy(fired_run / "report.json", plain / "report.json")
    main_one_line(capsys, ["report", "html", str(tmp_path / "plain")], str(plain / "report.json"),
                  "no manifest.json covers it")
    assert sorted(p.name for p in plain.iterdir()) == ["report.json"] and not (tmp_path / "plain.report.html").exists()


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
    assert doc["schema"] in (Report.SCHEMA, *Report.READS)  # a schema the page reads: only the change below refuses
    (folder / "report.json").write_text(json.dumps({**doc, "schema": "alibi.conform/v0"}), encoding="utf-8")
    write_manifest(folder, "report", build_predicate())  # its manifest vouches for it: only the schema is wrong
    assert main(["report", "html", str(folder)]) == 2
    assert "alibi.conform/v0" in capsys.readouterr().err and not (tmp_path / "odd.report.html").exists()


def test_the_committed_h200_default_run_renders_beside_its_pinned_folder(tmp_path):
    copy = tmp_path / "conform-default"
    shutil.copytree(H200 / "conform-default", copy)
    assert verify_files(copy) == []
    assert main(["report", "html", str(copy)]) == 0
    page = (tmp_path / "conform-default.report.html").read_text(encoding="utf-8")
    assert "<code>cutlass</code> vs <code>triton</code>" in page and verify_files(copy) == []


def test_the_420_unit_layer_study_renders_within_its_work_and_size_budgets():
    page, lines = alibi_lines_executed(lambda: render_folder(H200 / "smollm2-layer-verification"))
    size = len(page.html.encode("utf-8"))
    assert page.html.count('<td class="name mono">') == UNITS // 2  # every tile, each with both regimes in its row
    assert size < SIZE_BUDGET_BYTES, size
    assert 0 < lines <= LINES_PER_UNIT_BUDGET * UNITS, f"{lines} lines of alibi code, {lines / UNITS:.0f} per unit"
