"""`alibi analyze flips`: the command, its exit codes, and bad input (one line, nothing written)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from alibi.cli import main
from alibi.governance.manifest import read_manifest, write_manifest

from .builders import (
    KERNEL_A,
    KERNEL_B,
    inputs,
    record,
    records_from,
    write_arm,
    write_pair,
)

MARGINS = [[0.1, 2.0, 5.0, 0.3, 1.1], [4.0, 0.2, 3.0, 6.0, 0.9]]
FLIPS = [[True, False, False, False, True], [False, True, False, False, False]]


def _run(capsys, *args: str) -> tuple[int, list[str]]:
    code = main(["analyze", "flips", *map(str, args), "--quiet"])
    return code, capsys.readouterr().err.strip().splitlines()


def test_the_command_writes_the_folder_and_prints_a_summary(tmp_path, capsys):
    a, b = write_pair(tmp_path, MARGINS, FLIPS)
    code = main(["analyze", "flips", str(a), str(b), "--out", str(tmp_path / "out"), "--bootstrap", "100",
                 "--seed", "5"])
    captured = capsys.readouterr()
    assert code == 0
    assert "flips 3 (rate 0.3)" in captured.out and "identity alibi-manifest: verified" in captured.out
    assert "AUC bootstrap" in captured.err  # progress goes to stderr, not into machine-readable output
    doc = json.loads((tmp_path / "out" / "flips.json").read_text())
    assert (doc["seed"], doc["bootstrap"], doc["n_flips"]) == (5, 100, 3)


def _arm_pair(tmp_path: Path, records_a, records_b, **kw) -> tuple[Path, Path]:
    ins = inputs(tmp_path / "in")
    return (write_arm(tmp_path / "a", records_a, kernel=KERNEL_A, arm="a", inputs=ins, **kw),
            write_arm(tmp_path / "b", records_b, kernel=KERNEL_B, arm="b", inputs=ins, **kw))


def test_a_duplicate_key_fails_closed_naming_the_key(tmp_path, capsys):
    recs = records_from(MARGINS, FLIPS, arm="a")
    a, b = _arm_pair(tmp_path, [*recs, recs[6]], records_from(MARGINS, FLIPS, arm="b"), positions=5)
    code, err = _run(capsys, a, b, "--out", tmp_path / "out")
    assert code == 2 and len(err) == 1
    assert "the key (window 1, position 5) occurs twice" in err[0] and str(a / "records.json") in err[0]
    assert not (tmp_path / "out").exists()


def test_arms_from_different_checkpoints_exit_1_naming_the_field(tmp_path, capsys):
    a = write_arm(tmp_path / "a", records_from(MARGINS, FLIPS, arm="a"), kernel=KERNEL_A, arm="a",
                  inputs=inputs(tmp_path / "in-a"))
    b = write_arm(tmp_path / "b", records_from(MARGINS, FLIPS, arm="b"), kernel=KERNEL_B, arm="b",
                  inputs=inputs(tmp_path / "in-b", checkpoint=b"the pow2 checkpoint"))
    code, err = _run(capsys, a, b, "--out", tmp_path / "out")
    assert code == 1 and len(err) == 1
    assert "field predicate.inputs.checkpoint.digest.sha256 differs" in err[0] and "--allow-unverified" in err[0]
    assert not (tmp_path / "out").exists()


def test_arms_from_different_prompt_sets_exit_1_naming_the_field(tmp_path, capsys):
    a = write_arm(tmp_path / "a", records_from(MARGINS, FLIPS, arm="a"), kernel=KERNEL_A, arm="a",
                  inputs=inputs(tmp_path / "in-a"))
    b = write_arm(tmp_path / "b", records_from(MARGINS, FLIPS, arm="b"), kernel=KERNEL_B, arm="b",
                  inputs=inputs(tmp_path / "in-b", prompts=b'{"window": 1}\n'))
    code, err = _run(capsys, a, b, "--out", tmp_path / "out")
    assert code == 1 and "field predicate.inputs.prompts.digest.sha256 differs" in err[0]


def test_allow_unverified_proceeds_and_embeds_the_identity_record(tmp_path, capsys):
    a = write_arm(tmp_path / "a", records_from(MARGINS, FLIPS, arm="a"), kernel=KERNEL_A, arm="a",
                  inputs=inputs(tmp_path / "in-a"))
    b = write_arm(tmp_path / "b", records_from(MARGINS, FLIPS, arm="b"), kernel=KERNEL_B, arm="b",
                  inputs=inputs(tmp_path / "in-b", checkpoint=b"other"))
    code, _ = _run(capsys, a, b, "--out", tmp_path / "out", "--allow-unverified", "--bootstrap", "20")
    assert code == 0
    identity = json.loads((tmp_path / "out" / "flips.json").read_text())["identity"]
    assert identity["allow_unverified"] is True and identity["verified"] is False
    assert identity["record"]["contract"] == "alibi-identity/v1"
    assert any("inputs.checkpoint" in p for p in identity["record"]["problems"])


def _replace_records(arm: Path, text: str, *, pinned: bool = True) -> None:
    """Replace an arm's records; `pinned`: as a damaged writer would leave them, its manifest pinning the damaged
    bytes (so the reader's own checks must catch it), else edited afterwards (its manifest refuses it first)."""
    (arm / "records.json").write_text(text)
    if pinned:
        m = read_manifest(arm)
        write_manifest(arm, m.kind, m.predicate)


@pytest.mark.parametrize("damage, message", [
    (lambda text: "", "the records file is empty"),
    (lambda text: text[: len(text) // 2], "not valid JSON"),
    (lambda text: text.replace('"margin": 2.0', '"margin": NaN', 1), "not valid JSON (NaN is not JSON)"),
    (lambda text: text.replace('"margin": 2.0', '"margin": Infinity', 1), "not valid JSON (Infinity is not JSON)"),
    (lambda text: text.replace('"window": 1', '"window": 9', 1), "window index 9 is out of range"),
    (lambda text: text.replace('"margin": 2.0', '"margin": -2.0', 1), "margin -2.0 is negative"),
])
@pytest.mark.parametrize("pinned", [True, False])
def test_a_damaged_records_file_gives_one_line_exit_2_and_writes_nothing(tmp_path, capsys, damage, message, pinned):
    a, b = write_pair(tmp_path, MARGINS, FLIPS)
    original = (b / "records.json").read_text()
    _replace_records(b, damage(original), pinned=pinned)
    message = message if pinned else "fails its manifest"  # issue 36 #1: a changed arm is refused before it is read
    before = {p.name: p.read_bytes() for p in b.iterdir()}
    code, err = _run(capsys, a, b, "--out", tmp_path / "out")
    assert code == 2 and len(err) == 1 and err[0].startswith("alibi: error: ")
    assert message in err[0] and str(b / "records.json") in err[0]
    assert not (tmp_path / "out").exists()
    assert {p.name: p.read_bytes() for p in b.iterdir()} == before  # the input is untouched


def test_arms_that_saw_different_text_at_a_joined_position_are_refused(tmp_path, capsys):
    recs_b = records_from(MARGINS, FLIPS, arm="b")
    recs_b[3] = record(0, 7, recs_b[3].top1_id, recs_b[3].margin, forced=6)
    a, b = _arm_pair(tmp_path, records_from(MARGINS, FLIPS, arm="a"), recs_b)
    code, err = _run(capsys, a, b, "--out", tmp_path / "out")
    assert code == 2 and "disagree at (window 0, position 7): forced_id is 5 in A and 6 in B" in err[0]
    recs_b = records_from(MARGINS, FLIPS, arm="b")
    recs_b[0] = record(0, 4, recs_b[0].top1_id, recs_b[0].margin, sha="f" * 64)
    a, b = _arm_pair(tmp_path / "sha", records_from(MARGINS, FLIPS, arm="a"), recs_b)
    code, err = _run(capsys, a, b, "--out", tmp_path / "out")
    assert code == 2 and "prompt_sha256 is" in err[0]
    assert not (tmp_path / "out").exists()


def test_arms_without_a_shared_position_are_refused(tmp_path, capsys):
    recs_b = [record(w + 2, p, 5, 1.0) for w in range(2) for p in range(4, 9)]
    a, b = _arm_pair(tmp_path, records_from(MARGINS, FLIPS, arm="a"), recs_b)
    code, err = _run(capsys, a, b, "--out", tmp_path / "out")
    assert code == 2 and "share no scored position" in err[0]


@pytest.mark.parametrize("args, message", [
    (["--bootstrap", "0"], "--bootstrap must be a positive number"),
    (["--seed", "-1"], "--seed must be a non-negative integer"),
])
def test_bad_parameters_exit_2(tmp_path, capsys, args, message):
    a, b = write_pair(tmp_path, MARGINS, FLIPS)
    code, err = _run(capsys, a, b, "--out", tmp_path / "out", *args)
    assert code == 2 and message in err[0]


def test_a_missing_arm_or_an_arm_folder_without_a_manifest_exits_2(tmp_path, capsys):
    a, b = write_pair(tmp_path, MARGINS, FLIPS)
    code, err = _run(capsys, a, tmp_path / "nope", "--out", tmp_path / "out")
    assert code == 2 and "no such arm folder or records file" in err[0]
    (b / "manifest.json").unlink()
    code, err = _run(capsys, a, b, "--out", tmp_path / "out")
    assert code == 2 and f"{b / 'records.json'}: no manifest.json covers it" in err[0]


def test_the_console_script_exits_1_on_an_identity_violation(tmp_path):
    a = write_arm(tmp_path / "a", records_from(MARGINS, FLIPS, arm="a"), kernel=KERNEL_A, arm="a",
                  inputs=inputs(tmp_path / "in-a"))
    b = write_arm(tmp_path / "b", records_from(MARGINS, FLIPS, arm="b"), kernel=KERNEL_B, arm="b",
                  inputs=inputs(tmp_path / "in-b", checkpoint=b"x"))
    proc = subprocess.run([sys.executable, "-m", "alibi", "analyze", "flips", str(a), str(b), "--out",
                           str(tmp_path / "out")], check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "inputs.checkpoint" in proc.stderr
