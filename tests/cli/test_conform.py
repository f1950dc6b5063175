"""`alibi conform --out`: never inside or equal to an input, staged as one folder, one-line errors."""

from __future__ import annotations

import json

import pytest
from hostile import main_one_line

from alibi.cli import main
from alibi.governance.manifest import build_predicate, read_manifest, verify_files, write_manifest
from alibi.tiles.synthetic import synthetic_tiles
from alibi.tiles.tile import save_tile

EMU = ["--kernel-a", "emulator:w_then_a", "--kernel-b", "emulator:a_then_w", "--quiet"]


@pytest.fixture
def capture(tmp_path):
    """A tiles folder with its own manifest, as `alibi capture` leaves one."""
    folder = tmp_path / "capture"
    folder.mkdir()
    for t in synthetic_tiles("tiny", seed=1):
        save_tile(t, folder / f"{t.name}.safetensors")
    write_manifest(folder, "capture", build_predicate())
    return folder


@pytest.mark.parametrize("where", ["same", "inside"])
def test_an_out_equal_to_or_inside_the_tiles_is_refused_and_the_capture_manifest_survives(capture, capsys, where):
    """Guards: `conform --out` equal to `--tiles` overwrote the capture's manifest.json."""
    before = (capture / "manifest.json").read_bytes()
    out = capture if where == "same" else capture / "report"
    main_one_line(capsys, ["conform", *EMU, "--tiles", str(capture), "--out", str(out)],
                  "the report folder overlaps --tiles")
    assert (capture / "manifest.json").read_bytes() == before and verify_files(capture) == []
    assert not (capture / "report").exists()


def test_a_folder_named_report_json_inside_out_is_refused_before_anything_is_written(tmp_path, capsys):
    """Guards: a folder named report.json inside --out crashed (IsADirectoryError) after report.md and
    junit.xml had been written."""
    out = tmp_path / "r"
    (out / "report.json").mkdir(parents=True)
    main_one_line(capsys, ["conform", *EMU, "--synthetic", "tiny", "--out", str(out)],
                  "holds 'report.json/', which alibi did not write")
    assert sorted(p.name for p in out.iterdir()) == ["report.json"] and (out / "report.json").is_dir()


def test_an_out_holding_other_files_is_refused_since_the_report_replaces_the_folder(tmp_path, capsys):
    out = tmp_path / "r"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    main_one_line(capsys, ["conform", *EMU, "--synthetic", "tiny", "--out", str(out)], "notes.txt")
    assert (out / "notes.txt").read_text() == "mine"


def test_a_second_report_into_the_same_out_replaces_the_first_whole(tmp_path):
    out = tmp_path / "r"
    assert main(["conform", *EMU, "--synthetic", "tiny", "--seed", "1", "--out", str(out)]) == 0
    assert main(["conform", *EMU, "--synthetic", "tiny", "--seed", "2", "--out", str(out)]) == 0
    assert json.loads((out / "report.json").read_text())["seed"] == 2
    assert read_manifest(out).predicate["seed"] == 2 and verify_files(out) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # no stage left beside it


def test_a_path_with_a_newline_or_an_escape_sequence_stays_on_one_line(tmp_path, capsys):
    """Guards: a path holding a newline split the error in two (or injected terminal escapes)."""
    bad = tmp_path / "evil\nalibi: error: fake\x1b[2J"
    line = main_one_line(capsys, ["conform", *EMU, "--tiles", str(bad), "--out", str(tmp_path / "r")],
                         "evil\\nalibi: error: fake\\x1b[2J")
    assert "\x1b" not in line


def test_the_report_records_the_cpu_model_and_its_int8_isa(tmp_path):
    """Issue 16: CPU results depend on the CPU; every result names it and its ISA flags."""
    from alibi.governance.environment import environment

    out = tmp_path / "r"
    assert main(["conform", *EMU, "--synthetic", "tiny", "--out", str(out)]) == 0
    env = json.loads((out / "report.json").read_text())["environment"]
    assert env["cpu"] == environment().cpu and env["cpu_isa"] == list(environment().cpu_isa)
    assert read_manifest(out).predicate["environment"]["cpu_isa"] == env["cpu_isa"]
