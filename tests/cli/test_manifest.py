"""`alibi manifest write|verify` on hostile folders: deep JSON and malformed subjects are FAIL lines
(exit 1), a file name that is not UTF-8 is one line (exit 2); nothing is written on refusal."""

from __future__ import annotations

import json
import os

import pytest
from hostile import main_one_line

from alibi.cli import main
from alibi.governance.manifest import build_predicate, write_manifest

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture
def arm(tmp_path):
    def make(name: str) -> object:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "out.txt").write_text(name)
        write_manifest(folder, "report", build_predicate())
        return folder
    return make


def _fail_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("FAIL ")]


def test_verifying_a_deeply_nested_manifest_is_a_fail_line_and_exit_1(arm, capsys):
    """Guards: json.loads raised RecursionError (a traceback) on a 100,000-level manifest.json."""
    a = arm("a")
    (a / "manifest.json").write_text(DEEP)
    capsys.readouterr()
    assert main(["manifest", "verify", str(a)]) == 1
    out = capsys.readouterr()
    assert len(_fail_lines(out.out)) == 1 and "nested too deeply" in out.out and out.err == ""


@pytest.mark.parametrize("subject", [7, "out.txt", {"name": "out.txt"}, None])
def test_an_identity_check_against_a_manifest_whose_subject_is_not_a_list_fails_with_exit_1(arm, capsys, subject):
    """Guards: `manifest verify A B` iterated B's `subject` (an int: TypeError, a traceback)."""
    a, b = arm("a"), arm("b")
    statement = json.loads((b / "manifest.json").read_text())
    statement["subject"] = subject
    (b / "manifest.json").write_text(json.dumps(statement))
    capsys.readouterr()
    assert main(["manifest", "verify", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert any("B (" in line and "field subject is missing or not a list" in line for line in _fail_lines(out))
    assert "identity contract broken" in out


def test_an_identity_check_against_a_deeply_nested_manifest_fails_with_exit_1(arm, capsys):
    a, b = arm("a"), arm("b")
    (b / "manifest.json").write_text(DEEP)
    capsys.readouterr()
    assert main(["manifest", "verify", str(a), str(b)]) == 1
    assert "nested too deeply" in capsys.readouterr().out


def test_writing_a_manifest_over_a_file_name_that_is_not_utf8_is_one_line(tmp_path, capsys):
    """Guards: the name (a surrogate-escaped byte) reached json/UTF-8 encoding: UnicodeEncodeError."""
    folder = tmp_path / "art"
    folder.mkdir()
    (folder / "ok.txt").write_text("x")
    with open(os.path.join(os.fsencode(folder), b"caf\xe9.txt"), "wb") as fh:
        fh.write(b"latin-1 name")
    main_one_line(capsys, ["manifest", "write", str(folder), "--kind", "report"],
                  "caf\\xe9.txt: its name is not valid UTF-8")
    assert not (folder / "manifest.json").exists()


def test_writing_a_manifest_over_a_symlinked_folder_is_refused_naming_it(tmp_path, capsys):
    """Issue 26: os.walk does not descend into a linked folder, so its files were neither pinned nor refused
    (a linked file was refused). Linked folders are refused too: their files are not part of the folder."""
    folder, outside = tmp_path / "art", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    (outside / "elsewhere.txt").write_text("not in the folder")
    (folder / "ok.txt").write_text("x")
    (folder / "sub").symlink_to("../outside")
    main_one_line(capsys, ["manifest", "write", str(folder), "--kind", "report"],
                  "art/sub: is a symbolic link to a folder")
    assert not (folder / "manifest.json").exists()


def test_a_real_subfolder_is_pinned_file_by_file(tmp_path, capsys):
    folder = tmp_path / "art"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "inner.txt").write_text("x")
    assert main(["manifest", "write", str(folder), "--kind", "report"]) == 0
    assert [s["name"] for s in json.loads((folder / "manifest.json").read_text())["subject"]] == ["sub/inner.txt"]
