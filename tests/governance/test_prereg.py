"""Pre-registration: lock, hash-chained amendments, and detection of every kind of tampering."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alibi.errors import InputError
from alibi.governance import prereg
from alibi.governance.prereg import ProtocolViolation


@pytest.fixture()
def locked(tmp_path) -> Path:
    folder = tmp_path / "prereg" / "study"
    prereg.init(folder)
    (folder / "predictions" / "layers.csv").write_text("layer,prediction\nq_proj,below-2^24\n")
    prereg.lock(folder)
    return folder


@pytest.fixture()
def amended(locked) -> Path:
    (locked / "analysis.yaml").write_text("scales: [real]\ntolerance_ulp: 1\n")
    prereg.amend(locked, "drop the pow2 regime: no pow2 checkpoint yet")
    (locked / "predictions" / "extra.csv").write_text("layer,prediction\n")
    (locked / "protocol.md").write_text(locked.joinpath("protocol.md").read_text() + "\nDeviation: extra list.\n")
    prereg.amend(locked, "add a second prediction list")
    return locked


def test_a_fresh_lock_verifies_and_pins_every_file(locked):
    assert prereg.verify(locked) == []
    lock = json.loads((locked / "lock.json").read_text())
    assert [f["path"] for f in lock["files"]] == ["analysis.yaml", "predictions/layers.csv", "protocol.md"]


def test_editing_a_locked_file_fails_verification_naming_the_file(locked):
    (locked / "protocol.md").write_text("# a different protocol\n")
    problems = prereg.verify(locked)
    assert problems == [f"{locked / 'protocol.md'}: edited since the lock without an amendment"]


def test_deleting_or_adding_a_file_fails_verification_naming_the_file(locked):
    (locked / "predictions" / "layers.csv").unlink()
    (locked / "notes.md").write_text("late idea\n")
    problems = prereg.verify(locked)
    assert f"{locked / 'notes.md'}: added without an amendment" in problems
    assert f"{locked / 'predictions/layers.csv'}: deleted after the lock without an amendment" in problems


def test_flipping_any_byte_of_the_lock_file_is_detected(locked):
    path = locked / "lock.json"
    original = path.read_bytes()
    for i in range(len(original)):
        tampered = bytearray(original)
        tampered[i] ^= 0x01
        path.write_bytes(bytes(tampered))
        assert prereg.verify(locked), f"flipping byte {i} of lock.json went unnoticed"
    path.write_bytes(original)
    assert prereg.verify(locked) == []


def test_flipping_any_byte_of_the_amendment_log_is_detected(amended):
    path = amended / "amendments.jsonl"
    original = path.read_bytes()
    assert prereg.verify(amended) == []
    for i in range(len(original)):
        tampered = bytearray(original)
        tampered[i] ^= 0x01
        path.write_bytes(bytes(tampered))
        assert prereg.verify(amended), f"flipping byte {i} of amendments.jsonl went unnoticed"


def test_reordering_the_locked_file_list_is_detected(locked):
    path = locked / "lock.json"
    lock = json.loads(path.read_text())
    lock["files"].reverse()
    path.write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n")
    assert any("reordered" in p for p in prereg.verify(locked))


def test_reordering_log_entries_is_detected(amended):
    path = amended / "amendments.jsonl"
    first, second = path.read_text().splitlines()
    path.write_text(f"{second}\n{first}\n")
    problems = prereg.verify(amended)
    assert any("entry 1: has seq 2" in p for p in problems)
    assert any("prev does not match" in p for p in problems)


def test_dropping_the_last_log_entry_is_detected(amended):
    path = amended / "amendments.jsonl"
    path.write_text(path.read_text().splitlines()[0] + "\n")
    problems = prereg.verify(amended)
    assert f"{amended / 'predictions/extra.csv'}: added without an amendment" in problems


def test_deleting_the_log_or_the_lock_is_detected(amended):
    (amended / "amendments.jsonl").unlink()
    assert any("analysis.yaml: edited since the lock" in p for p in prereg.verify(amended))
    (amended / "lock.json").unlink()
    assert any("not locked" in p for p in prereg.verify(amended))


def test_an_amendment_records_reason_time_changes_and_the_previous_hash(amended):
    entries = [json.loads(line) for line in (amended / "amendments.jsonl").read_text().splitlines()]
    st = prereg.state(amended)
    assert [e["seq"] for e in entries] == [1, 2]
    assert entries[0]["prev"] == st.lock_sha256
    assert entries[1]["prev"] == entries[0]["entry_sha256"] and st.head_sha256 == entries[1]["entry_sha256"]
    assert entries[0]["reason"] == "drop the pow2 regime: no pow2 checkpoint yet"
    assert entries[0]["time"].endswith("Z")
    assert [(c["path"], c["change"]) for c in entries[1]["changes"]] == [
        ("predictions/extra.csv", "added"), ("protocol.md", "modified")]
    assert entries[1]["changes"][0]["sha256"] == st.pinned["predictions/extra.csv"]
    assert prereg.verify(amended) == []


def test_an_amendment_without_changes_or_reason_is_refused(locked):
    with pytest.raises(InputError, match="no file changed since the last record"):
        prereg.amend(locked, "nothing really")
    (locked / "protocol.md").write_text("changed\n")
    with pytest.raises(InputError, match="needs a reason"):
        prereg.amend(locked, "  ")


def test_a_locked_protocol_cannot_be_locked_again(locked):
    with pytest.raises(InputError, match="already locked"):
        prereg.lock(locked)


def test_a_protocol_folder_needs_a_protocol_to_be_locked(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "predictions.csv").write_text("x\n")
    with pytest.raises(InputError, match="protocol.md: missing"):
        prereg.lock(tmp_path / "p")


def test_require_locked_returns_the_lock_and_head_hashes(amended):
    record = prereg.require_locked(amended)
    st = prereg.state(amended)
    assert record.as_dict() == {"folder": str(amended), "lock_sha256": st.lock_sha256,
                                "head_sha256": st.head_sha256, "amendments": 2}


def test_require_locked_fails_closed_when_a_file_changed_without_an_amendment(amended):
    (amended / "analysis.yaml").write_text("scales: [pow2]\n")
    with pytest.raises(ProtocolViolation, match=r"analysis.yaml: edited since amendment 1 without an amendment"):
        prereg.require_locked(amended)


def test_require_locked_fails_closed_on_an_unlocked_protocol(tmp_path):
    prereg.init(tmp_path / "draft")
    with pytest.raises(ProtocolViolation, match="not locked"):
        prereg.require_locked(tmp_path / "draft")


def test_init_refuses_a_folder_that_holds_anything(locked):
    with pytest.raises(InputError, match="already exists and is not empty"):
        prereg.init(locked)


def test_every_locked_protocol_in_the_repository_verifies():
    root = Path(__file__).resolve().parents[2] / "prereg"
    locked = [p for p in sorted(root.glob("*/")) if (p / prereg.LOCK_NAME).exists()] if root.is_dir() else []
    for folder in locked:
        assert prereg.verify(folder) == [], f"{folder} was changed without an amendment"


def test_a_locked_folder_holding_a_file_whose_name_is_not_utf8_fails_verification_with_exit_1(locked, capsys):
    """Issue 26: `prereg verify` exited 2 (bad input) on such a file; a file added to a locked folder is a
    verification failure (exit 1, a FAIL line naming it), whatever its name."""
    import os

    from alibi.cli import main

    with open(os.path.join(os.fsencode(locked), b"caf\xe9.md"), "wb") as fh:
        fh.write(b"added after the lock")
    capsys.readouterr()
    assert main(["prereg", "verify", str(locked)]) == 1
    out = capsys.readouterr().out
    fails = [line for line in out.splitlines() if line.startswith("FAIL ")]
    assert len(fails) == 1 and "caf\\xe9.md: added under a name that is not valid UTF-8" in fails[0], out
    with pytest.raises(ProtocolViolation, match="not valid UTF-8"):  # and nothing can amend it in
        prereg.amend(locked, "try to record it")


def test_locking_a_folder_holding_a_file_whose_name_is_not_utf8_is_refused_as_bad_input(tmp_path):
    import os

    folder = tmp_path / "study"
    prereg.init(folder)
    with open(os.path.join(os.fsencode(folder), b"caf\xe9.md"), "wb") as fh:
        fh.write(b"x")
    with pytest.raises(InputError, match="not valid UTF-8"):
        prereg.lock(folder)
