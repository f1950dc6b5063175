"""vLLM's kernel-selection lines as treatment evidence: parsing, manifests, and the identity contract."""

from __future__ import annotations

import json

import pytest

from alibi.cli import main
from alibi.errors import InputError
from alibi.governance.identity import compare_manifests
from alibi.governance.kernel_log import (
    SCHEMA,
    KernelLog,
    KernelSelection,
    parse_kernel_log,
    read_kernel_log,
)
from alibi.governance.manifest import Treatment, build_predicate, engine_treatment, treatment_of, write_manifest
from alibi.kernels import vllm as V
from alibi.kernels.registry import get_kernel

CUTLASS_LOG = (
    "INFO 12-01 09:46:00 [__init__.py:671] Selected CutlassInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8\n"
    "(EngineCore_DP0 pid=4242) INFO 12-01 09:46:01 [__init__.py:671] Selected CutlassInt8ScaledMMLinearKernel "
    "for CompressedTensorsW8A8Int8\n"
    "WARNING 12-01 09:46:02 [cuda.py:418] Selected backend FLASHINFER is not valid for this configuration\n"
    "INFO 12-01 09:46:03 [selector.py:132] Selected MLA prefill backend FLASH_ATTN for prefill\n"
)
TRITON_LOG = ("INFO 12-01 10:00:00 [__init__.py:671] Selected TritonInt8ScaledMMLinearKernel for "
              "CompressedTensorsW8A8Int8\n")


def test_only_linear_kernel_selections_are_recorded_without_their_timestamps():
    log = parse_kernel_log(CUTLASS_LOG.encode(), "vllm.log")
    assert log.lines == ("Selected CutlassInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8",) * 2
    assert log.selections == (KernelSelection("CutlassInt8ScaledMMLinearKernel", "CompressedTensorsW8A8Int8"),)
    assert log.kernel_classes == ("CutlassInt8ScaledMMLinearKernel",)


def test_the_digest_is_of_the_whole_file_so_another_timestamp_changes_it_but_not_the_lines():
    a = parse_kernel_log(CUTLASS_LOG.encode(), "a.log")
    b = parse_kernel_log(CUTLASS_LOG.replace("09:46:00", "11:00:00").encode(), "a.log")
    assert a.lines == b.lines and a.sha256 != b.sha256


def test_a_log_without_a_selection_line_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "empty.log"
    path.write_text("INFO 12-01 starting\nSelected backend X is not valid for Y\n")
    with pytest.raises(InputError, match=r"empty.log: no line 'Selected <kernel class> for <layer>'"):
        read_kernel_log(path)
    with pytest.raises(InputError, match="cannot read it"):
        read_kernel_log(tmp_path / "missing.log")


def test_the_record_round_trips_through_json_and_refuses_another_schema():
    log = parse_kernel_log(CUTLASS_LOG.encode(), "vllm.log")
    doc = json.loads(log.to_json())
    assert doc["schema"] == SCHEMA and KernelLog.from_dict(doc) == log
    with pytest.raises(InputError, match="schema"):
        KernelLog.from_dict({**doc, "schema": "alibi.kernel-log/0"})
    with pytest.raises(InputError, match="missing field 'lines'"):
        KernelLog.from_dict({k: v for k, v in doc.items() if k != "lines"})


def _engine_arm(folder, log_text, arm):
    folder.mkdir()
    (folder / "tokens.json").write_text("[1, 2, 3]\n")
    (folder.parent / f"{arm}.log").write_text(log_text)
    assert main(["manifest", "write", str(folder), "--kind", "replay", "--kernel-log",
                 str(folder.parent / f"{arm}.log"), "--arm", arm]) == 0
    return json.loads((folder / "manifest.json").read_text())


def test_manifest_write_records_the_selection_as_the_treatment_of_an_engine_arm(tmp_path):
    statement = _engine_arm(tmp_path / "a", CUTLASS_LOG, "cutlass")
    treatment = statement["predicate"]["treatment"]
    assert treatment["arm"] == "cutlass" and treatment["kernel"] is None
    assert treatment["kernel_log"]["selections"] == [
        {"kernel_class": "CutlassInt8ScaledMMLinearKernel", "target": "CompressedTensorsW8A8Int8"}]
    assert treatment["kernel_log"]["log_digest"]["sha256"] == read_kernel_log(tmp_path / "cutlass.log").sha256


def test_two_engine_arms_that_differ_only_in_the_selected_kernel_pass_the_kernel_contract(tmp_path, capsys):
    _engine_arm(tmp_path / "a", CUTLASS_LOG, "cutlass")
    _engine_arm(tmp_path / "b", TRITON_LOG, "triton")
    record = compare_manifests(tmp_path / "a", tmp_path / "b")
    assert record.verified, record.problems
    assert "predicate.treatment.kernel_log.selections[0].kernel_class" in record.differing
    assert main(["manifest", "verify", str(tmp_path / "a"), str(tmp_path / "b")]) == 0


def test_the_selection_lines_are_treatment_fields_so_no_other_treatment_lets_them_differ(tmp_path):
    _engine_arm(tmp_path / "a", CUTLASS_LOG, "x")
    (tmp_path / "x.log").unlink()
    _engine_arm(tmp_path / "b", TRITON_LOG, "x")
    record = compare_manifests(tmp_path / "a", tmp_path / "b", treatment=["inputs.checkpoint"])
    assert any("predicate.treatment.kernel_log.selections[0].kernel_class differs" in p for p in record.problems)


def test_an_engine_arm_without_a_log_still_lacks_kernel_evidence(tmp_path):
    log = parse_kernel_log(TRITON_LOG.encode(), "t.log")
    for name, treatment in (("a", engine_treatment(log, "a")), ("b", engine_treatment(log, "b"))):
        (tmp_path / name).mkdir()
        write_manifest(tmp_path / name, "replay", build_predicate(treatment=treatment))
    assert compare_manifests(tmp_path / "a", tmp_path / "b").verified
    statement = json.loads((tmp_path / "b" / "manifest.json").read_text())
    del statement["predicate"]["treatment"]["kernel_log"]
    (tmp_path / "b" / "manifest.json").write_text(json.dumps(statement))
    problems = compare_manifests(tmp_path / "a", tmp_path / "b").problems
    assert any("predicate.treatment.kernel is missing" in p for p in problems)


def test_an_engine_arm_whose_kernel_declares_no_model_on_this_cpu_is_evidenced_by_its_log(tmp_path):
    """vLLM's oneDNN GEMM declares no epilogue on an op library nobody measured (`_C_AVX512`): the arm names the
    kernel, its log names the vLLM class that ran, and the pair joins; without the log the missing model is named."""
    log = parse_kernel_log(TRITON_LOG.encode(), "t.log")
    arms = {"a": Treatment(arm="a", kernel="vllm-cpu-onednn", kernel_build_digest="1" * 64, epilogue_model=None,
                           kernel_log=log),
            "b": treatment_of(get_kernel("emulator:a_then_w"), "b", kernel_log=log)}
    for name, treatment in arms.items():
        (tmp_path / name).mkdir()
        write_manifest(tmp_path / name, "replay", build_predicate(treatment=treatment))
    assert compare_manifests(tmp_path / "a", tmp_path / "b").verified
    statement = json.loads((tmp_path / "a" / "manifest.json").read_text())
    del statement["predicate"]["treatment"]["kernel_log"]
    (tmp_path / "a" / "manifest.json").write_text(json.dumps(statement))
    problems = compare_manifests(tmp_path / "a", tmp_path / "b").problems
    assert any("predicate.treatment.epilogue_model is missing" in p for p in problems)


def test_a_manifest_without_a_kernel_log_has_no_kernel_log_field():
    treatment = treatment_of(get_kernel("emulator:w_then_a"), "a").as_dict()
    assert "kernel_log" not in treatment


def test_the_log_must_name_the_vllm_class_the_recorded_kernel_runs(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "_C_stable_libtorch.abi3.so"
    fake.write_bytes(b"\x7fELF stand-in: only its digest is read")
    monkeypatch.setenv(V.ENV_OPS, str(fake))
    log = parse_kernel_log(CUTLASS_LOG.encode(), "vllm.log")
    treatment = treatment_of(get_kernel("vllm-cutlass"), "sampler", kernel_log=log)
    assert treatment.kernel_build_digest == V.file_sha256(fake) and treatment.kernel_log == log
    with pytest.raises(InputError, match="vLLM selected CutlassInt8ScaledMMLinearKernel, but kernel 'vllm-triton'"):
        treatment_of(get_kernel("vllm-triton"), "trainer", kernel_log=log)
    (tmp_path / "run").mkdir()
    (tmp_path / "vllm.log").write_text(CUTLASS_LOG)
    assert main(["manifest", "write", str(tmp_path / "run"), "--kind", "replay", "--kernel", "vllm-triton",
                 "--kernel-log", str(tmp_path / "vllm.log")]) == 2
    assert not (tmp_path / "run" / "manifest.json").exists()
    assert main(["manifest", "write", str(tmp_path / "run"), "--kind", "replay", "--kernel", "vllm-cutlass",
                 "--kernel-log", str(tmp_path / "vllm.log")]) == 0
    treatment = json.loads((tmp_path / "run" / "manifest.json").read_text())["predicate"]["treatment"]
    assert treatment["kernel"] == "vllm-cutlass" and treatment["arm"] == "run"
    assert treatment["kernel_log"]["selections"][0]["kernel_class"] == "CutlassInt8ScaledMMLinearKernel"


def test_arm_without_a_kernel_or_a_log_is_refused(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    assert main(["manifest", "write", str(tmp_path / "run"), "--kind", "replay", "--arm", "a"]) == 2
    assert "--arm labels a treatment" in capsys.readouterr().err
