"""Manifests: in-toto Statement v1 shape, deterministic bytes, and detection of any changed byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alibi.errors import InputError
from alibi.governance.manifest import (
    STATEMENT_TYPE,
    TIMESTAMP_FIELD,
    build_predicate,
    digest_tree,
    read_manifest,
    resource,
    sha256_bytes,
    strip_timestamp,
    treatment_of,
    verify_files,
    write_manifest,
)
from alibi.kernels.registry import get_kernel


def _artifact(folder: Path) -> Path:
    (folder / "tiles").mkdir(parents=True)
    (folder / "tiles" / "b.safetensors").write_bytes(b"\x00\x01tile-b")
    (folder / "a.json").write_text('{"x": 1}\n')
    (folder / ".a.json.123.partial").write_text("staging leftover")
    return folder


def test_manifest_is_an_in_toto_statement_over_every_file_sorted_by_name(tmp_path):
    folder = _artifact(tmp_path / "art")
    path = write_manifest(folder, "tiles", build_predicate(seed=3))
    statement = json.loads(path.read_text())
    assert path == folder / "manifest.json"
    assert list(statement) == ["_type", "predicate", "predicateType", "subject"]
    assert statement["_type"] == STATEMENT_TYPE == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://integer-alibi.dev/tiles/v1"
    assert statement["subject"] == [
        {"name": "a.json", "digest": {"sha256": sha256_bytes(b'{"x": 1}\n')}},
        {"name": "tiles/b.safetensors", "digest": {"sha256": sha256_bytes(b"\x00\x01tile-b")}},
    ]
    assert read_manifest(folder).kind == "tiles"


def test_manifest_bytes_depend_only_on_content_so_reruns_compare_byte_for_byte(tmp_path):
    a, b = _artifact(tmp_path / "a"), _artifact(tmp_path / "b")
    pa = write_manifest(a, "report", build_predicate(seed=1, created_at="2026-01-01T00:00:00Z"))
    pb = write_manifest(b, "report", build_predicate(seed=1, created_at="2026-01-01T00:00:00Z"))
    assert pa.read_bytes() == pb.read_bytes()


def test_large_integers_keep_their_exact_value_unlike_protobuf_struct(tmp_path):
    folder = _artifact(tmp_path / "art")
    write_manifest(folder, "capture", build_predicate(seed=2**60 + 1, parameters={"rows": 512}))
    predicate = read_manifest(folder).predicate
    assert predicate["seed"] == 2**60 + 1 and isinstance(predicate["seed"], int)
    assert predicate["parameters"]["rows"] == 512 and isinstance(predicate["parameters"]["rows"], int)


def test_the_only_clock_dependent_field_is_predicate_run_created_at(tmp_path):
    one = build_predicate(seed=1, created_at="2026-01-01T00:00:00Z")
    two = build_predicate(seed=1, created_at="2027-06-30T12:00:00Z")
    assert TIMESTAMP_FIELD == ("predicate", "run", "created_at")
    assert one != two
    assert strip_timestamp({"predicate": one}) == strip_timestamp({"predicate": two})


def test_an_untouched_artifact_verifies(tmp_path):
    folder = _artifact(tmp_path / "art")
    write_manifest(folder, "tiles", build_predicate())
    assert verify_files(folder) == []


@pytest.mark.parametrize("position", [0, 3, -1])
def test_flipping_any_byte_of_an_artifact_file_is_detected(tmp_path, position):
    folder = _artifact(tmp_path / "art")
    write_manifest(folder, "tiles", build_predicate())
    target = folder / "tiles" / "b.safetensors"
    data = bytearray(target.read_bytes())
    data[position] ^= 0x01
    target.write_bytes(bytes(data))
    problems = verify_files(folder)
    assert len(problems) == 1 and problems[0].startswith("file tiles/b.safetensors: sha256 is")


def test_deleting_or_adding_an_artifact_file_is_detected(tmp_path):
    folder = _artifact(tmp_path / "art")
    write_manifest(folder, "tiles", build_predicate())
    (folder / "a.json").unlink()
    (folder / "extra.bin").write_bytes(b"new")
    problems = verify_files(folder)
    assert "file a.json: listed in" in problems[0] and problems[0].endswith("but missing")
    assert problems[1].startswith("file extra.bin: present in")


def test_a_malformed_subject_digest_is_refused_naming_the_field(tmp_path):
    folder = _artifact(tmp_path / "art")
    path = write_manifest(folder, "tiles", build_predicate())
    statement = json.loads(path.read_text())
    statement["subject"][0]["digest"]["sha256"] = "ABC"
    path.write_text(json.dumps(statement))
    with pytest.raises(InputError, match=r"field subject\[a.json\].digest.sha256 is 'ABC'"):
        read_manifest(folder)


def test_a_malformed_predicate_digest_is_refused_naming_the_field(tmp_path):
    folder = _artifact(tmp_path / "art")
    predicate = build_predicate(treatment=treatment_of(get_kernel("emulator:w_then_a"), "a"))
    path = write_manifest(folder, "capture", predicate)
    statement = json.loads(path.read_text())  # damaged after writing (the writer refuses to write it)
    statement["predicate"]["treatment"]["kernel_build_digest"] = {"sha256": "12" * 31}
    path.write_text(json.dumps(statement))
    with pytest.raises(InputError, match=r"field predicate.treatment.kernel_build_digest.sha256"):
        read_manifest(folder)


def test_a_manifest_covers_only_files_inside_its_folder(tmp_path):
    folder = _artifact(tmp_path / "art")
    (tmp_path / "outside.txt").write_text("x")
    with pytest.raises(InputError, match="is not inside"):
        write_manifest(folder, "tiles", build_predicate(), files=[tmp_path / "outside.txt"])


def test_a_folder_digest_changes_with_a_file_name_or_byte_and_ignores_the_manifest(tmp_path):
    folder = _artifact(tmp_path / "art")
    before = digest_tree(folder)
    write_manifest(folder, "tiles", build_predicate())
    assert digest_tree(folder) == before
    (folder / "a.json").rename(folder / "c.json")
    assert digest_tree(folder) != before


def test_a_kernel_treatment_names_the_kernel_its_build_and_its_declared_epilogue():
    t = treatment_of(get_kernel("emulator:a_then_w+add_after_cast"), "b")
    assert (t.arm, t.kernel, t.epilogue_model) == ("b", "emulator:a_then_w+add_after_cast", "a_then_w+add_after_cast")
    assert len(t.kernel_build_digest) == 64
    assert t.as_dict()["kernel_build_digest"] == {"sha256": t.kernel_build_digest}


def test_a_kernel_that_reports_its_build_digest_is_taken_at_its_word():
    kernel = get_kernel("emulator:w_then_a")
    kernel.build_digest = lambda: "ab" * 32
    assert treatment_of(kernel, "a").kernel_build_digest == "ab" * 32


def test_an_input_must_be_pinned_by_a_digest(tmp_path):
    (tmp_path / "prompts.jsonl").write_text('{"p": "hi"}\n')
    ok = build_predicate(inputs={"prompts": resource("prompts.jsonl", tmp_path / "prompts.jsonl")})
    assert ok["inputs"]["prompts"]["digest"]["sha256"] == sha256_bytes(b'{"p": "hi"}\n')
    with pytest.raises(InputError, match="input 'prompts' must be a resource"):
        build_predicate(inputs={"prompts": {"name": "prompts.jsonl"}})


def test_a_manifest_its_reader_would_refuse_is_not_written(tmp_path):
    """`alibi matrix` once wrote a manifest whose kernel evidence held a version string under a `*_digest` key,
    which `read_manifest` refuses: the writer now refuses it first, names the field, and writes nothing."""
    (tmp_path / "result.json").write_text("{}")
    predicate = {"arms": {"fbgemm-fp8-row": {"kernel_evidence": {"release_by_digest": "1.6.0"}}}}
    with pytest.raises(InputError, match=r"not written, it would not read back: .*release_by_digest"):
        write_manifest(tmp_path, "results", predicate)
    assert not (tmp_path / "manifest.json").exists()
    write_manifest(tmp_path, "results", {"arms": {"x": {"build_digest": {"sha256": "0" * 64}, "release": "1.6.0"}}})
    assert read_manifest(tmp_path).subjects[0].name == "result.json"
