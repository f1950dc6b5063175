"""A new user's first hour with the CLI: fast --help/--version, one line on Ctrl-C, honest resume and bench messages."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from interrupts import sigint_as_at_a_terminal

from alibi.cli import COMMAND_MODULES, build_parser, main

REPO = Path(__file__).resolve().parents[2]


def _python(code: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          cwd=cwd or REPO, check=False, timeout=120)


@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_importing_a_command_module_does_not_import_torch(module):
    proc = _python(f"import importlib, sys; importlib.import_module({module!r}); "
                   "print(sorted(m for m in ('torch', 'triton', 'transformers', 'numpy') if m in sys.modules))")
    assert proc.returncode == 0, proc.stderr
    assert "torch" not in proc.stdout, f"{module} imports {proc.stdout.strip()} at top level"


def test_alibi_help_and_version_and_every_command_help_start_without_torch():
    commands = sorted(next(a for a in build_parser()._actions if a.dest == "command").choices)
    code = textwrap.dedent("""
        import contextlib, io, json, sys
        from alibi.cli import main
        seen = {}
        for argv in [["--version"], ["--help"]] + [[c, "--help"] for c in sys.argv[1:]]:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                try:
                    rc = main(argv)
                except SystemExit as exc:
                    rc = exc.code
            seen[" ".join(argv)] = [rc, "torch" in sys.modules, out.getvalue()[:200]]
        print(json.dumps(seen))
    """)
    proc = _python(code, *commands)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["--version"][0] == 0 and seen["--version"][2].startswith("alibi ")
    assert "conform" in seen["--help"][2] or "usage: alibi" in seen["--help"][2]
    for argv, (rc, torch_loaded, _) in seen.items():
        assert rc == 0, argv
        assert not torch_loaded, f"`alibi {argv}` imported torch"


def test_conform_help_names_only_presets_that_exist():
    from alibi.tiles.synthetic import DEFAULT_PRESET, PRESETS

    conform = next(a for a in build_parser()._actions if a.dest == "command").choices["conform"]
    synthetic = next(a for a in conform._actions if a.dest == "synthetic")
    named = synthetic.help.split("e.g. ", 1)[1].split(" (", 1)[0].split(", ")
    assert named and set(named) <= set(PRESETS)
    assert f"'{DEFAULT_PRESET}'" in conform.description


# --- Ctrl-C ------------------------------------------------------------------------------------------------

def _interrupt_after(argv: list[str], marker: str, cwd: Path) -> tuple[int, str]:
    """Start `alibi ARGV`, send SIGINT once stderr shows `marker`, return (exit code, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "alibi", *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=sigint_as_at_a_terminal)
    lines = []
    deadline = time.monotonic() + 300
    for line in proc.stderr:
        lines.append(line)
        if marker in line:
            proc.send_signal(signal.SIGINT)
            break
        assert time.monotonic() < deadline, "no progress line within 300 s"
    lines += proc.stderr.readlines()
    proc.wait(timeout=120)
    return proc.returncode, "".join(lines)


def _experiment(tmp_path: Path, out: Path) -> Path:
    exp = tmp_path / "interrupt-me.yaml"
    exp.write_text(textwrap.dedent(f"""
        name: interrupt-me
        kernels: {{a: "emulator:w_then_a", b: "emulator:a_then_w"}}
        source:
          synthetic: {{preset: smollm2-135m, rows: 512}}
        scales: [real, pow2]
        seed: 0
        out: {out}
    """))
    return exp


@pytest.mark.slow
def test_ctrl_c_during_run_prints_one_line_naming_the_kept_units_and_the_resume_command(tmp_path):
    out = tmp_path / "runs" / "interrupt-me"
    exp = _experiment(tmp_path, out)
    rc, err = _interrupt_after(["run", str(exp)], "[2/14]", tmp_path)
    assert rc == 130, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    # Issue 12: the units folder also holds the pipeline's plan.json, which is not a finished unit.
    kept = len([p for p in (out / "units").glob("0*.json")])  # not plan.json, not the ledger (issue 26)
    assert 2 <= kept < 14
    assert last == (f"alibi: interrupted (Ctrl-C): {kept} finished unit(s) kept in {out / 'units'}; "
                    f"continue with: alibi run {exp} --resume")
    resumed = subprocess.run([sys.executable, "-m", "alibi", "run", str(exp), "--resume", "--quiet"], cwd=tmp_path,
                             capture_output=True, text=True, check=False,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    assert resumed.returncode == 0, resumed.stderr
    assert f"units: {14 - kept} computed now, {kept} kept from the interrupted run" in resumed.stdout


@pytest.mark.slow
def test_ctrl_c_during_conform_leaves_no_report_and_names_the_kept_units_and_resume(tmp_path):
    """Issue 12: the finished units stay in the hidden units folder beside --out, for --resume."""
    out = tmp_path / "report"
    rc, err = _interrupt_after(["conform", "--kernel-a", "emulator:w_then_a", "--kernel-b", "emulator:a_then_w",
                                "--synthetic", "smollm2-135m-full", "--out", str(out)], "[1/420]", tmp_path)
    assert rc == 130, err
    assert "Traceback" not in err
    units = tmp_path / ".report.units"
    kept = len([p for p in units.glob("0*.json")])  # not plan.json, not the ledger (issue 26)
    assert kept >= 1
    assert err.strip().splitlines()[-1] == (f"alibi: interrupted (Ctrl-C): no report was written to {out}; {kept} "
                                            f"finished unit(s) kept in {units}; continue with the same command and "
                                            "--resume (without it the run starts afresh)")
    assert not out.exists()


def test_keyboard_interrupt_in_any_command_exits_130_with_one_line(monkeypatch, capsys):
    import alibi.cli.kernels as kernels_cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(kernels_cli, "list_kernels", interrupted)
    assert main(["kernels"]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("alibi: interrupted (Ctrl-C): nothing was written")


# --- resume on a finished run -------------------------------------------------------------------------------

def test_resume_on_a_finished_run_says_it_was_already_complete(tmp_path, capsys):
    exp = tmp_path / "small.yaml"
    exp.write_text(textwrap.dedent(f"""
        name: small
        kernels: {{a: "emulator:w_then_a", b: "emulator:a_then_w"}}
        source:
          synthetic: {{preset: tiny}}
        out: {tmp_path / "run"}
    """))
    assert main(["run", str(exp), "--quiet"]) == 0
    assert "units: 4 computed\n" in capsys.readouterr().out
    assert main(["run", str(exp), "--resume", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "units: all 4 were already complete (nothing computed)" in out
    assert "interrupted" not in out


# --- bench without CUDA -------------------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour of a machine without a GPU")
def test_bench_without_cuda_prints_one_line_exits_3_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--out", str(out)]) == 3
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert "needs a CUDA GPU" in captured.err and "nothing was measured or written" in captured.err
    assert not out.exists() and list(tmp_path.iterdir()) == []
