"""A pre-registered replay pins the protocol it was measured under (issue 26).

`alibi replay teacher-forced --prereg DIR` refuses a protocol folder that is not locked or changed
without an amendment (one line, exit 2, nothing written), records the protocol's lock hash, head hash
and amendment count in every manifest it writes (`predicate.protocol`: the arm's, and for the pair the
folder's), and writes nothing when the protocol is amended while the replay runs. Before, the
manifests of the pre-registered token study carried no lock hash: "locked before measured" rested on
git history and self-reported times (analysis/pin_results.py had to add it after the fact)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alibi.cli import main
from alibi.errors import InputError
from alibi.governance import prereg
from alibi.governance.manifest import read_manifest, verify_files
from alibi.io.digests import sha256_bytes

from .conftest import needs_model_extra


@pytest.fixture
def protocol(tmp_path) -> Path:
    folder = tmp_path / "protocol"
    prereg.init(folder)
    prereg.lock(folder)
    return folder


def _argv(tiny: Path, out: Path, *extra: str) -> list[str]:
    return ["replay", "teacher-forced", "--model", str(tiny / "w8a8"), "--prompts", str(tiny / "set"),
            "--kernel", "torch-cpu", "--windows", "1", "--context", "20", "--quiet", "--out", str(out), *extra]


@needs_model_extra
def test_a_pre_registered_arm_manifest_pins_the_lock_hash_and_head(tiny, tmp_path, protocol):
    out = tmp_path / "arm"
    assert main(_argv(tiny, out, "--prereg", str(protocol))) == 0
    recorded = read_manifest(out).predicate["protocol"]
    assert recorded["lock_sha256"] == sha256_bytes((protocol / "lock.json").read_bytes())
    assert recorded == {"folder": str(protocol), "lock_sha256": recorded["lock_sha256"],
                        "head_sha256": recorded["lock_sha256"], "amendments": 0}  # no amendment: head = lock
    assert verify_files(out) == []
    # after an amendment the head moves on and a new replay records it
    (protocol / "protocol.md").write_text("# amended\n")
    head = prereg.amend(protocol, "a clarification")
    assert main(_argv(tiny, tmp_path / "arm2", "--prereg", str(protocol))) == 0
    again = read_manifest(tmp_path / "arm2").predicate["protocol"]
    assert (again["lock_sha256"], again["head_sha256"], again["amendments"]) == (recorded["lock_sha256"], head, 1)


@needs_model_extra
def test_a_replay_without_prereg_records_no_protocol(tiny, tmp_path):
    out = tmp_path / "arm"
    assert main(_argv(tiny, out)) == 0
    assert read_manifest(out).predicate["protocol"] is None


@needs_model_extra
@pytest.mark.parametrize("state", ["unlocked", "edited-without-amendment", "missing"])
def test_a_protocol_that_cannot_be_relied_on_is_one_line_exit_2_and_nothing_written(tiny, tmp_path, capsys, state):
    folder = tmp_path / "protocol"
    if state != "missing":
        prereg.init(folder)
        if state == "edited-without-amendment":
            prereg.lock(folder)
            (folder / "protocol.md").write_text("# changed after the lock\n")
    out = tmp_path / "arm"
    assert main(_argv(tiny, out, "--prereg", str(folder))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(folder) in err[0], err
    assert not out.exists() and not list(tmp_path.glob(".arm*"))


@needs_model_extra
def test_an_amendment_while_the_replay_runs_leaves_nothing_written(tiny, tmp_path, protocol, capsys, monkeypatch):
    import alibi.tokens.teacher_forced as tf

    real = tf.replay_windows

    def amended_midway(*args, **kwargs):
        records = real(*args, **kwargs)
        (protocol / "protocol.md").write_text("# changed while measuring\n")
        prereg.amend(protocol, "changed mid-run")
        return records

    monkeypatch.setattr(tf, "replay_windows", amended_midway)
    out = tmp_path / "arm"
    assert main(_argv(tiny, out, "--prereg", str(protocol))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was amended while the replay ran" in err[0], err
    assert not out.exists()


@needs_model_extra
def test_prereg_overlapping_the_output_and_prereg_with_vllm_are_refused_in_one_line(tiny, tmp_path, protocol, capsys):
    assert main(_argv(tiny, protocol / "out", "--prereg", str(protocol))) == 2
    assert "overlaps --prereg" in capsys.readouterr().err
    argv = _argv(tiny, tmp_path / "arm", "--prereg", str(protocol), "--engine", "vllm")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--prereg" in err[0] and not (tmp_path / "arm").exists()


@needs_model_extra
def test_a_pre_registered_pair_pins_the_lock_in_each_arm_and_in_the_folder_and_prints_its_flip_count(
        tiny, tmp_path, protocol, monkeypatch, capsys):
    import inprocess_arms

    import alibi.tokens.teacher_forced as tf

    monkeypatch.setattr(tf, "run_child", inprocess_arms.run_child_inprocess)  # the arms' argv, run here
    out = tmp_path / "pair"
    argv = [*_argv(tiny, out, "--prereg", str(protocol))]
    k = argv.index("--kernel")
    argv[k:k + 2] = ["--kernel-a", "torch-cpu", "--kernel-b", "emulator:w_then_a"]
    assert main(argv) == 0
    want = prereg.require_locked(protocol).as_dict()
    for folder in (out, out / "arm-a", out / "arm-b"):
        assert read_manifest(folder).predicate["protocol"] == want, folder
    assert verify_files(out) == []
    assert json.loads((out / "manifest.json").read_text())["predicate"]["parameters"]["replay"] == "teacher-forced-pair"
    flips = json.loads((out / "flips" / "flips.json").read_text())
    assert f": {flips['n_flips']} flips in {flips['n_positions']} positions; " in capsys.readouterr().out


@needs_model_extra
def test_the_pair_refuses_an_arm_whose_manifest_records_another_protocol(tiny, tmp_path, protocol):
    from alibi.tokens.setup import combined_predicate

    assert main(_argv(tiny, tmp_path / "a")) == 0  # measured under no protocol
    assert main(_argv(tiny, tmp_path / "b", "--prereg", str(protocol))) == 0
    record = prereg.require_locked(protocol).as_dict()
    with pytest.raises(InputError, match="records protocol None"):
        combined_predicate({"a": tmp_path / "a", "b": tmp_path / "b"}, {}, record)
    assert combined_predicate({"b": tmp_path / "b"}, {}, record)["protocol"] == record
