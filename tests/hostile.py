"""Helpers for the hostile-input tests: run `alibi` in a child process under a memory limit or as
another user, and check that it answered with the promised one-line error."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NOBODY = 65534


def run_alibi(args: list[str], *, memory_limit: int | None = None, env: dict[str, str] | None = None,
              cwd: str | os.PathLike | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m alibi ARGS` in a child process; `memory_limit` caps its address space (RLIMIT_AS, bytes)."""

    def limit() -> None:
        if memory_limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    return subprocess.run([sys.executable, "-m", "alibi", *args], check=False, cwd=cwd or REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, preexec_fn=limit,
                          timeout=timeout)


def run_python(code: str, *, memory_limit: int | None = None, timeout: float = 300,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -c CODE` in a child process, optionally under an address-space limit."""

    def limit() -> None:
        if memory_limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    return subprocess.run([sys.executable, "-c", code], check=False, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, preexec_fn=limit)


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str, code: int = 2) -> str:
    """The child exited with `code` and printed exactly one line, `alibi: error: …`, containing `fragments`."""
    err = proc.stderr
    assert proc.returncode == code, f"exit {proc.returncode}, stderr:\n{err}"
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("alibi: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def world_readable_dir() -> Path:
    """A fresh folder that another user can enter (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="alibi-hostile-"))
    os.chmod(path, 0o755)
    return path


GIB = 2**30


def main_one_line(capsys, args: list[str], *fragments: str, code: int = 2) -> str:
    """`alibi.cli.main(args)` in this process: it returned `code` and printed one `alibi: error:` line."""
    from alibi.cli import main

    capsys.readouterr()
    assert main(args) == code
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("alibi: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]
