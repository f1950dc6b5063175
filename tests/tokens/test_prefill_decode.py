"""Prefill vs decode on the tiny Llama: bitwise comparison and the first module whose bits differ."""

from __future__ import annotations

import torch

from alibi.exact.numerics import bits
from alibi.governance.manifest import read_manifest, verify_files
from alibi.tokens.prefill_decode import PrefillDecodeResult, module_kind, rows_differ

from .conftest import UlpUpAtDecode, needs_model_extra

LAYER = ["input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.q_rope",
         "self_attn.k_rope", "self_attn.attention", "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj",
         "mlp.act_fn", "mlp.up_proj", "mlp.down_proj"]
EXECUTION_ORDER = (["model.embed_tokens", "model.rotary_emb[0]", "model.rotary_emb[1]"]
                   + [f"model.layers.{i}.{m}" for i in range(2) for m in LAYER] + ["model.norm", "lm_head"])


def test_rows_differ_compares_bit_patterns_so_signed_zeros_differ():
    a = torch.tensor([[0.0, 1.0], [2.0, 3.0]], dtype=torch.bfloat16)
    b = torch.tensor([[-0.0, 1.0], [2.0, 3.0]], dtype=torch.bfloat16)
    assert rows_differ(a, b).tolist() == [True, False]


def test_module_kind_pools_a_module_over_layers():
    assert module_kind("model.layers.12.self_attn.attention") == "self_attn.attention"
    assert module_kind("model.norm") == "norm" and module_kind("lm_head") == "lm_head"


def _run(tiny, out, kernel, **kw):
    from alibi.tokens.prefill_decode import run_prefill_vs_decode

    return run_prefill_vs_decode(tiny / "w8a8", tiny / "set", out, kernel=kernel, **{"context": 16, "positions": 16, **kw})


@needs_model_extra
def test_modules_are_listed_in_execution_order_with_the_attention_core_inside(tiny, tmp_path):
    r = _run(tiny, tmp_path / "pvd", "torch-cpu", windows=1)
    assert list(r.module_order) == EXECUTION_ORDER and r.attention_core


@needs_model_extra
def test_differing_logits_are_always_attributed_and_lm_head_differs_exactly_there(tiny, tmp_path):
    r = _run(tiny, tmp_path / "pvd", "torch-cpu")
    assert r.n_positions == 3 * 16 == r.logits_identical + r.logits_differ
    # logits are lm_head's bf16 output widened exactly to fp32: their rows differ where lm_head's do
    assert r.module_differ_counts.get("lm_head", 0) == r.logits_differ
    assert r.unattributed == 0 and sum(r.first_module_counts.values()) == r.logits_differ
    # a token embedding is a row lookup: the same row in either regime
    assert "model.embed_tokens" not in r.module_differ_counts
    assert r.argmax_flips == sum(d.argmax_prefill != d.argmax_decode for d in r.positions_detail)
    assert [(d.window, d.position) for d in r.positions_detail] == [(w, p) for w in range(3) for p in range(16, 32)]
    stored = PrefillDecodeResult.from_json((tmp_path / "pvd" / "prefill_decode.json").read_text())
    assert stored == r
    assert verify_files(tmp_path / "pvd") == [] and read_manifest(tmp_path / "pvd").kind == "replay"


@needs_model_extra
def test_a_decode_only_kernel_fault_is_attributed_to_the_first_quantized_linear_at_every_position(tiny, tmp_path):
    """The fault fires only at M = 1, so the prefill regime never sees it and decode sees it first
    in the first quantized Linear of the model (layer 0's q_proj), whose input row — the input
    norm of the same embedding row — is the same in both regimes."""
    r = _run(tiny, tmp_path / "pvd", UlpUpAtDecode.name, windows=2, context=8, positions=8)
    assert r.n_positions == 16
    assert [d.first_module for d in r.positions_detail] == ["model.layers.0.self_attn.q_proj"] * 16
    assert r.module_differ_counts["model.layers.0.self_attn.q_proj"] == 16
    assert "model.layers.0.input_layernorm" not in r.module_differ_counts
    # the decode regime's 8-token prefill runs at M = 8: its rows hold no fault
    assert "model.layers.0.self_attn.q_proj" not in r.context_rows_differ


@needs_model_extra
def test_recording_every_module_changes_no_bit_of_either_regime(tiny):
    from alibi.model.prompts import load_prompt_set
    from alibi.model.runner import load_model
    from alibi.model.trace import ModuleTrace

    lm = load_model(tiny / "w8a8", "torch-cpu")
    ids = load_prompt_set(tiny / "set").input_ids[1, :30]
    plain_prefill, plain_decode = lm.logits(ids.reshape(1, -1))[0], lm.incremental_logits(ids, 12)
    with ModuleTrace(lm) as rec:
        hooked_prefill, hooked_decode = lm.logits(ids.reshape(1, -1))[0], lm.incremental_logits(ids, 12)
    assert torch.equal(bits(plain_prefill), bits(hooked_prefill)) and torch.equal(bits(plain_decode), bits(hooked_decode))
    assert rec.attention_core and len(rec.order) == len(EXECUTION_ORDER)


@needs_model_extra
def test_the_attention_function_is_restored_after_recording(tiny):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from alibi.model.runner import load_model
    from alibi.model.trace import ModuleTrace

    lm = load_model(tiny / "w8a8", "torch-cpu")
    impl = lm.model.config._attn_implementation
    before = ALL_ATTENTION_FUNCTIONS[impl]
    with ModuleTrace(lm):
        assert ALL_ATTENTION_FUNCTIONS[impl] is not before
    assert ALL_ATTENTION_FUNCTIONS[impl] is before
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in lm.model.modules())


@needs_model_extra
def test_decoding_with_no_step_after_the_prefill_is_the_prefill_bit_for_bit(tiny):
    """With `prefill_tokens` equal to the window, the decode regime is one prefill that also fills
    the cache; filling the cache changes no arithmetic."""
    from alibi.model.prompts import load_prompt_set
    from alibi.model.runner import load_model

    lm = load_model(tiny / "w8a8", "torch-cpu")
    ids = load_prompt_set(tiny / "set").input_ids[2, :24]
    assert torch.equal(bits(lm.incremental_logits(ids, 24)), bits(lm.logits(ids.reshape(1, -1))[0]))
