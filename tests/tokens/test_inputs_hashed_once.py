"""A replay arm reads its checkpoint's weights once: the folder digest its manifest records comes from the
digests the checkpoint was just verified against."""

from __future__ import annotations

import shutil

import alibi.governance.manifest as manifest
from alibi.governance.manifest import resource
from alibi.model.checkpoint import verified_checkpoint
from alibi.tokens.setup import load_prompts, open_inputs


def test_a_verified_checkpoint_is_read_once_and_recorded_with_the_digest_of_its_whole_folder(tiny, tmp_path,
                                                                                                monkeypatch):
    model = tmp_path / "pinned"
    shutil.copytree(tiny / "w8a8", model)
    manifest.write_manifest(model, "checkpoint", {})  # pinned, as `alibi model prepare` pins its checkpoints
    expected = resource("checkpoint", model)  # the folder digest computed from the files themselves
    prompts = load_prompts(tiny / "set")
    hashed: list[str] = []
    real = manifest.sha256_file
    monkeypatch.setattr(manifest, "sha256_file", lambda p: hashed.append(str(p)) or real(p))
    inputs = open_inputs(model, prompts)
    weights = [p for p in hashed if p.endswith(".safetensors")]
    assert len(weights) == len(set(weights)) >= 1  # each weight file once
    assert inputs.resources["checkpoint"] == expected and inputs.checkpoint_verified


def test_an_unverified_checkpoint_has_no_folder_digest_to_reuse(tiny, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(tiny / "w8a8", bare)
    assert not (bare / "manifest.json").exists()  # the fixture's checkpoints carry no manifest
    checked = verified_checkpoint(bare)
    assert checked["verified"] is False and checked["folder_sha256"] is None
