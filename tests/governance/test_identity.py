"""The identity contract: only the declared treatment may differ between two arms' manifests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alibi.governance.identity import (
    IdentityViolation,
    compare_manifests,
    require_identity,
)
from alibi.governance.manifest import (
    build_predicate,
    resource,
    treatment_of,
    write_manifest,
)
from alibi.kernels.registry import get_kernel


@pytest.fixture()
def inputs(tmp_path) -> dict[str, Path]:
    folder = tmp_path / "inputs"
    (folder / "ckpt").mkdir(parents=True)
    (folder / "ckpt" / "model.safetensors").write_bytes(b"weights")
    (folder / "ckpt" / "config.json").write_text('{"quantization_config": {"format": "int-quantized"}}')
    (folder / "prompts.jsonl").write_text('{"prompt": "hello"}\n')
    (folder / "tokenizer.json").write_text('{"vocab": {}}')
    return {"checkpoint": folder / "ckpt", "prompts": folder / "prompts.jsonl", "tokenizer": folder / "tokenizer.json",
            "quantization_config": folder / "ckpt" / "config.json"}


def _arm(folder: Path, kernel: str, arm: str, inputs: dict[str, Path], output: bytes, *, seed: int = 0,
         created_at: str = "2026-01-01T00:00:00Z") -> Path:
    folder.mkdir(parents=True)
    (folder / "logits.bin").write_bytes(output)
    predicate = build_predicate(inputs={k: resource(k, p) for k, p in inputs.items()}, seed=seed,
                                treatment=treatment_of(get_kernel(kernel), arm),
                                parameters={"rows": 512, "runner": "capture"}, created_at=created_at)
    return write_manifest(folder, "capture", predicate)


def _edit(path: Path, change) -> None:
    statement = json.loads(path.read_text())
    change(statement["predicate"])
    path.write_text(json.dumps(statement, indent=2, sort_keys=True) + "\n")


@pytest.fixture()
def pair(tmp_path, inputs) -> tuple[Path, Path]:
    a = _arm(tmp_path / "a", "emulator:w_then_a", "a", inputs, b"output of a")
    b = _arm(tmp_path / "b", "emulator:a_then_w", "b", inputs, b"output of b", created_at="2026-02-02T00:00:00Z")
    return a, b


def test_manifests_differing_only_in_the_kernel_pass_the_contract(pair):
    record = compare_manifests(*pair, ["kernel"])
    assert record.verified, record.problems
    assert "predicate.treatment.kernel" in record.differing
    assert "predicate.treatment.epilogue_model" in record.differing
    assert not any("created_at" in d for d in record.differing)


def test_a_different_prompt_digest_fails_naming_the_field(pair):
    _edit(pair[1], lambda p: p["inputs"]["prompts"]["digest"].update(sha256="0" * 64))
    record = compare_manifests(*pair)
    assert not record.verified
    assert any(msg.startswith("field predicate.inputs.prompts.digest.sha256 differs") for msg in record.problems)


def test_a_different_checkpoint_digest_fails_naming_the_field(tmp_path, inputs):
    a = _arm(tmp_path / "a", "emulator:w_then_a", "a", inputs, b"out a")
    (inputs["checkpoint"] / "model.safetensors").write_bytes(b"other weights")
    b = _arm(tmp_path / "b", "emulator:a_then_w", "b", inputs, b"out b")
    record = compare_manifests(a, b)
    assert [m for m in record.problems if m.startswith("field predicate.inputs.checkpoint.digest.sha256 differs")]


@pytest.mark.parametrize("field", ["kernel", "kernel_build_digest", "epilogue_model"])
def test_missing_kernel_evidence_fails_naming_the_field(pair, field):
    _edit(pair[0], lambda p: p["treatment"].pop(field))
    record = compare_manifests(*pair)
    assert any(f"field predicate.treatment.{field} is missing: kernel evidence is required" in m
               for m in record.problems), record.problems


def test_a_kernel_that_declares_no_epilogue_model_lacks_evidence(pair):
    _edit(pair[1], lambda p: p["treatment"].update(epilogue_model=None))
    assert any("B (" in m and "predicate.treatment.epilogue_model is missing" in m
               for m in compare_manifests(*pair).problems)


def test_a_manifest_without_any_treatment_fails_the_contract(pair):
    _edit(pair[0], lambda p: p.update(treatment=None))
    assert any("field predicate.treatment is missing" in m for m in compare_manifests(*pair).problems)


def test_a_malformed_digest_fails_the_contract(pair):
    _edit(pair[0], lambda p: p["inputs"]["tokenizer"]["digest"].update(sha256="xyz"))
    assert any("field predicate.inputs.tokenizer.digest.sha256 is 'xyz'" in m for m in compare_manifests(*pair).problems)


def test_an_output_edited_after_its_manifest_fails_the_contract(pair):
    (pair[1].parent / "logits.bin").write_bytes(b"output of b, edited")
    assert any("file logits.bin: sha256 is" in m for m in compare_manifests(*pair).problems)


def test_a_kernel_difference_fails_when_nothing_is_declared_as_treatment(pair):
    record = compare_manifests(*pair, ["none"])
    assert any(m.startswith("field predicate.treatment.kernel differs") for m in record.problems)


def test_a_dotted_treatment_allows_that_field_and_nothing_else(tmp_path, inputs):
    a = _arm(tmp_path / "a", "emulator:w_then_a", "real", inputs, b"out a")
    (inputs["checkpoint"] / "model.safetensors").write_bytes(b"pow2 weights")
    b = _arm(tmp_path / "b", "emulator:w_then_a", "real", inputs, b"out b")
    assert compare_manifests(a, b, ["inputs.checkpoint"]).verified
    assert not compare_manifests(a, b, ["kernel"]).verified


def test_a_different_seed_or_environment_fails_naming_the_field(pair):
    _edit(pair[1], lambda p: (p.update(seed=1), p["environment"].update(gpus=[{"name": "H200", "capability": "9.0"}])))
    problems = compare_manifests(*pair).problems
    assert any(m.startswith("field predicate.seed differs: A=0, B=1") for m in problems)
    assert any(m.startswith("field predicate.environment.gpus") for m in problems)


def test_require_identity_refuses_unverified_inputs_unless_allowed_and_then_records_it(pair):
    _edit(pair[1], lambda p: p["parameters"].update(rows=1))
    with pytest.raises(IdentityViolation, match=r"field predicate.parameters.rows differs: A=512, B=1"):
        require_identity(*pair)
    record = require_identity(*pair, allow_unverified=True).as_dict()
    assert record["allow_unverified"] is True and record["verified"] is False
    assert record["problems"] == ["field predicate.parameters.rows differs: A=512, B=1"]
    assert record["contract"] == "alibi-identity/v1" and len(record["a"]["sha256"]) == 64


def test_require_identity_returns_a_record_to_embed_when_the_contract_holds(pair):
    record = require_identity(*pair, ["kernel"]).as_dict()
    assert record["verified"] is True and record["allow_unverified"] is False
    assert record["treatment"] == ["predicate.treatment"]


@pytest.mark.parametrize("subject", [5, None, {"name": "x.txt"}], ids=["number", "null", "object"])
def test_compare_manifests_reports_a_subject_that_is_not_a_list_instead_of_crashing(tmp_path, subject):
    """issue 16: a B manifest whose `subject` is not a list made the library (not only the CLI) raise:
    a number or null is not iterable (TypeError); an object iterated as its keys and was silently
    taken for a subject without names."""
    import json

    from alibi.governance.identity import compare_manifests
    from alibi.governance.manifest import build_predicate, write_manifest

    for arm in ("a", "b"):
        (tmp_path / arm).mkdir()
        (tmp_path / arm / "x.txt").write_text("x")
        write_manifest(tmp_path / arm, "report", build_predicate())
    doc = json.loads((tmp_path / "b" / "manifest.json").read_text())
    doc["subject"] = subject
    (tmp_path / "b" / "manifest.json").write_text(json.dumps(doc))
    record = compare_manifests(tmp_path / "a", tmp_path / "b", ("none",))
    assert not record.verified and any("subject" in p for p in record.problems)


def test_a_deeply_nested_manifest_is_one_input_error_not_a_recursion_error(tmp_path):
    import pytest

    from alibi.errors import InputError
    from alibi.governance.identity import compare_manifests

    (tmp_path / "manifest.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(InputError, match="nested (more than|too deeply)"):
        compare_manifests(tmp_path, tmp_path)
