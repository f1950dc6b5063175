"""`conform --resume` on a folder whose run finished: like `run --resume`, it succeeds (exit 0), and it says
what it does: there is nothing to continue, the report is computed afresh and replaces the finished one."""

from __future__ import annotations

import json

from alibi.cli import main

ARGV = ["conform", "--kernel-a", "emulator:w_then_a", "--kernel-b", "emulator:a_then_w", "--synthetic", "tiny",
        "--scales", "real", "--quiet"]


def test_resume_on_a_finished_report_exits_0_and_says_the_finished_report_is_replaced(tmp_path, capsys):
    out = tmp_path / "report"
    assert main([*ARGV, "--out", str(out)]) == 0
    capsys.readouterr()
    assert main([*ARGV, "--out", str(out), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "it holds a finished report, which the new one replaces" in err and "starting afresh" in err
    assert json.loads((out / "report.json").read_text())["verdict"] == "pass"
