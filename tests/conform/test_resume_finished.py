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


# --- --resume with no plan: a named fallback to a fresh start, one line on stderr -------------------------

def _experiment(tmp_path, kernels=("emulator:w_then_a", "emulator:a_then_w")):
    import yaml

    exp = tmp_path / "e.yaml"
    exp.write_text(yaml.safe_dump({"name": "fallback", "kernels": {"a": kernels[0], "b": kernels[1]},
                                   "source": {"synthetic": {"preset": "tiny"}}, "scales": ["real"]}))
    return exp


def _fallback_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "--resume fallback" in line]


def test_run_resume_with_no_run_folder_falls_back_to_a_fresh_run_and_says_so_on_one_line(tmp_path, capsys):
    """Issue 26: `alibi run --resume` where no run folder (and so no plan, run.json) was ever written starts
    afresh, as conform does, and names that fallback on exactly one stderr line; the result is the complete
    run, byte-equal to a straight run's files but for the manifest's timestamp."""
    exp = _experiment(tmp_path)
    straight, out = tmp_path / "straight", tmp_path / "run"
    assert main(["run", str(exp), "--out", str(straight), "--quiet"]) == 0
    assert _fallback_lines(capsys.readouterr().err) == []  # no notice without --resume
    assert main(["run", str(exp), "--out", str(out), "--quiet", "--resume"]) == 0
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1, err  # --quiet: the notice is the only stderr line
    assert err[0].startswith("alibi run: --resume fallback: no run to continue in ") and str(out) in err[0]
    assert err[0].endswith("starting afresh") and "run.json" in err[0]
    assert "units: 2 computed" in captured.out  # both units computed now: nothing came from disk
    want = {p.relative_to(straight).as_posix(): p.read_bytes() for p in straight.rglob("*") if p.is_file()}
    got = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert set(got) == set(want) and all(got[k] == want[k] for k in want if k != "manifest.json")


def test_run_resume_into_an_empty_folder_falls_back_too_and_a_real_resume_says_nothing(tmp_path, capsys):
    exp = _experiment(tmp_path)
    out = tmp_path / "run"
    out.mkdir()  # e.g. made by hand or by a tool before the run: no plan in it
    assert main(["run", str(exp), "--out", str(out), "--quiet", "--resume"]) == 0
    assert len(_fallback_lines(capsys.readouterr().err)) == 1
    assert (out / "run.json").is_file() and (out / "manifest.json").is_file()
    assert main(["run", str(exp), "--out", str(out), "--quiet", "--resume"]) == 0  # a plan is there now
    captured = capsys.readouterr()
    assert _fallback_lines(captured.err) == [] and "were already complete" in captured.out


def test_run_resume_fallback_with_a_bad_input_prints_only_the_error(tmp_path, capsys):
    """The notice comes once every input is checked: a bad kernel with --resume and no run folder is one
    line (the error), exit 2, and nothing is written."""
    exp = _experiment(tmp_path, kernels=("emulator:w_then_a", "no-such-kernel"))
    out = tmp_path / "run"
    assert main(["run", str(exp), "--out", str(out), "--quiet", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--resume fallback" not in err[0] and "no-such-kernel" in err[0], err
    assert not out.exists()


def test_conform_resume_with_no_plan_names_the_fallback_on_one_line(tmp_path, capsys):
    out = tmp_path / "report"
    assert main([*ARGV, "--out", str(out), "--resume"]) == 0
    lines = _fallback_lines(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith("alibi conform: --resume fallback: no unfinished run beside")
    assert lines[0].endswith("starting afresh") and (out / "report.json").is_file()
