"""A treatment covers every field that follows from it: captures of two checkpoints differ only in the checkpoint."""

from __future__ import annotations

import importlib.util

import pytest
from model.builders import TINY_LLAMA, tiny_dense_tensors, write_tiny_tokenizer

from alibi.cli import main
from alibi.governance.identity import compare_manifests, treatment_fields
from alibi.io import atomic
from alibi.model.checkpoint import write_checkpoint
from alibi.model.compressed_tensors import quantize_dense

needs_model_extra = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("tokenizers") is None,
    reason="needs transformers and tokenizers (pip install 'integer-alibi[model]')")
CORPUS = " ".join(f"Sentence {i}: a treatment covers what follows from it, item {i % 7}." for i in range(300))


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    """Captures of a W8A8 checkpoint and of its pow2 rewrite (the README's example), same prompts and kernel."""
    root = tmp_path_factory.mktemp("treatments")
    write_tiny_tokenizer(root / "tok", CORPUS)
    tok = {"tokenizer.json": (root / "tok" / "tokenizer.json").read_bytes()}
    dense = tiny_dense_tensors(seed=11)
    ckpt = quantize_dense(TINY_LLAMA, dense)
    with atomic.staged_dir(root / "w8a8") as stage:
        write_checkpoint(stage, ckpt.config, ckpt.tensors(), tok)
    with atomic.staged_dir(root / "bf16") as stage:
        write_checkpoint(stage, TINY_LLAMA, dense, tok)
    # Pinned like `alibi model prepare` output, as the pow2 rewrite pins its own: both captures then
    # record a checkpoint verified against its manifest, and only the checkpoint itself differs.
    assert main(["manifest", "write", str(root / "w8a8"), "--kind", "checkpoint"]) == 0
    (root / "corpus.txt").write_text(CORPUS)
    assert main(["prompts", "build", "--text", str(root / "corpus.txt"), "--tokenizer", str(root / "w8a8"),
                 "--windows", "1", "--tokens", "24", "--out", str(root / "set")]) == 0
    assert main(["pow2-rewrite", str(root / "w8a8"), str(root / "w8a8-pow2"), "--mode", "ceil",
                 "--requantize-from", str(root / "bf16")]) == 0
    for name in ("w8a8", "w8a8-pow2"):
        assert main(["capture", "--model", str(root / name), "--prompts", str(root / "set"), "--quiet",
                     "--out", str(root / f"cap-{name}")]) == 0
    assert main(["capture", "--model", str(root / "w8a8-pow2"), "--prompts", str(root / "set"), "--quiet",
                 "--tokens", "20", "--out", str(root / "cap-short")]) == 0
    return root


def test_the_checkpoint_treatment_also_allows_the_tensor_digest_that_follows_from_it():
    assert treatment_fields(["inputs.checkpoint"]) == ("predicate.inputs.checkpoint",
                                                        "predicate.parameters.model_tensors_digest")
    assert treatment_fields(["checkpoint"]) == treatment_fields(["inputs.checkpoint"])
    assert "predicate.parameters.model_tensors_digest" not in treatment_fields(["kernel"])


@needs_model_extra
def test_captures_of_a_checkpoint_and_its_pow2_rewrite_differ_only_in_the_checkpoint(captures):
    a, b = captures / "cap-w8a8", captures / "cap-w8a8-pow2"
    record = compare_manifests(a, b, ["inputs.checkpoint"])
    assert record.verified, record.problems
    assert "predicate.parameters.model_tensors_digest.sha256" in record.differing
    assert "predicate.inputs.checkpoint.digest.sha256" in record.differing
    assert main(["manifest", "verify", str(a), str(b), "--treatment", "inputs.checkpoint"]) == 0


@needs_model_extra
def test_without_the_checkpoint_treatment_both_checkpoint_fields_are_named(captures):
    problems = compare_manifests(captures / "cap-w8a8", captures / "cap-w8a8-pow2", ["kernel"]).problems
    assert any(p.startswith("field predicate.parameters.model_tensors_digest.sha256 differs") for p in problems)
    assert any(p.startswith("field predicate.inputs.checkpoint.digest.sha256 differs") for p in problems)


@needs_model_extra
def test_the_checkpoint_treatment_does_not_excuse_a_different_window_length(captures):
    problems = compare_manifests(captures / "cap-w8a8", captures / "cap-short", ["inputs.checkpoint"]).problems
    assert any(p.startswith("field predicate.parameters.tokens differs: A=24, B=20") for p in problems)
