"""Run the pair form's arms in this process (a preload of tests/kill_harness.py, or applied by a test).

`alibi replay teacher-forced --kernel-a A --kernel-b B` starts each arm as a fresh `python -m alibi`
process. A kill test counts the commits of one process only, so for the pair's kill test its arms run
here instead, through the same `alibi.cli.main` with the same argv: every write of the arms (their
records and manifests, the renames of their folders) is then one of the kill points too, and both arms
share this process's source digest (two processes started while someone edits the checkout may not)."""

from __future__ import annotations


def run_child_inprocess(argv, what, cwd=None):
    from alibi.cli import main

    assert argv[1:3] == ["-m", "alibi"] and cwd is None, argv
    return main(list(argv[3:]))


def install() -> None:
    import alibi.tokens.teacher_forced as tf

    tf.run_child = run_child_inprocess


if __name__ != "__main__":  # imported as the harness's preload
    import sys

    if "kill_harness" in sys.modules.get("__main__", sys).__dict__.get("__file__", ""):
        install()
