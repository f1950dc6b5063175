"""`analyze_flips` on constructed alibi arms: the join, the identity gate, the typed result and its folder."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from alibi.errors import InputError
from alibi.governance.identity import IdentityViolation
from alibi.governance.manifest import read_manifest, verify_files
from alibi.tokens.flips import (
    FLIPS_FILE,
    SCHEMA,
    FlipAnalysis,
    analyze_flips,
    read_flips,
)

from .builders import (
    KERNEL_A,
    KERNEL_B,
    inputs,
    record,
    records_from,
    write_arm,
    write_pair,
)


def _margins(prompts: int, per_prompt: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    margin = rng.exponential(3.0, (prompts, per_prompt)).round(6)
    flip = rng.random((prompts, per_prompt)) < 0.5 * np.exp(-margin)
    return margin.tolist(), flip.tolist()


def test_two_arms_give_a_flips_json_a_summary_and_a_manifest_that_verifies(tmp_path):
    margins, flips = _margins(6, 30)
    a, b = write_pair(tmp_path, margins, flips)
    fa = analyze_flips(a, b, tmp_path / "out", seed=3, bootstrap=200)
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["flips.json", "flips.md", "manifest.json"]
    assert verify_files(out) == []
    m = read_manifest(out)
    assert m.kind == "flip-analysis" and m.predicate["seed"] == 3
    assert m.predicate["arms"]["a"]["kernel"] == KERNEL_A and m.predicate["arms"]["b"]["kernel"] == KERNEL_B
    assert set(m.predicate["inputs"]) == {"arm_a", "arm_b"}
    assert fa.n_positions == 180 and fa.n_flips == sum(map(sum, flips)) > 0
    assert fa.flip_rate == fa.n_flips / 180
    assert (fa.seed, fa.bootstrap, fa.schema) == (3, 200, SCHEMA)
    assert fa.identity.method == "alibi-manifest" and fa.identity.verified
    assert "predicate.treatment.kernel" in fa.identity.differing
    assert fa.arm_a.records_sha256 == json.loads((out / FLIPS_FILE).read_text())["arm_a"]["records_sha256"]
    assert read_flips(out) == fa
    assert "# Flip analysis" in (out / "flips.md").read_text()


def test_the_same_seed_gives_the_same_flips_json_and_another_seed_other_intervals(tmp_path):
    margins, flips = _margins(8, 25, seed=1)
    a, b = write_pair(tmp_path, margins, flips)
    one = analyze_flips(a, b, tmp_path / "one", seed=11, bootstrap=200)
    two = analyze_flips(a, b, tmp_path / "two", seed=11, bootstrap=200)
    other = analyze_flips(a, b, tmp_path / "other", seed=12, bootstrap=200)
    assert (tmp_path / "one" / FLIPS_FILE).read_bytes() == (tmp_path / "two" / FLIPS_FILE).read_bytes()
    assert one.roc_auc == other.roc_auc and one.roc_auc_ci90 != other.roc_auc_ci90
    assert one == two


def test_positions_in_one_arm_only_are_counted_not_joined(tmp_path):
    ins = inputs(tmp_path / "in")
    common = records_from([[0.1, 2.0, 3.0]], [[True, False, False]], arm="a")
    # same declared run parameters (positions=6), so the identity contract holds; the records differ
    a = write_arm(tmp_path / "a", [*common, record(0, 7, 5, 1.0), record(0, 8, 5, 1.5)], kernel=KERNEL_A, arm="a",
                  inputs=ins, positions=6)
    b_records = records_from([[0.1, 2.0, 3.0]], [[True, False, False]], arm="b")
    b = write_arm(tmp_path / "b", [*b_records, record(0, 9, 5, 0.5)], kernel=KERNEL_B, arm="b", inputs=ins,
                  positions=6)
    fa = analyze_flips(a, b, tmp_path / "out", bootstrap=20)
    assert (fa.n_positions, fa.n_only_a, fa.n_only_b, fa.n_flips) == (3, 2, 1, 1)


def test_bitwise_identical_logits_are_counted_where_both_arms_record_them(tmp_path):
    ins = inputs(tmp_path / "in")
    same, other = "a" * 64, "b" * 64
    a = write_arm(tmp_path / "a", [record(0, 4, 5, 1.0, logits=same), record(0, 5, 5, 2.0, logits=same),
                                   record(0, 6, 5, 0.5, logits=same), record(0, 7, 5, 0.7)],
                  kernel=KERNEL_A, arm="a", inputs=ins)
    b = write_arm(tmp_path / "b", [record(0, 4, 5, 1.0, logits=same), record(0, 5, 5, 2.0, logits=other),
                                   record(0, 6, 6, 0.5, logits=same), record(0, 7, 5, 0.7, logits=same)],
                  kernel=KERNEL_B, arm="b", inputs=ins)
    fa = analyze_flips(a, b, tmp_path / "out", bootstrap=20)
    assert (fa.logits_compared, fa.logits_identical) == (3, 2)
    assert fa.status("logits_identical").status == "ok"


def test_identical_logits_everywhere_is_the_pow2_prediction_and_reads_as_zero_flips(tmp_path):
    ins = inputs(tmp_path / "in")
    recs = [record(w, p, 5, 0.5 + p, logits=f"{w}{p}".rjust(64, "0")) for w in range(2) for p in range(4, 30)]
    a = write_arm(tmp_path / "a", recs, kernel=KERNEL_A, arm="a", inputs=ins)
    b = write_arm(tmp_path / "b", recs, kernel=KERNEL_B, arm="b", inputs=ins)
    fa = analyze_flips(a, b, tmp_path / "out", bootstrap=20)
    assert (fa.n_flips, fa.logits_identical, fa.logits_compared) == (0, 52, 52)
    assert fa.roc_auc is None and fa.status("roc_auc").status == "undefined"
    assert fa.max_flip_margin is None and fa.status("max_flip_margin").reason == "no flip"
    assert fa.brier_baseline == 0.0  # calibration is still defined: every probability is 1/(n+2)


def _no_nan(text: str) -> None:
    json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in flips.json"))


def test_a_single_prompt_gives_status_records_not_nan(tmp_path):
    margins, flips = _margins(1, 40, seed=2)
    flips[0][0], flips[0][1] = True, False
    a, b = write_pair(tmp_path, margins, flips)
    fa = analyze_flips(a, b, tmp_path / "out", bootstrap=20)
    _no_nan((tmp_path / "out" / FLIPS_FILE).read_text())
    assert fa.roc_auc is not None and fa.roc_auc_ci90 is None
    for name in ("roc_auc_ci90", "lopo_auc", "calibration", "brier_heldout_ci90"):
        s = fa.status(name)
        assert s.status == "undefined" and s.reason.startswith("one prompt"), (name, s)
    assert fa.brier_heldout is None and fa.bins == () and fa.lopo_auc is None


@pytest.mark.parametrize("flipped", [False, True])
def test_no_flip_or_all_flips_give_status_records_not_nan(tmp_path, flipped):
    margins, _ = _margins(4, 30, seed=3)
    a, b = write_pair(tmp_path, margins, [[flipped] * 30 for _ in range(4)])
    fa = analyze_flips(a, b, tmp_path / "out", bootstrap=20)
    _no_nan((tmp_path / "out" / FLIPS_FILE).read_text())
    assert fa.flip_rate == (1.0 if flipped else 0.0)
    for name in ("roc_auc", "roc_auc_ci90", "average_precision", "lopo_auc"):
        assert fa.status(name).status == "undefined"
        assert getattr(fa, name) is None
    assert all(math.isfinite(x) for x in (fa.brier_heldout, fa.brier_baseline, fa.brier_isotonic))


def test_a_different_checkpoint_breaks_the_identity_contract_naming_the_field(tmp_path):
    margins, flips = _margins(2, 10)
    a = write_arm(tmp_path / "a", records_from(margins, flips, arm="a"), kernel=KERNEL_A, arm="a",
                  inputs=inputs(tmp_path / "in-a"))
    b = write_arm(tmp_path / "b", records_from(margins, flips, arm="b"), kernel=KERNEL_B, arm="b",
                  inputs=inputs(tmp_path / "in-b", checkpoint=b"other weights"))
    with pytest.raises(IdentityViolation, match=r"field predicate.inputs.checkpoint.digest.sha256 differs") as exc:
        analyze_flips(a, b, tmp_path / "out", bootstrap=20)
    assert exc.value.exit_code == 1
    assert not (tmp_path / "out").exists()
    fa = analyze_flips(a, b, tmp_path / "out", bootstrap=20, allow_unverified=True)
    assert not fa.identity.verified and fa.identity.allow_unverified
    assert fa.identity.record["allow_unverified"] is True
    assert any("inputs.checkpoint" in p for p in fa.identity.problems)
    assert "UNVERIFIED" in (tmp_path / "out" / "flips.md").read_text()


@pytest.mark.parametrize("allow_unverified", [False, True])
def test_an_edited_records_file_is_refused_before_it_is_read_even_with_allow_unverified(tmp_path, allow_unverified):
    """Issue 36 #1: an arm whose records fail its manifest is not an identity question (which
    --allow-unverified may waive) but a changed result: refused, naming the file, nothing written."""
    margins, flips = _margins(2, 10)
    a, b = write_pair(tmp_path, margins, flips)
    records = b / "records.json"
    records.write_text(records.read_text().replace('"top1_id": 7', '"top1_id": 8', 1))
    with pytest.raises(InputError, match=f"^{records}: fails its manifest .*file records.json: sha256 is"):
        analyze_flips(a, b, tmp_path / "out", bootstrap=20, allow_unverified=allow_unverified)
    assert not (tmp_path / "out").exists()


def test_an_output_folder_inside_or_around_an_arm_is_refused(tmp_path):
    margins, flips = _margins(2, 10)
    a, b = write_pair(tmp_path, margins, flips)
    for out in (a / "flips", a, tmp_path):
        with pytest.raises(InputError, match="overlaps the input"):
            analyze_flips(a, b, out, bootstrap=20)
    assert verify_files(a) == [] and sorted(p.name for p in a.iterdir()) == ["manifest.json", "records.json"]


def test_a_flips_json_with_inconsistent_counts_or_a_missing_field_is_refused(tmp_path):
    margins, flips = _margins(3, 20)
    a, b = write_pair(tmp_path, margins, flips)
    text = analyze_flips(a, b, tmp_path / "out", bootstrap=20).to_json()
    doc = json.loads(text)
    doc["flip_rate"] = doc["flip_rate"] / 2
    with pytest.raises(InputError, match="are inconsistent"):
        FlipAnalysis.from_json(json.dumps(doc))
    doc = json.loads(text)
    del doc["roc_auc"]
    with pytest.raises(InputError, match="missing field 'roc_auc' of FlipAnalysis"):
        FlipAnalysis.from_json(json.dumps(doc))
    doc = json.loads(text)
    doc["bins"][0]["n_calibration"] = "20"
    with pytest.raises(InputError, match=r"flips.json.bins\[0\].n_calibration: expected an integer"):
        FlipAnalysis.from_json(json.dumps(doc))
    with pytest.raises(InputError, match="schema is 'alibi-flips/v0', expected 'alibi-flips/v1'"):
        FlipAnalysis.from_json(json.dumps({**json.loads(text), "schema": "alibi-flips/v0"}))
