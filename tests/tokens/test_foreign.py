"""The two record shapes another tool publishes, read from fixtures, through the same statistics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alibi.cli import main
from alibi.errors import InputError
from alibi.governance.identity import IdentityViolation
from alibi.governance.manifest import read_manifest, verify_files
from alibi.tokens.arms import read_arm
from alibi.tokens.flips import analyze_flips, read_flips
from alibi.tokens.steps import ENVELOPE_SHAPE, LIST_SHAPE

from .builders import KERNEL_A, records_from, write_arm
from .builders import inputs as make_inputs

FIXTURES = Path(__file__).parent / "fixtures"
LIST_A, LIST_B = FIXTURES / "list_arm_a.json", FIXTURES / "list_arm_b.json"
ENV_A, ENV_B = FIXTURES / "envelope_arm_a.json", FIXTURES / "envelope_arm_b.json"
ENV_B_OTHER = FIXTURES / "envelope_arm_b_other_checkpoint.json"

# Both fixture pairs hold the same 8 positions: A's margins 0.1 2.0 5.0 0.3 | 4.0 0.2 3.0 6.0 and
# flips at 0.1, 0.2 and 3.0. AUC: the flips at 0.1 and 0.2 outrank all 5 non-flips, the one at 3.0
# outranks 4.0, 5.0, 6.0: 13 of 15 pairs. AP over margin order F F N N F N N N: (1 + 1 + 3/5)/3 = 13/15.
FIXTURE_FLIPS, FIXTURE_AUC = 3, 13 / 15


def test_the_list_shape_reads_one_step_per_position_keyed_by_prompt_index():
    arm = read_arm(LIST_A)
    assert arm.shape == LIST_SHAPE and arm.kernel is None and arm.manifest_path is None
    assert [s.key for s in arm.steps] == [(p, i) for p in (0, 1) for i in range(4)]
    assert [s.margin for s in arm.steps] == [0.1, 2.0, 5.0, 0.3, 4.0, 0.2, 3.0, 6.0]
    assert arm.steps[2].forced_id == 40 and arm.steps[2].top1_id == 12  # chosen_id is the forced token


def test_the_envelope_shape_reads_steps_keyed_by_prompt_sha_and_keeps_its_manifest():
    arm = read_arm(ENV_B)
    assert arm.shape == ENVELOPE_SHAPE and arm.kernel == "TritonInt8ScaledMMLinearKernel"
    assert arm.prompts == ("6f" * 32, "5e" * 32)  # B lists its records in the other order
    assert arm.envelope_manifest["vllm_version"] == "0.27.1"
    assert all(s.forced_id is None for s in arm.steps)  # the envelope's steps carry no chosen_id


def test_list_shape_arms_carry_no_identity_and_need_allow_unverified(tmp_path):
    with pytest.raises(IdentityViolation, match="carries no identity.*pass --allow-unverified"):
        analyze_flips(LIST_A, LIST_B, tmp_path / "out", bootstrap=50)
    assert not (tmp_path / "out").exists()


def test_list_shape_arms_give_the_hand_computed_statistics_when_unverified_is_allowed(tmp_path):
    fa = analyze_flips(LIST_A, LIST_B, tmp_path / "out", bootstrap=50, allow_unverified=True)
    assert (fa.n_positions, fa.n_flips, fa.flip_rate, fa.n_prompts) == (8, FIXTURE_FLIPS, 3 / 8, 2)
    assert fa.roc_auc == pytest.approx(FIXTURE_AUC, rel=1e-12)  # 13/15 reached through fp64 trapezoids
    assert fa.average_precision == pytest.approx(13 / 15, rel=1e-12)
    assert fa.identity.method == "none" and not fa.identity.verified and fa.identity.allow_unverified
    assert read_flips(tmp_path / "out") == fa
    m = read_manifest(tmp_path / "out")
    assert m.predicate["arms"] is None and m.predicate["parameters"]["allow_unverified"] is True
    assert verify_files(tmp_path / "out") == []


def test_two_envelopes_join_on_prompt_sha_and_pass_the_identity_contract(tmp_path):
    fa = analyze_flips(ENV_A, ENV_B, tmp_path / "out", bootstrap=50)
    assert fa.identity.method == "envelope-manifest" and fa.identity.verified and not fa.identity.allow_unverified
    assert set(fa.identity.differing) == {
        "manifest.arm", "manifest.kernel_class", "manifest.kernel_selection_env.VLLM_DISABLED_KERNELS",
        "manifest.kernel_log_sha256", "manifest.kernel_log_lines[0]", "manifest.command_sha256"}
    # the same positions and flips as the list fixtures, although B's records come in the other order
    assert (fa.n_positions, fa.n_flips, fa.n_only_a, fa.n_only_b) == (8, FIXTURE_FLIPS, 0, 0)
    assert fa.roc_auc == pytest.approx(FIXTURE_AUC, rel=1e-12)
    assert fa.arm_a.kernel == "CutlassInt8ScaledMMLinearKernel"


def test_envelopes_from_different_checkpoints_exit_1_naming_the_field(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["analyze", "flips", str(ENV_A), str(ENV_B_OTHER), "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "field manifest.checkpoint_digest differs" in err[0]
    assert not out.exists()


def _envelope(tmp_path: Path, name: str, change) -> Path:
    doc = json.loads(ENV_B.read_text())
    change(doc)
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_an_envelope_without_an_identity_field_breaks_the_contract(tmp_path):
    b = _envelope(tmp_path, "b.json", lambda d: d["manifest"].pop("tokenizer_files_sha256"))
    with pytest.raises(IdentityViolation, match=r"field manifest.tokenizer_files_sha256 is missing from B"):
        analyze_flips(ENV_A, b, tmp_path / "out", bootstrap=10)


def test_an_envelope_with_an_extra_manifest_field_breaks_the_contract(tmp_path):
    b = _envelope(tmp_path, "b.json", lambda d: d["manifest"].update(batch_size=8))
    with pytest.raises(IdentityViolation, match=r"field manifest.batch_size: B has 8, A has no such field"):
        analyze_flips(ENV_A, b, tmp_path / "out", bootstrap=10)


def test_a_non_finite_margin_in_a_foreign_file_is_refused_naming_prompt_step_and_field(tmp_path, capsys):
    text = LIST_B.read_text().replace('"margin": 0.05', '"margin": NaN')
    bad = tmp_path / "b.json"
    bad.write_text(text)
    assert main(["analyze", "flips", str(LIST_A), str(bad), "--out", str(tmp_path / "out"), "--allow-unverified",
                 "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "prompt 0, step 0: margin is nan, not a finite number" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("change, message", [
    (lambda d: d[1][2].pop("top1_id"), "prompt 1, step 2: lacks the field 'top1_id'"),
    (lambda d: d[0][1].update(pos=1.5), "prompt 0, step 1: pos is 1.5, not a non-negative integer"),
    (lambda d: d[0][3].update(margin=-0.3), "prompt 0, step 3: margin -0.3 is negative"),
    (lambda d: d.__setitem__(0, {"pos": 0}), "prompt 0: is not a list of step records"),
])
def test_a_malformed_list_shape_record_is_refused_naming_where(tmp_path, change, message):
    doc = json.loads(LIST_A.read_text())
    change(doc)
    bad = tmp_path / "a.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=message):
        read_arm(bad)


def test_an_envelope_cannot_be_joined_with_a_window_keyed_arm(tmp_path):
    arm = write_arm(tmp_path / "arm", records_from([[0.1, 0.2]], [[False, True]], arm="a"), kernel=KERNEL_A,
                    arm="a", inputs=make_inputs(tmp_path / "in"))
    with pytest.raises(InputError, match="name prompts differently"):
        analyze_flips(arm, ENV_B, tmp_path / "out", bootstrap=10, allow_unverified=True)


def test_a_json_file_of_no_known_shape_is_refused_listing_the_shapes(tmp_path):
    odd = tmp_path / "odd.json"
    odd.write_text('{"rows": []}')
    with pytest.raises(InputError, match="not a records file of a known shape"):
        read_arm(odd)
