"""The experiment runner: validation, artifacts with manifests, fail-closed pins, and resume after SIGKILL."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from alibi.errors import InputError
from alibi.experiment import load_experiment, run_experiment
from alibi.governance import prereg
from alibi.governance.manifest import (
    build_predicate,
    read_manifest,
    strip_timestamp,
    verify_files,
    write_manifest,
)
from alibi.governance.prereg import ProtocolViolation
from alibi.synthetic import synthetic_tiles
from alibi.tile import save_tile

REPO = Path(__file__).resolve().parent.parent
PAIR = {"a": "emulator:w_then_a", "b": "emulator:a_then_w"}


def _experiment(tmp_path: Path, **fields) -> Path:
    body = {"name": "smoke", "kernels": PAIR, "source": {"synthetic": {"preset": "tiny"}},
            "scales": ["real", "pow2"], "seed": 0, "out": str(tmp_path / "out"), **fields}
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _without_timestamp(name: str, data: bytes) -> bytes:
    """The bytes of an artifact file without the run's one timestamp (manifest predicate.run.created_at)."""
    if name == "manifest.json":
        return json.dumps(strip_timestamp(json.loads(data)), sort_keys=True).encode()
    return data


def test_an_experiment_file_with_an_unknown_key_is_refused_naming_the_key(tmp_path):
    path = _experiment(tmp_path, scale=["real"])
    with pytest.raises(InputError, match=r"smoke.yaml: unknown key\(s\) scale in the experiment"):
        load_experiment(path)


@pytest.mark.parametrize("fields, message", [
    ({"kernels": {"a": "emulator:w_then_a"}}, "kernels must be a mapping"),
    ({"scales": ["real", "fp8"]}, "scales must be a list drawn from"),
    ({"source": {"synthetic": "tiny", "tiles": "x"}}, "exactly one of synthetic or tiles"),
    ({"source": {"tiles": "x", "sha256": "abc"}}, "source.sha256 'abc' is not 64 lowercase hex"),
    ({"seed": -1}, "seed must be a non-negative integer"),
])
def test_a_malformed_experiment_file_is_refused_with_the_reason(tmp_path, fields, message):
    with pytest.raises(InputError, match=re.escape(message)):
        load_experiment(_experiment(tmp_path, **fields))


def test_a_run_writes_units_a_report_and_a_manifest_that_verifies(tmp_path):
    result = run_experiment(load_experiment(_experiment(tmp_path)))
    out = tmp_path / "out"
    assert result.exit_code == 0 and result.report["verdict"] == "pass"
    assert sorted(p.name for p in (out / "units").iterdir()) == [
        "0000-pow2-layers.0.proj.json", "0000-real-layers.0.proj.json",
        "0001-pow2-layers.0.wide.json", "0001-real-layers.0.wide.json"]
    assert verify_files(out) == []
    m = read_manifest(out)
    assert m.kind == "experiment-run"
    assert {s.name for s in m.subjects} >= {"report/report.json", "report/junit.xml", "run.json", "experiment.yaml"}
    assert m.predicate["arms"]["a"]["kernel"] == "emulator:w_then_a"
    assert m.predicate["arms"]["b"]["epilogue_model"] == "a_then_w+fma"
    assert m.predicate["inputs"]["tiles"]["name"] == "synthetic:tiny"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", m.predicate["run"]["created_at"])
    assert result.report["created_at"] is None  # the manifest holds the run's one timestamp


def test_a_fresh_run_refuses_a_folder_that_already_holds_results(tmp_path):
    exp = load_experiment(_experiment(tmp_path))
    run_experiment(exp)
    with pytest.raises(InputError, match="pass --resume to continue"):
        run_experiment(exp)


def test_resume_refuses_a_folder_started_by_a_different_experiment(tmp_path):
    run_experiment(load_experiment(_experiment(tmp_path)))
    other = load_experiment(_experiment(tmp_path, seed=1))
    with pytest.raises(InputError, match=r"cannot resume: .*experiment.seed: was 0, now 1"):
        run_experiment(other, resume=True)


def _tile_folder(folder: Path) -> Path:
    for tile in synthetic_tiles("tiny", seed=5):
        save_tile(tile, folder / f"{tile.name}.safetensors")
    write_manifest(folder, "capture", build_predicate(seed=5))
    return folder


def test_a_tiles_source_that_differs_from_its_pinned_manifest_fails_closed(tmp_path):
    tiles = _tile_folder(tmp_path / "capture")
    pinned = tmp_path / "prereg" / "capture.manifest.json"
    pinned.parent.mkdir()
    pinned.write_bytes((tiles / "manifest.json").read_bytes())
    exp = _experiment(tmp_path, source={"tiles": str(tiles), "pinned": str(pinned)})
    assert run_experiment(load_experiment(exp), tmp_path / "ok").exit_code == 0
    for tile in synthetic_tiles("tiny", seed=6)[:1]:
        save_tile(tile, tiles / f"{tile.name}.safetensors")
    write_manifest(tiles, "capture", build_predicate(seed=6))  # a self-consistent, but different, capture
    with pytest.raises(InputError, match=r"layers.0.proj.safetensors: sha256 \w+ differs from \w+ pinned by"):
        run_experiment(load_experiment(exp), tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


def test_a_run_under_a_locked_protocol_records_its_lock_and_head(tmp_path):
    folder = tmp_path / "prereg" / "study"
    prereg.init(folder)
    lock = prereg.lock(folder)
    run_experiment(load_experiment(_experiment(tmp_path, prereg=str(folder))))
    protocol = read_manifest(tmp_path / "out").predicate["protocol"]
    assert protocol == {"folder": str(folder), "lock_sha256": lock, "head_sha256": lock, "amendments": 0}


def test_a_run_refuses_a_protocol_edited_without_an_amendment(tmp_path):
    folder = tmp_path / "prereg" / "study"
    prereg.init(folder)
    prereg.lock(folder)
    (folder / "analysis.yaml").write_text("tolerance_ulp: 2\n")
    with pytest.raises(ProtocolViolation, match="analysis.yaml: edited since the lock without an amendment"):
        run_experiment(load_experiment(_experiment(tmp_path, prereg=str(folder))))
    assert not (tmp_path / "out").exists()


# A subprocess running `alibi run` with the two emulator epilogues registered under test names.
# With ALIBI_TEST_STALL_AFTER=n the first arm stalls forever at its n-th call (after writing a
# marker file), so the test can SIGKILL it at a known point in the middle of the run.
_RUNNER = """
import os, sys, time
from pathlib import Path
from alibi.cli import main
from alibi.emulator import EpilogueModel
from alibi.kernels import register
from alibi.kernels.cpu import EmulatorKernel

class StallingEmulator(EmulatorKernel):
    calls = 0
    def scaled_mm(self, *args, **kw):
        StallingEmulator.calls += 1
        stall = int(os.environ.get("ALIBI_TEST_STALL_AFTER", "0"))
        if stall and StallingEmulator.calls >= stall:
            Path(os.environ["ALIBI_TEST_MARKER"]).write_text("stalled")
            time.sleep(3600)
        return super().scaled_mm(*args, **kw)

register("test:w_then_a", lambda: StallingEmulator(EpilogueModel("w_then_a")))
register("test:a_then_w", lambda: EmulatorKernel(EpilogueModel("a_then_w")))
sys.exit(main(sys.argv[1:]))
"""


def _alibi_run(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _RUNNER, "run", *args, "--quiet"], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.slow
def test_sigkill_then_resume_gives_the_bytes_of_an_uninterrupted_run_apart_from_the_timestamp(tmp_path):
    exp = _experiment(tmp_path, kernels={"a": "test:w_then_a", "b": "test:a_then_w"})
    killed, straight = tmp_path / "killed", tmp_path / "straight"
    marker = tmp_path / "stalled"

    # Units run in order tile 0 real, tile 0 pow2, tile 1 real, tile 1 pow2. At M=8 a real-regime
    # unit calls arm a 4 times (full tile, rows {0}, rows {2..5}, a rerun), a pow2 unit once, so
    # the 6th call is the first of unit 3: two units are complete when the run is killed.
    proc = _alibi_run([str(exp), "--out", str(killed)], {"ALIBI_TEST_STALL_AFTER": "6", "ALIBI_TEST_MARKER": str(marker)})
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never reached the stall point"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before_kill = sorted(p.name for p in (killed / "units").iterdir())
    assert done_before_kill == ["0000-pow2-layers.0.proj.json", "0000-real-layers.0.proj.json"]
    assert not (killed / "manifest.json").exists() and not (killed / "report").exists()

    resumed = _alibi_run([str(exp), "--out", str(killed), "--resume"], {})
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err.decode()
    assert "units: 2 computed now, 2 kept from the interrupted run" in out.decode()

    uninterrupted = _alibi_run([str(exp), "--out", str(straight)], {})
    _, err = uninterrupted.communicate(timeout=300)
    assert uninterrupted.returncode == 0, err.decode()

    a, b = _files(killed), _files(straight)
    assert sorted(a) == sorted(b)
    for name in a:
        assert _without_timestamp(name, a[name]) == _without_timestamp(name, b[name]), f"{name} differs"
    assert verify_files(killed) == [] and verify_files(straight) == []


@pytest.mark.parametrize("path", sorted((REPO / "experiments").glob("*.yaml")), ids=lambda p: p.name)
def test_every_committed_experiment_file_is_valid(path):
    exp = load_experiment(path)
    assert exp.name == path.stem and exp.out is not None


# check 7 from an experiment file's `replay:` -------------------------------------------------
def _replay(tmp_path: Path) -> Path:
    from stats.builders import write_flips

    # 2 of 8 teacher-forced positions flip: rate 0.25, of the experiment's own pair
    return write_flips(tmp_path / "replay", [[0.1, 2.0, 5.0, 0.3], [4.0, 0.2, 3.0, 6.0]],
                       [[True, False, False, False], [False, True, False, False]])


def _check7(report):
    return next(c for c in report["checks"] if c["check"] == "token-level-risk")


def test_an_experiment_replay_makes_check_7_applicable_and_pins_the_flips_json(tmp_path):
    flips = _replay(tmp_path)
    result = run_experiment(load_experiment(_experiment(tmp_path, replay=str(flips), flip_threshold=0.3)))
    check = _check7(result.report)
    assert check["status"] == "passed" and check["threshold"] == 0.3 and check["evidence"]["flip_rate"] == 0.25
    assert result.exit_code == 0 and result.report["replay"]["path"] == str(flips)
    m = read_manifest(tmp_path / "out")
    from alibi.governance.manifest import sha256_file

    assert m.predicate["inputs"]["replay"]["digest"]["sha256"] == sha256_file(flips)
    assert json.loads((tmp_path / "out" / "run.json").read_text())["experiment"]["replay"]["flip_threshold"] == 0.3


def test_an_experiment_replay_above_the_default_bound_fires_check_7(tmp_path):
    result = run_experiment(load_experiment(_experiment(tmp_path, replay=str(_replay(tmp_path)))))
    assert _check7(result.report)["status"] == "fired" and _check7(result.report)["threshold"] == 0.05
    assert result.exit_code == 1


def test_without_replay_check_7_stays_inapplicable_and_the_run_record_has_no_replay(tmp_path):
    result = run_experiment(load_experiment(_experiment(tmp_path)))
    assert _check7(result.report)["status"] == "inapplicable"
    assert "replay" not in json.loads((tmp_path / "out" / "run.json").read_text())["experiment"]


@pytest.mark.parametrize("fields, message", [
    ({"flip_threshold": 0.1}, "flip_threshold bounds the flip rate of a replay"),
    ({"replay": "x.json", "flip_threshold": 2}, "flip_threshold must be a flip rate between 0 and 1"),
    ({"replay": ""}, "replay must be a non-empty string"),
])
def test_a_malformed_replay_key_is_refused(tmp_path, fields, message):
    with pytest.raises(InputError, match=re.escape(message)):
        load_experiment(_experiment(tmp_path, **fields))


def test_an_unreadable_replay_fails_before_the_run_folder_is_created(tmp_path):
    (tmp_path / "bad.json").write_text('{"schema": "alibi-flips/v1"')
    exp = load_experiment(_experiment(tmp_path, replay=str(tmp_path / "bad.json")))
    with pytest.raises(InputError, match="bad.json: not valid JSON"):
        run_experiment(exp)
    assert not (tmp_path / "out").exists()
