"""Kill a command at each of its commit points and keep what it left (run as a script by tests/test_kill.py).

alibi makes output visible only through two primitives of `alibi.io.atomic`: `_commit` (the one
`os.replace` that publishes a staged file or a new folder) and `exchange` (the one renameat2 that
swaps a complete staged folder with an existing one). A process killed at any instant has completed
some prefix of those calls, so killing it immediately before the 1st, 2nd, … k-th call — and once
after the last — reaches every state a SIGKILL can leave.

The harness imports everything first, then forks one child per kill point: the child counts calls
to the two primitives and `os._exit(137)`s (no cleanup, no `finally`, like SIGKILL) just before
call number k. Before each child the output is reset to the "old state"; after it, the output and
the names of the hidden staging entries beside it are copied to `SNAPSHOTS/<k>/` for the test to
judge. The loop ends with the first child that completes without reaching its kill point.

    python tests/kill_harness.py SPEC.json      # {"argv", "out", "old" (path or null), "snapshots", "cwd"}

With `"keep_stages": true` the staging entries themselves are copied to `SNAPSHOTS/<k>/stages/` too
(a killed process's stage keeps its dead pid in its name), so a test can put the whole killed state
back and check that the next run removes them: the harness itself clears them before each child,
so a re-run after the harness alone would find nothing to remove.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

KILLED = 137


def _reset(out: Path, old: Path | None) -> None:
    if out.is_dir() and not out.is_symlink():
        shutil.rmtree(out)
    elif out.exists() or out.is_symlink():
        out.unlink()
    for stale in out.parent.glob(f".{out.name}.*"):  # each kill point starts from the same state
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    if old is not None:
        (shutil.copytree if old.is_dir() else shutil.copy2)(old, out)


def _snapshot(out: Path, into: Path, keep_stages: bool = False) -> None:
    into.mkdir(parents=True)
    if out.is_dir():
        shutil.copytree(out, into / "out")
    elif out.exists():
        shutil.copy2(out, into / "out")
    stages = sorted(p.name for p in out.parent.glob(f".{out.name}.*"))
    (into / "stages.json").write_text(json.dumps(stages))
    if keep_stages:  # the stages themselves, so a test can restore the whole killed state and run again
        (into / "stages").mkdir()
        for name in stages:
            src = out.parent / name
            (shutil.copytree if src.is_dir() and not src.is_symlink() else shutil.copy2)(src, into / "stages" / name)


def _child(argv: list[str], kill_at: int) -> None:
    from alibi.cli import main
    from alibi.io import atomic

    calls = {"n": 0}

    def counted(fn):
        def wrapped(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == kill_at:
                os._exit(KILLED)
            return fn(*args, **kwargs)
        return wrapped

    atomic._commit = counted(atomic._commit)
    atomic.exchange = counted(atomic.exchange)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the child ends with os._exit
    code = main(argv)
    os._exit(100 + code)  # completed without reaching kill_at


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    os.chdir(spec["cwd"])
    out, snapshots = Path(spec["out"]), Path(spec["snapshots"])
    old = Path(spec["old"]) if spec["old"] else None
    import torch  # imported before forking, and single-threaded so a fork cannot inherit a busy pool

    torch.set_num_threads(1)
    import alibi.cli

    alibi.cli.build_parser()  # every command module, imported once
    for module in spec.get("preload", []):
        __import__(module)
    results = {}
    for kill_at in range(1, 200):
        _reset(out, old)
        pid = os.fork()
        if pid == 0:
            _child(spec["argv"], kill_at)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        _snapshot(out, snapshots / str(kill_at), spec.get("keep_stages", False))
        results[kill_at] = code
        if code != KILLED:
            break
    (snapshots / "results.json").write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
