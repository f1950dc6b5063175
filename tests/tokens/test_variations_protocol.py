"""The default protocol of `alibi variations` (issue 36 #5): a large batch holding the first prompt at its
first, middle and last rows, repeated decode in one process, and a cold restart at that batch.

Facts asserted: the batch layout and the default sizes; attention faults of the kind seen natively on the
H200 (one that varies only in large batches at decode, one that varies at one row only, one that varies
from run to run) fail the variation built for them, while the smaller batches hold, and the locator names
the attention core, the prompt and the row; the command records its sizes and says what a pass certifies;
a v1 variations.json is still read.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from tokens.conftest import needs_model_extra

from alibi.exact.numerics import bits

KERNEL = "emulator:a_then_w"
REPO = Path(__file__).resolve().parents[2]
ATTENTION = "model.layers.0.self_attn.attention"


def _ids(n: int = 4, length: int = 20) -> torch.Tensor:
    return torch.randint(3, 300, (n, length), generator=torch.Generator().manual_seed(0))


# --- sizes ------------------------------------------------------------------------------------------


def test_a_batch_of_64_over_8_prompts_holds_prompt_0_at_rows_0_31_63_and_every_other_prompt():
    from alibi.tokens.variations import batch_rows, rows_text

    rows = batch_rows(8, 64)
    assert [r for r, w in enumerate(rows) if w == 0] == [0, 31, 63]
    assert rows[1:8] == (1, 2, 3, 4, 5, 6, 7) and rows[8] == 1  # the others in order, then repeated
    assert sorted(set(rows)) == list(range(8)) and len(rows) == 64
    assert rows_text(rows) == ("one batch of 64 rows with prompt 0 at rows 0, 31, 63 and prompts 1–7 (repeated) in "
                               "the other 61 rows")


@pytest.mark.parametrize("n, batch, rows", [
    (4, 4, (0, 1, 2, 3)),      # as many rows as prompts: no room for needles, every prompt once
    (2, 3, (0, 1, 0)),         # one spare row: prompt 0 first and last
    (4, 6, (0, 1, 0, 2, 3, 0)),  # two spare rows: first, middle and last
    (1, 3, (0, 0, 0)),         # one prompt fills the batch
    (4, 2, None),              # fewer rows than prompts: consecutive groups
])
def test_batch_rows_never_leave_a_prompt_out_and_add_needles_only_in_spare_rows(n, batch, rows):
    from alibi.tokens.variations import batch_rows

    assert batch_rows(n, batch) == rows


@pytest.mark.parametrize("windows, device, sizes", [(8, "cuda", (2, 4, 64)), (64, "cuda", (2, 4, 66)),
                                                     (4, "cpu", (2, 4, 6)), (1, "cpu", (2, 3, 4))])
def test_the_default_large_batch_is_the_prompts_plus_two_needle_rows_and_at_least_64_on_cuda(windows, device, sizes):
    from alibi.tokens.variations import default_batch_sizes

    assert default_batch_sizes(windows, device) == sizes


# --- faults of the attention core -----------------------------------------------------------------------


def _fault_in_attention(monkeypatch, perturb) -> None:
    """Wrap the deterministic runner's attention function: `perturb(out)` sees its output [B, S, H, D]
    (the trace, which wraps whatever is registered, records the perturbed output as the attention core)."""
    from transformers import AttentionInterface

    from alibi.model.execution import ATTENTION_NAME

    original = AttentionInterface._global_mapping[ATTENTION_NAME]

    def faulty(module, query, key, value, attention_mask, *args, **kwargs):
        out, weights = original(module, query, key, value, attention_mask, *args, **kwargs)
        return perturb(out.clone()), weights

    monkeypatch.setitem(AttentionInterface._global_mapping, ATTENTION_NAME, faulty)


def _ulp_up(t: torch.Tensor) -> torch.Tensor:
    return (bits(t) + 1).view(t.dtype)


@needs_model_extra
def test_an_attention_core_that_varies_only_in_large_batches_at_decode_fails_the_large_batch_alone(tiny, monkeypatch):
    """The H200's native defect in small: decode steps of a batch of 6 or more rows get other bits (batches of
    2, 4 and 8 held there). Only the large batch of the default protocol catches it."""
    from alibi.model.runner import load_model
    from alibi.tokens.variations import certify_variations

    lm = load_model(tiny / "w8a8", KERNEL)
    _fault_in_attention(monkeypatch, lambda out: _ulp_up(out) if out.shape[0] >= 6 and out.shape[1] == 1 else out)
    results = {r.name: r for r in certify_variations(lm, _ids(), (0, 1, 2, 3), 12, chunk=5)}
    large = results["batch-size-6"]
    assert not large.holds and large.positions_identical == 0 and large.positions_compared == 6 * 8
    assert large.first_divergence["module"] == ATTENTION and large.first_divergence["kind"] == "attention-core"
    assert large.first_divergence["position"] == 12 and large.kernel_variant is False  # the first decode step
    assert all(results[n].holds for n in ("batch-size-2", "batch-size-4", "repeat", "batch-composition",
                                          "chunked-prefill", "prefill-vs-decode", "kv-cache-vs-recompute"))


@needs_model_extra
def test_an_attention_fault_at_the_last_row_only_is_named_at_the_needle_row(tiny, monkeypatch):
    """A fault at row B−1 of a batch of 6 or more: the first diverging row is prompt 0's needle at row 5."""
    from alibi.model.runner import load_model
    from alibi.tokens.variations import certify_variations

    lm = load_model(tiny / "w8a8", KERNEL)

    def last_row(out):
        if out.shape[0] >= 6 and out.shape[1] == 1:
            out[-1] = _ulp_up(out[-1])
        return out

    _fault_in_attention(monkeypatch, last_row)
    results = {r.name: r for r in certify_variations(lm, _ids(), (0, 1, 2, 3), 12, chunk=5, repeats=1)}
    large = results["batch-size-6"]
    assert not large.holds and large.positions_compared - large.positions_identical == 8  # one row of six
    d = large.first_divergence
    assert (d["prompt"], d["position"], d["row_a"], d["row_b"], d["module"]) == (0, 12, 0, 5, ATTENTION)
    assert results["batch-size-4"].holds and "repeat" not in results
    from alibi.tokens.variations import _where

    assert _where(d) == f"prompt 0, position 12 (row 0 vs row 5): `{ATTENTION}` (attention-core)"


class _TimeSeededUlp:
    """One element of each attention output, chosen by the clock, one ulp up: runs differ from each other."""

    def __call__(self, out):
        flat = out.reshape(-1)
        i = time.perf_counter_ns() % flat.numel()
        flat[i] = _ulp_up(flat[i:i + 1])[0]
        return out


@needs_model_extra
def test_a_nondeterministic_attention_core_fails_the_repeat_variation_and_is_named(tiny, monkeypatch):
    from alibi.model.runner import load_model
    from alibi.tokens.variations import certify_variations

    lm = load_model(tiny / "w8a8", KERNEL)
    _fault_in_attention(monkeypatch, _TimeSeededUlp())
    results = {r.name: r for r in certify_variations(lm, _ids(), (0, 1, 2, 3), 12, chunk=5)}
    repeat = results["repeat"]
    assert not repeat.holds and repeat.runs == 2 and repeat.execution_b == "decode@6 #2, decode@6 #3"
    assert repeat.first_divergence["kind"] == "attention-core" and repeat.first_divergence["call_a"] == 0


# --- the command ----------------------------------------------------------------------------------


@needs_model_extra
def test_the_default_run_records_its_sizes_restarts_at_the_large_batch_and_says_what_a_pass_certifies(tiny, tmp_path,
                                                                                                       capsys):
    """3 windows on the CPU: batches of 2, 4 and 5 (prompt 0 at rows 0, 2, 4), 3 runs of the batch of 5 and
    one more in a fresh process; every default variation holds with the deterministic runner."""
    from alibi.cli import main
    from alibi.tokens.variations import VariationsReport

    out = tmp_path / "v"
    assert main(["variations", "--model", str(tiny / "w8a8"), "--kernel", KERNEL, "--prompts", str(tiny / "set"),
                 "--context", "8", "--positions", "4", "--chunk", "4", "--quiet", "--out", str(out)]) == 0
    text = (out / "variations.json").read_text()
    r = VariationsReport.from_json(text)
    assert r.holds and r.schema == "alibi-variations/v2"
    assert (r.batch_sizes, r.large_batch, r.batch_rows, r.needle_rows, r.repeats, r.restart_batch) == \
        ((2, 4, 5), 5, (0, 1, 0, 2, 0), (0, 2, 4), 3, 5)
    v = {x.name: x for x in r.variations}
    assert (v["cold-restart"].batch_a, v["cold-restart"].batch_b, v["cold-restart"].positions_compared) == (5, 5, 5 * 4)
    assert v["batch-size-5"].certifies.startswith("each prompt alone and in one batch of 5 rows with prompt 0 at rows "
                                                  "0, 2, 4 and prompts 1–2 in the other 2 rows")
    printed = capsys.readouterr().out
    assert "batch 1 against batches of 2, 4, 5; at batch 5: one batch of 5 rows with prompt 0 at rows 0, 2, 4" \
        in printed
    assert "3 repeated decodes at batch 5 in one process; cold restart at batch 5" in printed
    assert "A pass certifies" in (out / "report.md").read_text()
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((REPO / "docs/schemas/alibi-variations.v2.schema.json").read_text())
    jsonschema.validate(json.loads(text), schema)


def test_a_v1_variations_file_is_read_with_each_variations_batches_from_its_executions():
    from alibi.tokens.variations import VariationsReport

    def variation(name, a, b):
        return {"name": name, "description": f"{name} (v1)", "execution_a": a, "execution_b": b,
                "positions_compared": 8, "positions_identical": 8, "first_divergence": None, "kernel_variant": None,
                "holds": True}

    doc = {"schema": "alibi-variations/v1", "kernel": "cutlass", "execution": {"deterministic": True}, "device": "cuda",
           "windows": [0, 1, 2, 3, 4, 5, 6, 7], "context": 64, "positions": 32, "batch_sizes": [2, 4, 8], "chunk": 16,
           "variations": [variation("cold-restart", "decode@8", "decode@8 (fresh process)"),
                          variation("batch-size-2", "decode@1", "decode@2"),
                          variation("batch-composition", "decode@8", "decode@8~"),
                          variation("chunked-prefill", "prefill", "chunked@16")],
           "holds": True, "seconds": 1.5}
    r = VariationsReport.from_json(json.dumps(doc))
    assert r.schema == "alibi-variations/v1" and (r.large_batch, r.repeats, r.restart_batch) == (8, 1, 8)
    assert r.batch_rows == () and r.needle_rows == ()
    assert [(v.batch_a, v.batch_b, v.runs) for v in r.variations] == [(8, 8, 1), (1, 2, 1), (8, 8, 1), (1, 1, 1)]
    assert r.variations[0].certifies == "cold-restart (v1)"
    from alibi.html.sections.variations import render_text

    assert "batch 8: the prompts in groups of 8, no needle rows" in render_text(json.dumps(doc), "v1.json").body

