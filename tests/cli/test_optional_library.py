"""A command that needs an optional library says so in one line before it computes anything (issue 36 item 7)."""

from __future__ import annotations

import importlib.util

import pytest

from alibi.cli import main


@pytest.fixture
def no_sklearn(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sklearn" else real(name, *a))


def test_replay_of_both_arms_without_scikit_learn_stops_at_once_in_one_line_naming_the_install(
        no_sklearn, tmp_path, capsys):
    code = main(["replay", "teacher-forced", "--model", str(tmp_path / "no-model"), "--prompts", str(tmp_path / "p"),
                 "--kernel-a", "torch-cpu", "--kernel-b", "emulator:a_then_w", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "needs scikit-learn" in err and "integer-alibi[analysis]" in err
    assert not (tmp_path / "out").exists()


def test_analyze_flips_without_scikit_learn_stops_in_one_line(no_sklearn, tmp_path, capsys):
    code = main(["analyze", "flips", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "needs scikit-learn" in err and len(err.splitlines()) == 1
