"""`alibi prompts build` → `alibi capture` → `alibi predict` → `alibi eval` on a tiny hand-built model."""

from __future__ import annotations

import importlib.util
import json

import pytest

from alibi.cli import main
from alibi.exact.emulator import exact_accumulator
from alibi.governance.manifest import read_manifest, verify_files
from alibi.io import atomic
from alibi.model.checkpoint import write_checkpoint
from alibi.model.compressed_tensors import quantize_dense
from alibi.model.predictions import verify_predictions, write_predictions
from alibi.tiles.synthetic import synthetic_tiles
from alibi.tiles.tile import load_tile_dir, save_tile

from .builders import TINY_LLAMA, tiny_dense_tensors, write_tiny_tokenizer

needs_model_extra = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("tokenizers") is None,
    reason="needs transformers and tokenizers (pip install 'integer-alibi[model]')")
CORPUS = " ".join(f"Line {i}: the quick brown fox {i % 5} jumps over the lazy dog." for i in range(400))


@pytest.fixture
def workspace(tmp_path):
    """A tiny W8A8 + bf16 checkpoint sharing a tokenizer, and a 2 × 48 prompt set."""
    write_tiny_tokenizer(tmp_path / "tok", CORPUS)
    tok = {"tokenizer.json": (tmp_path / "tok" / "tokenizer.json").read_bytes()}
    dense = tiny_dense_tensors(seed=7)
    ckpt = quantize_dense(TINY_LLAMA, dense)
    with atomic.staged_dir(tmp_path / "w8a8") as stage:
        write_checkpoint(stage, ckpt.config, ckpt.tensors(), tok)
    with atomic.staged_dir(tmp_path / "bf16") as stage:
        write_checkpoint(stage, TINY_LLAMA, dense, tok)
    (tmp_path / "corpus.txt").write_text(CORPUS)
    assert main(["prompts", "build", "--text", str(tmp_path / "corpus.txt"), "--tokenizer", str(tmp_path / "w8a8"),
                 "--windows", "2", "--tokens", "48", "--out", str(tmp_path / "set")]) == 0
    return tmp_path


@needs_model_extra
def test_capture_writes_one_verified_tile_per_linear_and_repeats_bit_for_bit(workspace):
    args = ["capture", "--model", str(workspace / "w8a8"), "--prompts", str(workspace / "set"), "--tokens", "40"]
    assert main(args + ["--out", str(workspace / "cap1")]) == 0
    assert main(args + ["--out", str(workspace / "cap2")]) == 0
    tiles = load_tile_dir(workspace / "cap1")
    assert len(tiles) == 14 and {t.M for t in tiles} == {40}
    assert verify_files(workspace / "cap1") == []
    m1, m2 = read_manifest(workspace / "cap1"), read_manifest(workspace / "cap2")
    assert m1.kind == "capture" and m1.subjects == m2.subjects  # same files, same sha256
    assert m1.predicate["treatment"]["kernel"] == "torch-cpu"
    assert set(m1.predicate["inputs"]) == {"checkpoint", "prompts", "tokenizer"}


@needs_model_extra
def test_predict_over_a_capture_lists_every_layer_with_its_exact_maximum(workspace, tmp_path):
    assert main(["capture", "--model", str(workspace / "w8a8"), "--prompts", str(workspace / "set"),
                 "--out", str(workspace / "cap")]) == 0
    assert main(["predict", "--tiles", str(workspace / "cap"), "--out", str(tmp_path / "p.json")]) == 0
    doc = verify_predictions(tmp_path / "p.json")
    tiles = {t.name: t for t in load_tile_dir(workspace / "cap")}
    assert doc["summary"]["layers"] == 14 and doc["capture"]["kind"] == "capture"
    for row in doc["layers"]:
        t = tiles[row["name"]]
        assert (row["M"], row["K"], row["N"]) == (48, t.K, t.N)
        assert row["max_abs_acc"] == int(exact_accumulator(t.a_q, t.w_q).abs().max())


@needs_model_extra
def test_eval_reports_perplexity_for_dense_and_w8a8_and_generates(workspace, tmp_path):
    assert main(["eval", "perplexity", "--model", str(workspace / "bf16"), "--prompts", str(workspace / "set"),
                 "--out", str(tmp_path / "d.json")]) == 0
    assert main(["eval", "perplexity", "--model", str(workspace / "w8a8"), "--prompts", str(workspace / "set"),
                 "--kernel", "emulator:w_then_a", "--out", str(tmp_path / "q.json")]) == 0
    dense, quant = (json.loads((tmp_path / f).read_text()) for f in ("d.json", "q.json"))
    assert dense["tokens"] == quant["tokens"] == 2 * 47 and quant["kernel"] == "emulator:w_then_a"
    assert dense["perplexity"] > 1 and quant["perplexity"] > 1
    assert main(["eval", "generate", "--model", str(workspace / "w8a8"), "--prompts", str(workspace / "set"),
                 "--kernel", "torch-cpu", "--prompt-tokens", "8", "--new-tokens", "4",
                 "--out", str(tmp_path / "g.json")]) == 0
    gen = json.loads((tmp_path / "g.json").read_text())
    assert [len(s["ids"]) for s in gen["sequences"]] == [4, 4]


@needs_model_extra
def test_capture_refuses_a_prompt_set_made_with_another_tokenizer(workspace, capsys):
    write_tiny_tokenizer(workspace / "other", CORPUS + " extra words change the merges", vocab_size=290)
    (workspace / "w8a8" / "tokenizer.json").write_bytes((workspace / "other" / "tokenizer.json").read_bytes())
    code = main(["capture", "--model", str(workspace / "w8a8"), "--prompts", str(workspace / "set"),
                 "--out", str(workspace / "cap")])
    assert code == 2 and "was tokenized with tokenizer" in capsys.readouterr().err
    assert not (workspace / "cap").exists()


@needs_model_extra
def test_capture_and_prompts_build_refuse_an_out_holding_a_file_they_did_not_write(workspace, capsys):
    """Issue 36 #2. Guards: `capture --out` and `prompts build --out` replaced any existing folder whole."""
    cap = workspace / "cap"
    capture = ["capture", "--model", str(workspace / "w8a8"), "--prompts", str(workspace / "set"), "--tokens", "8",
               "--out", str(cap)]
    assert main(capture) == 0
    assert main(capture) == 0  # its own earlier output is replaced
    build = ["prompts", "build", "--text", str(workspace / "corpus.txt"), "--tokenizer", str(workspace / "w8a8"),
             "--windows", "2", "--tokens", "48", "--out", str(workspace / "set")]
    for argv, folder in ((capture, cap), (build, workspace / "set")):
        (folder / ".notes").write_text("mine")
        before = {p.name: p.read_bytes() for p in folder.iterdir()}
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "holds '.notes', which alibi did not write" in err, err
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
        assert not [p for p in workspace.iterdir() if p.name.startswith(f".{folder.name}.")]  # no stage left


def test_capture_of_a_missing_model_exits_2_and_leaves_nothing(tmp_path, capsys):
    code = main(["capture", "--model", str(tmp_path / "nope"), "--prompts", str(tmp_path / "set"),
                 "--out", str(tmp_path / "cap")])
    assert code == 2 and not (tmp_path / "cap").exists()
    code = main(["model", "prepare", "smollm2-135m", "--gguf", str(tmp_path / "absent.gguf"), "--out", str(tmp_path / "m")])
    assert code == 2 and "no such GGUF file" in capsys.readouterr().err
    assert not (tmp_path / "m").exists() and list(tmp_path.iterdir()) == []


def test_predictions_are_a_pure_function_of_the_tiles_and_detect_edits(tmp_path):
    tiles = synthetic_tiles("tiny", seed=0)
    (tmp_path / "t").mkdir()
    for i, t in enumerate(tiles):
        save_tile(t, tmp_path / "t" / f"{i:02d}.safetensors")
    a = write_predictions(tmp_path / "t", tmp_path / "a.json")
    b = write_predictions(tmp_path / "t", tmp_path / "b.json")
    assert a["digest"] == b["digest"] and (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    doc = json.loads((tmp_path / "a.json").read_text())
    doc["summary"]["bitwise_safe"] += 1
    (tmp_path / "a.json").write_text(json.dumps(doc))
    with pytest.raises(Exception, match="does not match its digest"):
        verify_predictions(tmp_path / "a.json")
