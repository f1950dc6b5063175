"""A tiny hand-built Llama workspace for the replay tests (no downloads; a few seconds to build)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from faulty_kernels import Reference

from alibi.exact.numerics import bits

needs_model_extra = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("tokenizers") is None,
    reason="needs transformers and tokenizers (pip install 'integer-alibi[model]')")

CORPUS = " ".join(f"Line {i}: the quick brown fox {i % 5} jumps over the lazy dog." for i in range(400))
OTHER_CORPUS = " ".join(f"Row {i}: a lazy dog {i % 3} sleeps under the quick brown fox." for i in range(400))


class UlpUpAtDecode(Reference):
    """A correct kernel (exact accumulator, a_then_w) except at M = 1, where it adds one to the bit
    pattern of every output element: a decode-only (M-dependent) fault."""

    name = "test:ulp-up-at-m1"

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        out = super().scaled_mm(a_q, s_a, w_q, s_w, bias, out_dtype)
        return (bits(out) + 1).view(out.dtype) if a_q.shape[0] == 1 else out


class ReferenceKernel(Reference):
    name = "test:reference"


@pytest.fixture(scope="session", autouse=True)
def test_kernels():
    """Register the in-process test kernels (library calls only: fresh processes do not see them)."""
    from alibi.kernels import registry

    registry.register(UlpUpAtDecode.name, UlpUpAtDecode)
    registry.register(ReferenceKernel.name, ReferenceKernel)
    yield


def _checkpoint(root: Path, name: str, seed: int, tok: dict[str, bytes]) -> Path:
    from model.builders import TINY_LLAMA, tiny_dense_tensors

    from alibi.io import atomic
    from alibi.model.checkpoint import write_checkpoint
    from alibi.model.compressed_tensors import quantize_dense

    dense = tiny_dense_tensors(seed=seed)
    ckpt = quantize_dense(TINY_LLAMA, dense)
    with atomic.staged_dir(root / name) as stage:
        write_checkpoint(stage, ckpt.config, ckpt.tensors(), tok)
    with atomic.staged_dir(root / f"{name}-bf16") as stage:
        write_checkpoint(stage, TINY_LLAMA, dense, tok)
    return root / name


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Path:
    """root/w8a8 (+ w8a8-bf16, its dense source), root/w8a8-seed8 (another checkpoint with the same
    tokenizer), root/set (3 windows × 48 tokens) and root/other-set (3 × 48 from another text)."""
    from model.builders import write_tiny_tokenizer

    from alibi.cli import main

    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("tokenizers") is None:
        pytest.skip("needs transformers and tokenizers (pip install 'integer-alibi[model]')")
    root = tmp_path_factory.mktemp("replay-tiny")
    write_tiny_tokenizer(root / "tok", CORPUS)
    tok = {"tokenizer.json": (root / "tok" / "tokenizer.json").read_bytes()}
    _checkpoint(root, "w8a8", 7, tok)
    _checkpoint(root, "w8a8-seed8", 8, tok)
    for name, text in (("set", CORPUS), ("other-set", OTHER_CORPUS)):
        (root / f"{name}.txt").write_text(text)
        assert main(["prompts", "build", "--text", str(root / f"{name}.txt"), "--tokenizer", str(root / "w8a8"),
                     "--windows", "3", "--tokens", "48", "--out", str(root / name)]) == 0
    return root
