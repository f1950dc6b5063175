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
import torch
import yaml
from resumed_report import without_units_record

from alibi.errors import DiskFull, InputError
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
from alibi.tiles.synthetic import synthetic_tiles
from alibi.tiles.tile import save_tile

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
    ({"seed": -1}, "seed must be an integer from 0 to 2^64 - 1, got -1"),
    ({"seed": 2**64}, "seed must be an integer from 0 to 2^64 - 1, got 18446744073709551616"),
])
def test_a_malformed_experiment_file_is_refused_with_the_reason(tmp_path, fields, message):
    with pytest.raises(InputError, match=re.escape(message)):
        load_experiment(_experiment(tmp_path, **fields))


def test_a_run_writes_units_a_report_and_a_manifest_that_verifies(tmp_path):
    """Issue 12: the units folder is the one pipeline's (`run_conformance(units_dir=...)`), so beside the
    four unit files it holds that pipeline's `plan.json` (what `--resume` recognises the run by)."""
    result = run_experiment(load_experiment(_experiment(tmp_path)))
    out = tmp_path / "out"
    assert result.exit_code == 0 and result.report.verdict == "pass"
    assert sorted(p.name for p in (out / "units").iterdir()) == [
        "0000-pow2-layers.0.proj.json", "0000-real-layers.0.proj.json",
        "0001-pow2-layers.0.wide.json", "0001-real-layers.0.wide.json", "ledger.json", "plan.json"]
    assert verify_files(out) == []
    m = read_manifest(out)
    assert m.kind == "experiment-run"
    assert {s.name for s in m.subjects} >= {"report/report.json", "report/junit.xml", "run.json", "experiment.yaml"}
    assert m.predicate["arms"]["a"]["kernel"] == "emulator:w_then_a"
    assert m.predicate["arms"]["b"]["epilogue_model"] == "a_then_w+fma"
    assert m.predicate["inputs"]["tiles"]["name"] == "synthetic:tiny"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", m.predicate["run"]["created_at"])
    assert result.report.created_at is None  # the manifest holds the run's one timestamp


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


def test_a_run_under_a_locked_protocol_records_its_lock_and_head(tmp_path, committed_code):
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
from alibi.exact.emulator import EpilogueModel
from alibi.kernels.registry import register
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
    # Issue 12: the units folder also holds the pipeline's plan.json, written before the first unit.
    # Issue 26: and the ledger of the units' digests, each recorded before its unit is written.
    assert done_before_kill == ["0000-pow2-layers.0.proj.json", "0000-real-layers.0.proj.json", "ledger.json",
                                "plan.json"]
    assert not (killed / "manifest.json").exists() and not (killed / "report").exists()

    resumed = _alibi_run([str(exp), "--out", str(killed), "--resume"], {})
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err.decode()
    assert "units: 2 computed now, 2 kept from the interrupted run" in out.decode()

    uninterrupted = _alibi_run([str(exp), "--out", str(straight)], {})
    _, err = uninterrupted.communicate(timeout=300)
    assert uninterrupted.returncode == 0, err.decode()

    # Issue 26: apart from the record of how many units came from disk, which only the resumed run has.
    a, b = _files(killed), _files(straight)
    assert sorted(a) == sorted(b)
    a = {name: _without_timestamp(name, data) for name, data in a.items()}
    b = {name: _without_timestamp(name, data) for name, data in b.items()}
    (a, from_disk), (b, none) = without_units_record(a, "report/"), without_units_record(b, "report/")
    assert (from_disk, none) == (2, 0)
    for name in a:
        assert a[name] == b[name], f"{name} differs"
    assert verify_files(killed) == [] and verify_files(straight) == []


@pytest.mark.parametrize("path", sorted((REPO / "experiments").glob("*.yaml")), ids=lambda p: p.name)
def test_every_committed_experiment_file_is_valid(path):
    exp = load_experiment(path)
    assert exp.name == path.stem and exp.out is not None


# check 7 from an experiment file's `replay:` -------------------------------------------------
def _replay(tmp_path: Path) -> Path:
    from tokens.builders import write_flips

    # 2 of 8 teacher-forced positions flip: rate 0.25, of the experiment's own pair
    return write_flips(tmp_path / "replay", [[0.1, 2.0, 5.0, 0.3], [4.0, 0.2, 3.0, 6.0]],
                       [[True, False, False, False], [False, True, False, False]])


def _check7(report):
    return report.check("token-level-risk")


def test_an_experiment_replay_makes_check_7_applicable_and_pins_the_flips_json(tmp_path):
    flips = _replay(tmp_path)
    result = run_experiment(load_experiment(_experiment(tmp_path, replay=str(flips), flip_threshold=0.3)))
    check = _check7(result.report)
    assert check.status == "passed" and check.threshold == 0.3 and check.evidence["flip_rate"] == 0.25
    assert result.exit_code == 0 and result.report.replay["path"] == str(flips)
    m = read_manifest(tmp_path / "out")
    from alibi.governance.manifest import sha256_file

    assert m.predicate["inputs"]["replay"]["digest"]["sha256"] == sha256_file(flips)
    assert json.loads((tmp_path / "out" / "run.json").read_text())["experiment"]["replay"]["flip_threshold"] == 0.3


def test_an_experiment_replay_above_the_default_bound_fires_check_7(tmp_path):
    result = run_experiment(load_experiment(_experiment(tmp_path, replay=str(_replay(tmp_path)))))
    assert _check7(result.report).status == "fired" and _check7(result.report).threshold == 0.05
    assert result.exit_code == 1


def test_without_replay_check_7_stays_inapplicable_and_the_run_record_has_no_replay(tmp_path):
    result = run_experiment(load_experiment(_experiment(tmp_path)))
    assert _check7(result.report).status == "inapplicable"
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
    with pytest.raises(InputError, match="bad.json: no manifest.json covers it"):  # issue 36 #1: verified first
        run_experiment(exp)
    assert not (tmp_path / "out").exists()


# --- issue 16: hostile experiment files, provenance of pre-registered runs -------------------------

def _dirty_tree(monkeypatch, clean):
    import alibi.experiment
    from alibi.governance.environment import WorkingTree

    changed = ("alibi/exact/emulator.py",) if clean is False else ()
    monkeypatch.setattr(alibi.experiment, "working_tree", lambda: WorkingTree(clean, changed, "a" * 40))


def test_a_pre_registered_run_refuses_code_that_differs_from_head(tmp_path, monkeypatch):
    """Guards issue 16: the pre-registered layer study ran on code that is in no commit."""
    folder = tmp_path / "prereg" / "study"
    prereg.init(folder)
    prereg.lock(folder)
    _dirty_tree(monkeypatch, False)
    with pytest.raises(ProtocolViolation, match=r"needs committed code.*aaaaaaaaaaaa \(alibi/exact/emulator.py\).*"
                                                 "--allow-dirty"):
        run_experiment(load_experiment(_experiment(tmp_path, prereg=str(folder))))
    assert not (tmp_path / "out").exists()


def test_allow_dirty_runs_and_is_recorded_in_the_run_record_and_the_manifest(tmp_path, monkeypatch):
    folder = tmp_path / "prereg" / "study"
    prereg.init(folder)
    prereg.lock(folder)
    _dirty_tree(monkeypatch, False)
    run_experiment(load_experiment(_experiment(tmp_path, prereg=str(folder))), allow_dirty=True)
    want = {"clean": False, "changed": ["alibi/exact/emulator.py"], "head": "a" * 40, "allow_dirty": True}
    assert json.loads((tmp_path / "out" / "run.json").read_text())["working_tree"] == want
    assert read_manifest(tmp_path / "out").predicate["parameters"]["working_tree"] == want


@pytest.mark.parametrize("clean", [True, None])
def test_a_pre_registered_run_from_a_commit_or_a_copy_without_git_runs_and_says_which(tmp_path, monkeypatch, clean):
    folder = tmp_path / "prereg" / "study"
    prereg.init(folder)
    prereg.lock(folder)
    _dirty_tree(monkeypatch, clean)
    run_experiment(load_experiment(_experiment(tmp_path, prereg=str(folder))))
    assert read_manifest(tmp_path / "out").predicate["parameters"]["working_tree"]["clean"] is clean


def test_a_run_without_a_protocol_does_not_look_at_the_working_tree(tmp_path, monkeypatch):
    _dirty_tree(monkeypatch, False)
    run_experiment(load_experiment(_experiment(tmp_path)))
    assert "working_tree" not in json.loads((tmp_path / "out" / "run.json").read_text())


def test_the_allow_dirty_flag_reaches_the_run_from_the_command_line(tmp_path, monkeypatch, capsys):
    from alibi.cli import main

    folder = tmp_path / "prereg" / "study"
    prereg.init(folder)
    prereg.lock(folder)
    _dirty_tree(monkeypatch, False)
    exp = _experiment(tmp_path, prereg=str(folder))
    assert main(["run", str(exp), "--quiet"]) == 2
    assert "--allow-dirty" in capsys.readouterr().err
    assert main(["run", str(exp), "--quiet", "--allow-dirty"]) == 0


def test_fp8_tiles_with_int8_kernels_are_refused_before_anything_is_written(tmp_path):
    """Guards: `alibi run` on fp8 tiles with int8 kernels wrote run.json, then failed in the first unit."""
    tiles = tmp_path / "tiles"
    tiles.mkdir()
    t = synthetic_tiles("tiny", seed=0)[0]
    save_tile(t.replace(a_q=t.a_q.float().to(torch.float8_e4m3fn), w_q=t.w_q.float().to(torch.float8_e4m3fn)),
              tiles / "fp8.safetensors")
    exp = _experiment(tmp_path, source={"tiles": str(tiles)})
    with pytest.raises(InputError, match=r"holds fp8_e4m3 operands but kernel 'emulator:w_then_a' \(arm a\) takes int8"):
        run_experiment(load_experiment(exp))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["inside", "same"])
def test_a_run_folder_overlapping_its_tiles_is_refused_and_the_tiles_stay_untouched(tmp_path, where):
    tiles = tmp_path / "tiles"
    tiles.mkdir()
    save_tile(synthetic_tiles("tiny", seed=0)[0], tiles / "t.safetensors")
    before = sorted(p.name for p in tiles.iterdir())
    out = tiles / "run" if where == "inside" else tiles
    with pytest.raises(InputError, match="the run folder overlaps source.tiles"):
        run_experiment(load_experiment(_experiment(tmp_path, source={"tiles": str(tiles)})), out)
    assert sorted(p.name for p in tiles.iterdir()) == before


def test_a_yaml_alias_bomb_is_refused_before_anything_expands_under_a_1_gib_limit(tmp_path):
    """Guards: an alias bomb under `kernels:` expanded inside the error message (~10⁹ strings)."""
    from hostile import GIB, assert_one_line_error, run_alibi

    levels = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    levels += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(levels) + "\nname: x\nkernels: *a8\nsource: {synthetic: tiny}\n")
    proc = run_alibi(["run", str(path), "--out", str(tmp_path / "o")], memory_limit=GIB)
    assert_one_line_error(proc, "bomb.yaml: not valid YAML (line 2", "YAML aliases are refused")
    assert not (tmp_path / "o").exists()


def test_a_yaml_syntax_error_is_one_line_with_its_line_and_column(tmp_path):
    """Guards: PyYAML's message (problem, context, source line, caret) was pasted in over four lines."""
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nkernels: {a: one, b: two\nsource: tiles\n")
    with pytest.raises(InputError) as info:
        load_experiment(path)
    assert "\n" not in str(info.value) and "broken.yaml: not valid YAML (line 3, column" in str(info.value)


def test_resuming_over_a_deeply_nested_run_record_is_one_line_not_a_recursion_error(tmp_path):
    exp = load_experiment(_experiment(tmp_path))
    run_experiment(exp)
    (tmp_path / "out" / "run.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match="run.json is damaged"):
        run_experiment(exp, resume=True)


def test_a_deeply_nested_unit_file_is_reported_as_damaged_on_resume(tmp_path):
    exp = load_experiment(_experiment(tmp_path))
    run_experiment(exp)
    unit = sorted((tmp_path / "out" / "units").iterdir())[0]
    unit.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match="damaged unit result; delete it and resume"):
        run_experiment(exp, resume=True)


def test_the_report_folder_of_a_run_is_replaced_whole(tmp_path, monkeypatch):
    """Guards: a failure after report.md and junit.xml were written left a half-new report folder;
    now the folder is staged, so the previous one stays exactly as it was."""
    import alibi.io.atomic

    exp = load_experiment(_experiment(tmp_path))
    run_experiment(exp)
    (tmp_path / "out" / "manifest.json").unlink()  # an interrupted second run, resumed
    (tmp_path / "out" / "report" / "junit.xml").unlink()  # so a partial rewrite would show
    before = _files(tmp_path / "out" / "report")

    real_write = alibi.io.atomic.write_text

    def disk_full_at_report_json(path, text):  # report.json is written last, after report.md and junit.xml
        if Path(path).name == "report.json":
            raise OSError(28, "No space left on device")
        return real_write(path, text)

    monkeypatch.setattr(alibi.io.atomic, "write_text", disk_full_at_report_json)
    with pytest.raises(DiskFull):  # one line naming the folder (issue 36 item 4), the old folder as it was
        run_experiment(exp, resume=True)
    assert _files(tmp_path / "out" / "report") == before
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".report")]


def test_synthetic_rows_of_a_billion_in_an_experiment_are_refused_before_anything_is_written(tmp_path):
    """Guards: `source.synthetic.rows: 1000000000` asked the generator for 256 GB of activations."""
    exp = _experiment(tmp_path, source={"synthetic": {"preset": "smollm2-135m", "rows": 10**9}})
    with pytest.raises(InputError, match="over the element budget"):
        run_experiment(load_experiment(exp))
    assert not (tmp_path / "out").exists()
