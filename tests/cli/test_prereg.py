"""`alibi prereg verify|evaluate` on hostile protocol folders."""

from __future__ import annotations

import pytest
from hostile import main_one_line

from alibi.cli import main
from alibi.governance import prereg

DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.fixture
def locked(tmp_path):
    folder = tmp_path / "prereg" / "study"
    prereg.init(folder)
    prereg.lock(folder)
    return folder


@pytest.mark.parametrize("record", ["lock.json", "amendments.jsonl"])
def test_a_deeply_nested_record_is_a_fail_line_and_exit_1(locked, capsys, record):
    """Guards: json.loads raised RecursionError (a traceback) on a deeply nested lock.json or log entry."""
    (locked / record).write_bytes(DEEP + (b"\n" if record.endswith("jsonl") else b""))
    capsys.readouterr()
    assert main(["prereg", "verify", str(locked)]) == 1
    out = capsys.readouterr()
    fails = [line for line in out.out.splitlines() if line.startswith("FAIL ")]
    assert any(record in line and "not valid JSON" in line for line in fails), out.out
    assert out.err == ""


def test_a_file_name_with_a_newline_in_a_protocol_folder_is_reported_on_one_line(locked, capsys):
    (locked / "evil\nFAIL nothing").write_text("x")
    capsys.readouterr()
    assert main(["prereg", "verify", str(locked)]) == 1
    out = capsys.readouterr().out
    assert "evil\\nFAIL nothing: added without an amendment" in out
    assert [line for line in out.splitlines() if line.startswith("FAIL ")] == [
        line for line in out.splitlines() if "FAIL " in line]  # no line was injected


def test_evaluate_refuses_to_write_its_result_into_the_protocol_folder(locked, tmp_path, capsys):
    result = tmp_path / "report.json"
    result.write_text('{"verdict": "pass"}')
    main_one_line(capsys, ["prereg", "evaluate", str(locked), "--result", f"report={result}",
                           "--out", str(locked / "criteria.json")], "--out overlaps the protocol folder")
    assert prereg.verify(locked) == []
