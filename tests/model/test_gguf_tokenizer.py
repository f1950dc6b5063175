"""Tokenizer files from GGUF metadata: version-independent bytes, llama.cpp's pre-tokenizer."""

from __future__ import annotations

import json

import pytest

from alibi.errors import InputError
from alibi.model.tokenizer import tokenizer_files_from_gguf

BYTES = [chr(c) for c in range(ord("!"), ord("~") + 1)] + ["Ġ"]
META = {
    "general.architecture": "llama",
    "llama.context_length": 128,
    "tokenizer.ggml.model": "gpt2",
    "tokenizer.ggml.pre": "smollm",
    "tokenizer.ggml.tokens": ["<|endoftext|>", "<s>", "</s>"] + BYTES + ["Ġt", "he", "Ġthe", "12"],
    "tokenizer.ggml.token_type": [3, 3, 3] + [1] * (len(BYTES) + 4),
    "tokenizer.ggml.merges": ["Ġ t", "h e", "Ġt he", "1 2"],
    "tokenizer.ggml.bos_token_id": 1,
    "tokenizer.ggml.eos_token_id": 2,
}


def test_the_same_metadata_gives_the_same_bytes_and_the_special_tokens():
    a, b = tokenizer_files_from_gguf(META, "m"), tokenizer_files_from_gguf(dict(META), "m")
    assert a == b
    special = json.loads(a["special_tokens_map.json"])
    assert special == {"bos_token": "<s>", "eos_token": "</s>"}
    doc = json.loads(a["tokenizer.json"])
    assert [t["content"] for t in doc["added_tokens"]] == ["<|endoftext|>", "<s>", "</s>"]


def test_smollm_pre_tokenizer_splits_digits_before_merging():
    tokenizers = pytest.importorskip("tokenizers", reason="needs tokenizers (pip install 'integer-alibi[model]')")
    tok = tokenizers.Tokenizer.from_str(tokenizer_files_from_gguf(META, "m")["tokenizer.json"])
    ids = tok.encode(" the 12").ids
    vocab = META["tokenizer.ggml.tokens"]
    assert [vocab[i] for i in ids] == ["Ġthe", "Ġ", "1", "2"]  # "12" is never formed: digits are split first
    assert tok.decode(tok.encode("<s> the").ids, skip_special_tokens=False) == "<s> the"


def test_an_unsupported_tokenizer_kind_is_refused():
    with pytest.raises(InputError, match="tokenizer model 'llama' is not supported"):
        tokenizer_files_from_gguf({**META, "tokenizer.ggml.model": "llama"}, "m")
    with pytest.raises(InputError, match="pre-tokenizer 'qwen2' is not known"):
        tokenizer_files_from_gguf({**META, "tokenizer.ggml.pre": "qwen2"}, "m")
