"""`alibi locate` compares only runs their manifests vouch for (issue 36 #1): a run changed after it was
written, one without its manifest, and an older run without logit digests are one line, exit 2, naming
the file; the untouched runs still compare as identical."""

from __future__ import annotations

import json

import pytest
from hostile import main_one_line
from tokens.conftest import needs_model_extra

from alibi.governance.manifest import read_manifest, write_manifest

KERNEL = "emulator:a_then_w"


@pytest.fixture(scope="module")
def two_runs(tiny, tmp_path_factory):
    """Two greedy runs of one request (batch 2 and batch 1): identical bit for bit."""
    from alibi.tokens import greedy

    root = tmp_path_factory.mktemp("locate")
    runs = [root / "run-1", root / "run-2"]
    for run, batch in zip(runs, (2, 1)):
        greedy.run_greedy_arm(tiny / "w8a8", tiny / "set", run, kernel=KERNEL, prompt_tokens=8, new_tokens=3,
                              windows=2, batch_size=batch)
    return runs


def _copy(run, tmp_path, name="copy"):
    import shutil

    return shutil.copytree(run, tmp_path / name)


@needs_model_extra
def test_locate_calls_two_untouched_runs_identical(two_runs, capsys):
    from alibi.cli import main

    assert main(["locate", str(two_runs[0]), str(two_runs[1])]) == 0
    assert "logit rows bitwise identical: 6/6" in capsys.readouterr().out


@needs_model_extra
def test_locate_refuses_a_run_whose_logit_digest_was_changed_after_it_was_written(two_runs, tmp_path, capsys):
    run = _copy(two_runs[1], tmp_path)
    doc = json.loads((run / "run.json").read_text())
    digest = doc["logit_digests"][0][0]
    doc["logit_digests"][0][0] = digest[:-1] + ("0" if digest[-1] != "0" else "1")
    (run / "run.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    main_one_line(capsys, ["locate", str(two_runs[0]), str(run)], str(run), "fails its manifest", "run.json")


@needs_model_extra
def test_locate_refuses_a_run_folder_without_its_manifest(two_runs, tmp_path, capsys):
    run = _copy(two_runs[1], tmp_path)
    (run / "manifest.json").unlink()
    main_one_line(capsys, ["locate", str(run), str(two_runs[0])], str(run), "no manifest.json covers it")


@needs_model_extra
def test_locate_refuses_an_older_run_without_logit_digests_instead_of_calling_it_identical(two_runs, tmp_path, capsys):
    run = _copy(two_runs[1], tmp_path)
    doc = json.loads((run / "run.json").read_text())
    del doc["logit_digests"]
    doc["schema"] = "alibi-greedy-run/v1"
    (run / "run.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    m = read_manifest(run)
    write_manifest(run, m.kind, m.predicate)  # an older run, its manifest intact: only the schema is old
    main_one_line(capsys, ["locate", str(two_runs[0]), str(run)], str(run / "run.json"),
                  "alibi-greedy-run/v1", "no logit digests")


@needs_model_extra
def test_locate_refuses_a_folder_whose_manifest_is_of_another_kind(two_runs, tmp_path, capsys):
    run = _copy(two_runs[1], tmp_path)
    m = read_manifest(run)
    write_manifest(run, "flip-analysis", m.predicate)
    main_one_line(capsys, ["locate", str(two_runs[0]), str(run)], str(run), "'flip-analysis' result")
