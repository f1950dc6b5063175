"""Fixtures shared by the model tests."""

from __future__ import annotations

import pytest

from .builders import tiny_dense_tensors, write_llm_compressor_style


@pytest.fixture(scope="session")
def tiny_w8a8(tmp_path_factory):
    """A W8A8 checkpoint of the tiny Llama (two layers, hidden 64, vocabulary 320), one shard."""
    folder = tmp_path_factory.mktemp("tiny-w8a8") / "w8a8"
    write_llm_compressor_style(folder, tiny_dense_tensors(seed=3), shards=1)
    return folder
