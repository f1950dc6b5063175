"""`alibi manifest` and `alibi prereg` from the command line: exit codes and messages naming the field."""

from __future__ import annotations

import json

from alibi.cli import main
from alibi.governance.manifest import build_predicate, treatment_of, write_manifest
from alibi.kernels.registry import get_kernel


def _arm(folder, kernel, arm):
    folder.mkdir()
    (folder / "out.bin").write_bytes(arm.encode())
    return write_manifest(folder, "capture", build_predicate(seed=0, treatment=treatment_of(get_kernel(kernel), arm)))


def test_manifest_verify_passes_two_arms_that_differ_only_in_the_kernel(tmp_path, capsys):
    a = _arm(tmp_path / "a", "emulator:w_then_a", "a")
    b = _arm(tmp_path / "b", "emulator:a_then_w", "b")
    assert main(["manifest", "verify", str(a.parent), str(b), "--treatment", "kernel"]) == 0
    assert "identity holds" in capsys.readouterr().out


def test_manifest_verify_exits_1_naming_the_field_that_differs(tmp_path, capsys):
    a = _arm(tmp_path / "a", "emulator:w_then_a", "a")
    b = _arm(tmp_path / "b", "emulator:a_then_w", "b")
    statement = json.loads(b.read_text())
    statement["predicate"]["seed"] = 7
    b.write_text(json.dumps(statement, indent=2, sort_keys=True))
    assert main(["manifest", "verify", str(a), str(b)]) == 1
    assert "FAIL field predicate.seed differs: A=0, B=7" in capsys.readouterr().out


def test_manifest_verify_of_one_folder_exits_1_when_a_file_changed(tmp_path, capsys):
    a = _arm(tmp_path / "a", "emulator:w_then_a", "a")
    assert main(["manifest", "verify", str(a.parent)]) == 0
    (a.parent / "out.bin").write_bytes(b"edited")
    assert main(["manifest", "verify", str(a.parent)]) == 1
    assert "FAIL file out.bin: sha256 is" in capsys.readouterr().out


def test_manifest_write_pins_the_inputs_given(tmp_path, capsys):
    (tmp_path / "art").mkdir()
    (tmp_path / "art" / "x.txt").write_text("x")
    (tmp_path / "prompts.jsonl").write_text("{}\n")
    assert main(["manifest", "write", str(tmp_path / "art"), "--kind", "prompts",
                 "--input", f"prompts={tmp_path / 'prompts.jsonl'}", "--seed", "3"]) == 0
    predicate = json.loads((tmp_path / "art" / "manifest.json").read_text())["predicate"]
    assert predicate["seed"] == 3 and len(predicate["inputs"]["prompts"]["digest"]["sha256"]) == 64
    assert main(["manifest", "write", str(tmp_path / "art"), "--kind", "prompts", "--input", "nonsense"]) == 2


def test_prereg_commands_lock_amend_and_verify_a_protocol(tmp_path, capsys):
    folder = tmp_path / "prereg" / "study"
    assert main(["prereg", "init", str(folder)]) == 0
    assert main(["prereg", "verify", str(folder)]) == 1  # not locked yet
    assert main(["prereg", "lock", str(folder)]) == 0
    assert main(["prereg", "verify", str(folder)]) == 0
    (folder / "protocol.md").write_text("# changed\n")
    capsys.readouterr()
    assert main(["prereg", "verify", str(folder)]) == 1
    assert f"FAIL {folder / 'protocol.md'}: edited since the lock without an amendment" in capsys.readouterr().out
    assert main(["prereg", "status", str(folder)]) == 0
    assert "pending   modified protocol.md" in capsys.readouterr().out
    assert main(["prereg", "amend", str(folder), "--reason", "clarify the question"]) == 0
    assert main(["prereg", "verify", str(folder)]) == 0
    assert main(["prereg", "lock", str(folder)]) == 2  # already locked: bad usage
