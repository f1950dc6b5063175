"""A kill at every write of every writing command leaves the old state or the complete new one.

tests/kill_harness.py kills a command just before each call of alibi's two commit primitives
(`atomic._commit`, `atomic.exchange`) and once after the last, which reaches every state a SIGKILL
can leave (see its docstring). For each state this test asks: is the output exactly what it was
before the command (or still absent), or the complete new output (its manifest verifies, its
content is the new one)? Hidden staging entries may be left beside the output by a kill; the next
run of the command must remove them. `alibi run` is resumable by design: every state its kills
leave must resume to the bytes of an uninterrupted run (apart from the one timestamp).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hostile import REPO
from resumed_report import without_units_record

from alibi.cli import main
from alibi.governance.manifest import read_manifest, strip_timestamp, verify_files

HARNESS = REPO / "tests" / "kill_harness.py"
KILLED = 137
# Each test compares what this process wrote with what killed child processes wrote; both start from a
# fresh process's torch flags (the environment record carries them, `--resume` checks it).
pytestmark = pytest.mark.usefixtures("fresh_process_torch_flags")


def _tree(path: Path) -> dict[str, bytes] | bytes | None:
    if path.is_dir():
        return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
    return path.read_bytes() if path.exists() else None


def kill_everywhere(tmp_path: Path, argv: list[str], out: Path, old: Path | None, *,
                    preload: tuple[str, ...] = (), keep_stages: bool = False) -> list[tuple[int, Path]]:
    """Run the harness; return (kill point, snapshot folder) for every state it left, the last one
    being the run that completed. Asserts the command completed (exit 0 or 1: a check may fire).
    keep_stages: also copy the stages each kill left (the harness's `keep_stages`)."""
    snapshots = tmp_path / f"snapshots-{argv[0]}-{len(list(tmp_path.glob('snapshots-*')))}"
    spec = tmp_path / "kill-spec.json"
    spec.write_text(json.dumps({"argv": argv, "out": str(out), "old": None if old is None else str(old),
                                "snapshots": str(snapshots), "cwd": str(tmp_path), "preload": list(preload),
                                "keep_stages": keep_stages}))
    proc = subprocess.run([sys.executable, str(HARNESS), str(spec)], cwd=REPO, capture_output=True, text=True,
                          check=False, timeout=1200, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    results = {int(k): v for k, v in json.loads((snapshots / "results.json").read_text()).items()}
    last = max(results)
    assert results[last] in (100, 101), f"the complete run exited {results[last] - 100}"
    assert all(code == KILLED for k, code in results.items() if k != last)
    assert last >= 2, "the command made no commit at all"
    return [(k, snapshots / str(k)) for k in sorted(results)]


def judge(states: list[tuple[int, Path]], old: Path | None, is_complete_new: Callable[[Path], bool]) -> dict:
    """Every state is the old one or a complete new one; the completed run's is new. Returns counts."""
    want_old = _tree(old) if old is not None else None
    seen = {"old": 0, "new": 0}
    for k, snap in states:
        left = snap / "out"
        if _tree(left) == want_old:
            seen["old"] += 1
        else:
            assert is_complete_new(left), f"the kill before commit {k} left a partial output"
            seen["new"] += 1
    assert is_complete_new(states[-1][1] / "out")
    assert seen["old"] >= 1, "no kill point before the output changed: the harness counted no commit"
    return seen


def stages_left(states: list[tuple[int, Path]]) -> int:
    return max(len(json.loads((snap / "stages.json").read_text())) for _, snap in states)


def stages_beside(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f".{out.name}.*"))


def restore_killed_state(snap: Path, out: Path) -> list[str]:
    """Put the output and the stages a kill left (snapshot `snap`) back beside `out`; their names."""
    if out.is_dir():
        shutil.rmtree(out)
    elif out.exists():
        out.unlink()
    for stale in stages_beside(out):
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    left = snap / "out"
    if left.is_dir():
        shutil.copytree(left, out)
    elif left.exists():
        shutil.copy2(left, out)
    names = json.loads((snap / "stages.json").read_text())
    for name in names:
        src = snap / "stages" / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, out.parent / name)
    return names


def rerun_removes_every_stage(states, out: Path, argv: list[str], is_complete_new) -> int:
    """From every killed state that left a stage, the next run leaves no stage and the complete new
    output. Returns how many states had a stage (the caller asserts there was at least one)."""
    with_stage = 0
    for k, snap in states:
        names = restore_killed_state(snap, out)
        if not names:
            continue
        with_stage += 1
        assert [p.name for p in stages_beside(out)] == names  # the stale stages are really there
        assert main(argv) == 0, f"kill point {k}: the next run failed"
        assert stages_beside(out) == [], f"kill point {k}: a stale stage survived the next run"
        assert is_complete_new(out), f"kill point {k}: the next run did not leave the new output"
    return with_stage


# --- conform -----------------------------------------------------------------------------------

EMU = ["--kernel-a", "emulator:w_then_a", "--kernel-b", "emulator:a_then_w", "--quiet"]


def test_conform_killed_at_any_write_leaves_the_old_report_or_the_complete_new_one(tmp_path):
    old, out = tmp_path / "old-report", tmp_path / "report"
    assert main(["conform", *EMU, "--synthetic", "tiny", "--seed", "1", "--out", str(old)]) == 0

    def complete(path: Path) -> bool:
        names = {p.name for p in path.iterdir()} if path.is_dir() else set()
        return (names == {"report.json", "report.md", "junit.xml", "report.html", "manifest.json"}
                and verify_files(path) == [] and json.loads((path / "report.json").read_text())["seed"] == 2)

    states = kill_everywhere(tmp_path, ["conform", *EMU, "--synthetic", "tiny", "--seed", "2", "--out", str(out)],
                             out, old, preload=("alibi.conform.pipeline", "alibi.conform.report", "alibi.html"), keep_stages=True)
    seen = judge(states, old, complete)
    # Issue 12: plan.json and 4 units in the hidden .report.units first, then html, md, junit, json, manifest in
    # the stage, then the swap (was >= 6 before the units were kept for --resume)
    assert seen["new"] >= 1 and len(states) >= 11
    assert stages_left(states) >= 1  # kills inside the stage leave it; the next run removes it:
    argv = ["conform", *EMU, "--synthetic", "tiny", "--seed", "2", "--out", str(out)]
    assert rerun_removes_every_stage(states, out, argv, complete) >= 1


REPORT_FILES = {"report.json", "report.md", "junit.xml", "report.html", "manifest.json"}


def test_conform_killed_at_any_write_resumes_with_resume_to_the_bytes_of_an_uninterrupted_run(tmp_path, monkeypatch):
    """Issue 12: `alibi conform` keeps each finished unit in `.<out>.units/` (with its `plan.json`) while it
    runs and stages the report folder, renaming it into place once. So every state a kill leaves is the
    absent report or the complete one, and `--resume` from it gives the very bytes of a straight run apart
    from the record of how many units came from disk (issue 26), leaving nothing hidden beside it. Issue 26:
    the units folder appears with its plan in one step, and `--resume` where no plan was kept starts afresh
    (it used to refuse); the units go after the report in one rename. SOURCE_DATE_EPOCH fixes `created_at`,
    the report's one wall-clock field."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")  # inherited by the harness's children too

    def argv(out: Path) -> list[str]:
        return ["conform", *EMU, "--synthetic", "tiny", "--out", str(out)]

    straight, out = tmp_path / "straight", tmp_path / "report"
    assert main(argv(straight)) == 0
    want = _tree(straight)
    assert set(want) == REPORT_FILES and verify_files(straight) == [] and stages_beside(straight) == []
    assert json.loads(want["report.json"])["created_at"] == "2026-01-01T00:00:00Z"
    want_comparable, none_from_disk = without_units_record(want)
    assert none_from_disk == 0

    states = kill_everywhere(tmp_path, argv(out), out, None,
                             preload=("alibi.conform.pipeline", "alibi.conform.report", "alibi.html"), keep_stages=True)
    # the units folder with plan.json, 4 × (ledger, unit), 5 files in the stage, its rename, the units' discard
    assert len(states) >= 16
    *killed, (_, done) = states
    assert _tree(done / "out") == want and json.loads((done / "stages.json").read_text()) == []
    resumed_with_units = finished_stage = without_plan = 0
    for k, snap in killed:
        left = _tree(snap / "out")
        assert left is None or left == want, f"the kill before commit {k} left a partial report folder"
        names = restore_killed_state(snap, out)
        units_dir = out.parent / f".{out.name}.units"
        plan = units_dir / "plan.json"
        units = [p for p in units_dir.glob("0*.json")] if plan.is_file() else []
        without_plan += not plan.is_file()
        resumed_with_units += bool(units)
        finished_stage += len(units) == 4 and any(n != f".{out.name}.units" for n in names)
        assert main([*argv(out), "--resume"]) == 0, f"kill point {k}: --resume failed"
        got, from_disk = without_units_record(_tree(out))
        assert got == want_comparable, f"the conform killed before commit {k} resumed to different bytes"
        assert from_disk == len(units), f"kill point {k}: {from_disk} units said to come from disk, {len(units)} did"
        assert stages_beside(out) == [], f"kill point {k}: something hidden was left beside the report"
    assert without_plan >= 1  # killed before the plan: --resume starts afresh
    assert resumed_with_units >= 4  # resumed mid-run, with 1 to 4 units done earlier
    assert finished_stage >= 1  # and killed at the final writes, with every unit done and the stage begun


# --- pow2-rewrite --overwrite ------------------------------------------------------------------

def test_pow2_rewrite_overwrite_killed_at_any_write_leaves_the_old_checkpoint_or_the_new_one(tmp_path):
    from model.builders import tiny_dense_tensors, write_llm_compressor_style

    from alibi.exact.numerics import is_pow2
    from alibi.model.compressed_tensors import read_w8a8

    src, old, out = tmp_path / "w8a8", tmp_path / "old-pow2", tmp_path / "pow2"
    write_llm_compressor_style(src, tiny_dense_tensors(seed=2), shards=2)
    assert main(["pow2-rewrite", str(src), str(old), "--mode", "nearest", "--keep-weights"]) == 0

    def complete(path: Path) -> bool:
        if not (path / "manifest.json").is_file() or verify_files(path) != []:
            return False
        mode = read_manifest(path).predicate["parameters"]["pow2_rewrite"]["mode"]
        return mode == "ceil" and all(bool(is_pow2(lin.scale).all()) for lin in read_w8a8(path).linears.values())

    argv = ["pow2-rewrite", str(src), str(out), "--mode", "ceil", "--keep-weights", "--overwrite"]
    states = kill_everywhere(tmp_path, argv, out, old, preload=("alibi.model.pow2_rewrite", "alibi.model.compressed_tensors"),
                             keep_stages=True)
    judge(states, old, complete)
    assert stages_left(states) >= 1
    # From every killed state that left a stage (up to a whole checkpoint), put back with its stage, the
    # next run removes the stage and leaves the complete new checkpoint (the harness itself clears stages,
    # so only a restored state can show this).
    assert rerun_removes_every_stage(states, out, argv, complete) >= 1


# --- predict, manifest write, prereg lock and amend: single-file outputs -----------------------

@pytest.fixture
def tiles(tmp_path):
    from alibi.tiles.synthetic import synthetic_tiles
    from alibi.tiles.tile import save_tile

    folder = tmp_path / "tiles"
    folder.mkdir()
    for t in synthetic_tiles("tiny", seed=3):
        save_tile(t, folder / f"{t.name}.safetensors")
    return folder


def test_predict_killed_at_its_write_leaves_the_old_file_or_the_new_one(tmp_path, tiles):
    from alibi.governance.manifest import digest_tree
    from alibi.model.predictions import verify_predictions

    old = tmp_path / "old.json"
    old.write_text('{"format": "something else"}\n')
    out = tmp_path / "pred.json"

    def complete(path: Path) -> bool:
        return path.is_file() and verify_predictions(path)["tiles"]["folder_digest"]["sha256"] == digest_tree(tiles)

    judge(kill_everywhere(tmp_path, ["predict", "--tiles", str(tiles), "--out", str(out)], out, old,
                          preload=("alibi.model.predictions",)), old, complete)


def test_manifest_write_killed_at_its_write_leaves_the_old_manifest_or_the_new_one(tmp_path, tiles):
    assert main(["manifest", "write", str(tiles), "--kind", "tiles", "--seed", "1"]) == 0
    old = tmp_path / "old-manifest.json"
    shutil.copy(tiles / "manifest.json", old)

    def complete(path: Path) -> bool:
        return path.is_file() and json.loads(path.read_text())["predicate"]["seed"] == 2 and verify_files(path) == []

    out = tiles / "manifest.json"
    states = kill_everywhere(tmp_path, ["manifest", "write", str(tiles), "--kind", "tiles", "--seed", "2"], out, old)
    for _, snap in states:  # judged in place: the manifest covers the folder it sits in
        shutil.copy(snap / "out", out)
        assert (snap / "out").read_bytes() == old.read_bytes() or complete(out)


def test_prereg_lock_and_amend_killed_at_their_write_leave_a_consistent_protocol(tmp_path):
    from alibi.governance import prereg

    folder = tmp_path / "study"
    prereg.init(folder)
    lock = folder / "lock.json"
    states = kill_everywhere(tmp_path, ["prereg", "lock", str(folder)], lock, None)
    for _, snap in states:
        if (snap / "out").exists():
            shutil.copy(snap / "out", lock)
            assert prereg.verify(folder) == []
    assert lock.is_file() and prereg.verify(folder) == []
    (folder / "protocol.md").write_text("# changed\n")
    log = folder / "amendments.jsonl"
    states = kill_everywhere(tmp_path, ["prereg", "amend", str(folder), "--reason", "edit"], log, None)
    assert prereg.verify(folder) == []  # the completed run's log is in place
    for _, snap in states:
        left = snap / "out"
        if left.exists():
            shutil.copy(left, log)
            assert prereg.verify(folder) == []
        else:  # no log yet: the edit is pending, the records themselves are intact
            log.unlink(missing_ok=True)
            assert [p for p in prereg.verify(folder) if "without an amendment" not in p] == []


# --- alibi run: every state resumes to the uninterrupted bytes ---------------------------------

def test_alibi_run_killed_at_any_write_resumes_to_the_bytes_of_an_uninterrupted_run(tmp_path):
    exp = tmp_path / "e.yaml"
    exp.write_text(yaml.safe_dump({"name": "k", "kernels": {"a": "emulator:w_then_a", "b": "emulator:a_then_w"},
                                   "source": {"synthetic": {"preset": "tiny"}}, "scales": ["real", "pow2"]}))
    straight, out = tmp_path / "straight", tmp_path / "run"
    assert main(["run", str(exp), "--out", str(straight), "--quiet"]) == 0
    states = kill_everywhere(tmp_path, ["run", str(exp), "--out", str(out), "--quiet"], out, None,
                             preload=("alibi.experiment", "alibi.conform.pipeline", "alibi.conform.report", "alibi.html"))
    assert len(states) >= 10  # experiment.yaml, run.json, 4 units, the report stage, criteria-less manifest

    def comparable(folder: Path) -> dict[str, bytes]:
        """The run folder without its manifest's timestamp and without the record of how many units the
        resumed run read from disk (issue 26)."""
        files = _tree(folder)
        files["manifest.json"] = json.dumps(strip_timestamp(json.loads(files["manifest.json"])),
                                            sort_keys=True).encode()
        return without_units_record(files, "report/")[0]

    want = comparable(straight)
    for k, snap in states:
        left = snap / "out"
        if not left.exists():
            continue
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(left, out)
        assert main(["run", str(exp), "--out", str(out), "--quiet", "--resume"]) == 0, f"kill point {k}"
        assert comparable(out) == want, f"the run killed before commit {k} resumed to different bytes"
        assert not [p for p in out.rglob(".*")], f"kill point {k}: a stale stage survived the resume"


# --- prompts build and capture: new folders -------------------------------------------------------

needs_model_extra = pytest.mark.skipif(
    __import__("importlib").util.find_spec("transformers") is None
    or __import__("importlib").util.find_spec("tokenizers") is None,
    reason="needs transformers and tokenizers (pip install 'integer-alibi[model]')")
CORPUS = " ".join(f"Line {i}: the quick brown fox {i % 5} jumps over the lazy dog." for i in range(400))


@pytest.fixture
def tiny_model(tmp_path):
    from model.builders import TINY_LLAMA, tiny_dense_tensors, write_tiny_tokenizer

    from alibi.io import atomic
    from alibi.model.checkpoint import write_checkpoint
    from alibi.model.compressed_tensors import quantize_dense

    write_tiny_tokenizer(tmp_path / "tok", CORPUS)
    ckpt = quantize_dense(TINY_LLAMA, tiny_dense_tensors(seed=7))
    with atomic.staged_dir(tmp_path / "w8a8") as stage:
        write_checkpoint(stage, ckpt.config, ckpt.tensors(),
                         {"tokenizer.json": (tmp_path / "tok" / "tokenizer.json").read_bytes()})
    (tmp_path / "corpus.txt").write_text(CORPUS)
    return tmp_path


@needs_model_extra
def test_prompts_build_and_capture_killed_at_any_write_leave_nothing_or_the_complete_folder(tiny_model):
    from alibi.model.prompts import load_prompt_set
    from alibi.tiles.tile import load_tile_dir

    tmp_path = tiny_model
    prompts = tmp_path / "set"
    build = ["prompts", "build", "--text", str(tmp_path / "corpus.txt"), "--tokenizer", str(tmp_path / "w8a8"),
             "--windows", "2", "--tokens", "48", "--out", str(prompts)]
    states = kill_everywhere(tmp_path, build, prompts, None, preload=("alibi.model.prompts", "tokenizers"))
    judge(states, None, lambda p: p.is_dir() and load_prompt_set(p).windows == 2)
    shutil.rmtree(prompts, ignore_errors=True)
    assert main(build) == 0

    out = tmp_path / "cap"
    states = kill_everywhere(tmp_path, ["capture", "--model", str(tmp_path / "w8a8"), "--prompts", str(prompts),
                                        "--tokens", "16", "--out", str(out)], out, None,
                             preload=("alibi.model.capture", "alibi.model.runner", "transformers"))
    judge(states, None, lambda p: p.is_dir() and verify_files(p) == [] and len(load_tile_dir(p)) == 14)
