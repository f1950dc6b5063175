"""Teacher-forced arms on the tiny Llama: what each record holds, and the identity contract between arms."""

from __future__ import annotations

import math

import pytest
import torch

from alibi.governance.identity import IdentityViolation, require_identity
from alibi.governance.manifest import read_manifest, verify_files
from alibi.tokens.records import logits_sha256, read_records, window_sha256
from alibi.tokens.teacher_forced import score_rows

from .conftest import needs_model_extra


def test_score_rows_takes_the_first_maximum_and_gives_a_tie_zero_margin():
    rows = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 1.0, 2.0, 0.0]], dtype=torch.float32)
    s = score_rows(rows, torch.tensor([0, 2]))
    assert s.top1_id.tolist() == [1, 0]
    assert s.margin.tolist() == [0.0, 3.0]
    assert s.top1_logprob[0] == s.top2_logprob[0]
    # log-softmax against float64 arithmetic; fp32 rounding of values of magnitude < 8 is below 1e-6
    for i, forced in enumerate((0, 2)):
        lse = math.log(sum(math.exp(v) for v in rows[i].double().tolist()))
        assert abs(float(s.forced_logprob[i]) - (float(rows[i, forced]) - lse)) < 1e-6
        assert abs(float(s.top2_logprob[i]) - (sorted(rows[i].tolist())[-2] - lse)) < 1e-6


def _arm(tiny, out, kernel, *, model="w8a8", prompts="set", **kw):
    from alibi.tokens.teacher_forced import run_teacher_forced

    return run_teacher_forced(tiny / model, tiny / prompts, out, kernel=kernel, **{"context": 20, "positions": 12, **kw})


@needs_model_extra
def test_each_record_scores_the_pinned_token_from_the_row_that_saw_only_its_prefix(tiny, tmp_path):
    from alibi.model.prompts import load_prompt_set
    from alibi.model.runner import load_model

    arm = _arm(tiny, tmp_path / "a", "torch-cpu", windows=2)
    ids = load_prompt_set(tiny / "set").input_ids
    lm = load_model(tiny / "w8a8", "torch-cpu")
    assert [(r.window, r.position) for r in arm.records] == [(w, p) for w in (0, 1) for p in range(20, 32)]
    for w in (0, 1):
        logits = lm.logits(ids[w, :32].reshape(1, -1))[0]
        for r in (r for r in arm.records if r.window == w):
            assert r.prompt_sha256 == window_sha256(ids[w])
            assert r.forced_id == int(ids[w, r.position])
            assert r.logits_sha256 == logits_sha256(logits[r.position - 1])  # row p-1 predicts token p
            assert r.top1_logprob >= r.top2_logprob and r.margin >= 0


@needs_model_extra
def test_arm_folder_is_a_verified_replay_artifact_that_reads_back_equal(tiny, tmp_path):
    arm = _arm(tiny, tmp_path / "a", "torch-cpu", windows=1, arm="cpu-arm")
    assert read_records(tmp_path / "a") == arm
    assert verify_files(tmp_path / "a") == []
    m = read_manifest(tmp_path / "a")
    assert m.kind == "replay" and set(m.predicate["inputs"]) == {"checkpoint", "prompts", "tokenizer"}
    assert m.predicate["treatment"]["arm"] == "cpu-arm" and m.predicate["treatment"]["kernel"] == "torch-cpu"
    assert m.predicate["parameters"]["windows"] == [0] and m.predicate["parameters"]["fed_tokens"] == 32


@needs_model_extra
def test_pow2_scales_make_both_epilogue_orders_give_bitwise_identical_logits_at_every_position(tiny, tmp_path):
    from alibi.model.pow2_rewrite import pow2_rewrite

    pow2_rewrite(tiny / "w8a8", tmp_path / "pow2", "ceil", requantize_from=tiny / "w8a8-bf16")
    a = _arm(tiny, tmp_path / "a", "torch-cpu", model=tmp_path / "pow2")        # w_then_a
    b = _arm(tiny, tmp_path / "b", "emulator:a_then_w", model=tmp_path / "pow2")
    assert len(a.records) == 3 * 12
    assert [r.logits_sha256 for r in a.records] == [r.logits_sha256 for r in b.records]


@needs_model_extra
def test_a_kernel_one_ulp_off_in_every_gemm_changes_the_logits(tiny, tmp_path):
    from faulty_kernels import OneUlpUp

    from alibi.kernels import registry

    registry.register("test:one-ulp-up", OneUlpUp)
    a = _arm(tiny, tmp_path / "a", "test:reference", windows=1)
    b = _arm(tiny, tmp_path / "b", "test:one-ulp-up", windows=1)
    assert sum(x.logits_sha256 != y.logits_sha256 for x, y in zip(a.records, b.records)) > 0


@needs_model_extra
def test_arms_differing_only_in_kernel_pass_the_identity_contract(tiny, tmp_path):
    _arm(tiny, tmp_path / "a", "torch-cpu", arm="a", windows=2)
    _arm(tiny, tmp_path / "b", "emulator:a_then_w", arm="b", windows=2)
    record = require_identity(tmp_path / "a", tmp_path / "b", treatment=("kernel",))
    assert record.verified and "predicate.treatment.kernel" in record.differing


@needs_model_extra
@pytest.mark.parametrize("other, field", [({"model": "w8a8-seed8"}, "predicate.inputs.checkpoint.digest.sha256"),
                                          ({"prompts": "other-set"}, "predicate.inputs.prompts.digest.sha256"),
                                          ({"windows": 1}, "predicate.parameters.windows")])
def test_arms_on_another_checkpoint_prompt_set_or_span_fail_the_contract_naming_the_field(tiny, tmp_path, other, field):
    _arm(tiny, tmp_path / "a", "torch-cpu", arm="a", windows=2)
    _arm(tiny, tmp_path / "b", "emulator:a_then_w", arm="b", **{"windows": 2, **other})
    with pytest.raises(IdentityViolation, match=field.replace(".", r"\.")):
        require_identity(tmp_path / "a", tmp_path / "b", treatment=("kernel",))


@needs_model_extra
def test_a_kernel_that_produces_nan_is_refused_naming_the_position_and_nothing_is_written(tiny, tmp_path):
    from faulty_kernels import Reference

    from alibi.errors import InputError
    from alibi.kernels import registry

    class NanKernel(Reference):
        name = "test:nan"

        def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
            return torch.full((a_q.shape[0], w_q.shape[0]), float("nan"), dtype=out_dtype)

    registry.register(NanKernel.name, NanKernel)
    with pytest.raises(InputError, match=r"window 0 position 20: test:nan produced non-finite logits"):
        _arm(tiny, tmp_path / "a", NanKernel.name, windows=1)
    assert list(tmp_path.iterdir()) == []
