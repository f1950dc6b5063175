"""Kills during `alibi replay teacher-forced`, and what the next run of the documented command does (issue 26).

tests/kill_harness.py (the one kill mechanism, see its docstring) kills the command just before each
call of `alibi.io.atomic`'s two commit primitives and once after the last: every state a SIGKILL can
leave. For each state, `--out` must hold the old replay byte for byte (or still be absent) or the
complete new one: records that read back, a manifest that verifies, the new span, and the lock
hash of the protocol it ran under. The documented recovery (docs/replay.md) is to run the same
command again (with `--overwrite` where an earlier replay is in place): from the whole killed
state — output *and* the hidden stages with their dead pids, put back — it must leave the complete
new output and no stage. The pair form (`--kernel-a/--kernel-b`, each arm a fresh process) is
killed at each of its own commits (the flip analysis, the folder's manifest, the rename)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from test_kill import judge, kill_everywhere, rerun_removes_every_stage, stages_left

from alibi.cli import main
from alibi.governance import prereg
from alibi.governance.manifest import read_manifest, verify_files
from alibi.tokens.records import read_records

from .conftest import needs_model_extra

PRELOAD = ("alibi.tokens.teacher_forced", "alibi.tokens.setup", "alibi.model.runner", "alibi.model.prompts",
           "alibi.tokens.flips", "transformers")


def _protocol(tmp_path: Path) -> Path:
    folder = tmp_path / "protocol"
    prereg.init(folder)
    prereg.lock(folder)
    return folder


def _argv(tiny: Path, out: Path, *extra: str, kernel=("--kernel", "torch-cpu")) -> list[str]:
    return ["replay", "teacher-forced", "--model", str(tiny / "w8a8"), "--prompts", str(tiny / "set"), *kernel,
            "--context", "20", "--quiet", "--out", str(out), *extra]


def _complete_arm(path: Path, windows: int, protocol: Path | None) -> bool:
    """A whole new arm folder: exactly records.json and manifest.json, verified, of the new span and protocol."""
    if not path.is_dir() or {p.name for p in path.iterdir()} != {"records.json", "manifest.json"}:
        return False
    if verify_files(path) != []:
        return False
    predicate = read_manifest(path).predicate
    want = None if protocol is None else prereg.require_locked(protocol).as_dict()
    arm = read_records(path)
    return (predicate["protocol"] == want and len(arm.windows) == windows
            and len(arm.records) == windows * arm.positions and predicate["parameters"]["windows"] == list(range(windows)))


@needs_model_extra
def test_a_fresh_teacher_forced_arm_killed_at_any_write_leaves_nothing_or_the_complete_arm(tiny, tmp_path):
    protocol = _protocol(tmp_path)
    out = tmp_path / "arm"
    argv = _argv(tiny, out, "--windows", "2", "--prereg", str(protocol))
    states = kill_everywhere(tmp_path, argv, out, None, preload=PRELOAD, keep_stages=True)
    # records.json and manifest.json inside the stage, then the stage's rename: three kill points and the run
    assert len(states) == 4
    seen = judge(states, None, lambda p: _complete_arm(p, 2, protocol))
    assert seen == {"old": 3, "new": 1}
    assert stages_left(states) == 1  # a kill inside the stage leaves it; the same command again removes it:
    assert rerun_removes_every_stage(states, out, argv, lambda p: _complete_arm(p, 2, protocol)) == 3


@needs_model_extra
def test_an_overwriting_teacher_forced_arm_killed_at_any_write_leaves_the_old_arm_or_the_new_one(tiny, tmp_path):
    """The old state is an earlier replay (1 window, no protocol); the new one has 2 windows and a protocol.
    `--overwrite` swaps the complete stage with the old folder in one exchange."""
    protocol = _protocol(tmp_path)
    old, out = tmp_path / "old-arm", tmp_path / "arm"
    assert main(_argv(tiny, old, "--windows", "1")) == 0
    assert _complete_arm(old, 1, None)
    argv = _argv(tiny, out, "--windows", "2", "--prereg", str(protocol), "--overwrite")
    states = kill_everywhere(tmp_path, argv, out, old, preload=PRELOAD, keep_stages=True)
    assert len(states) == 4  # two files in the stage, the exchange, the completed run
    seen = judge(states, old, lambda p: _complete_arm(p, 2, protocol))
    assert seen == {"old": 3, "new": 1}
    assert rerun_removes_every_stage(states, out, argv, lambda p: _complete_arm(p, 2, protocol)) >= 2


@needs_model_extra
def test_a_teacher_forced_pair_killed_at_any_write_leaves_nothing_or_the_complete_pair(tiny, tmp_path, monkeypatch):
    """The pair folder is staged whole: arm a, arm b (each staged inside it), the flip analysis (staged
    inside it too), the folder's manifest, then one rename. Its arms run in the killed process here
    (tests/inprocess_arms.py), so every one of those writes is a kill point. Every state is no folder or
    the complete pair, each of whose manifests verifies and records the protocol's lock."""
    protocol = _protocol(tmp_path)
    out = tmp_path / "pair"
    argv = _argv(tiny, out, "--windows", "1", "--prereg", str(protocol),
                 kernel=("--kernel-a", "torch-cpu", "--kernel-b", "emulator:w_then_a"))
    record = prereg.require_locked(protocol).as_dict()

    def complete(path: Path) -> bool:
        if not path.is_dir() or {p.name for p in path.iterdir()} != {"arm-a", "arm-b", "flips", "manifest.json"}:
            return False
        if not (_complete_arm(path / "arm-a", 1, protocol) and _complete_arm(path / "arm-b", 1, protocol)):
            return False
        return (verify_files(path) == [] and verify_files(path / "flips") == []
                and read_manifest(path).predicate["protocol"] == record
                and read_manifest(path).predicate["arms"]["a"]["kernel"] == "torch-cpu")

    states = kill_everywhere(tmp_path, argv, out, None, preload=(*PRELOAD, "inprocess_arms"), keep_stages=True)
    # 2 × (records, manifest, rename) for the arms, the flip analysis's files and the rename of its folder,
    # the pair's manifest, the rename of the pair: 12 kill points, and the completed run
    assert len(states) >= 13
    seen = judge(states, None, complete)
    assert seen == {"old": len(states) - 1, "new": 1}
    assert stages_left(states) >= 1
    # the same command again, from each killed state with its stages put back, leaves the pair and no stage
    import inprocess_arms

    import alibi.tokens.teacher_forced as tf

    monkeypatch.setattr(tf, "run_child", inprocess_arms.run_child_inprocess)
    assert rerun_removes_every_stage(states, out, argv, complete) == len(states) - 1
