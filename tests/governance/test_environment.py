"""The environment record: read, not guessed, and free of anything that changes between runs."""

from __future__ import annotations

import shutil
import subprocess

import pytest

import alibi
from alibi.governance import environment as env


def test_the_environment_record_is_identical_on_every_call_of_a_process():
    env.environment.cache_clear()
    first = env.environment_record()
    env.environment.cache_clear()
    assert env.environment_record() == first
    assert set(first) == {"python", "platform", "cpu", "cpu_isa", "torch", "triton", "numpy", "cuda", "driver", "gpus",
                          "torch_flags"}


def test_the_record_carries_the_torch_flags_of_the_execution_mode_in_force(monkeypatch):
    """Issue 21: a record made after the deterministic runner was set up says so; one made native says that."""
    from types import SimpleNamespace

    import torch

    from alibi.model.execution import apply_execution_mode

    pytest.importorskip("transformers")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)  # restored after the test
    model = torch.nn.Module()
    model.weight = torch.nn.Parameter(torch.zeros(1))
    model.config = SimpleNamespace(_attn_implementation="sdpa")
    try:
        apply_execution_mode(model, deterministic=True)
        flags = env.environment_record()["torch_flags"]
        assert flags["deterministic_algorithms"] and flags["cublas_workspace_config"] == ":4096:8"
        assert not flags["bf16_reduced_precision_reduction"] and not flags["fill_uninitialized_memory"]
    finally:
        apply_execution_mode(model, deterministic=False)
    flags = env.environment_record()["torch_flags"]
    assert not flags["deterministic_algorithms"] and flags["bf16_reduced_precision_reduction"]
    assert flags["fill_uninitialized_memory"]


def test_the_toolkit_record_names_this_package_and_its_version():
    record = env.toolkit_record()
    assert record["name"] == "integer-alibi" and record["version"] == alibi.__version__
    assert record["git_commit"] is None or len(record["git_commit"]) == 40
    assert len(record["source_digest"]["sha256"]) == 64


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_git_commit_is_read_from_the_checkout(tmp_path):
    run = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True, text=True)
    run("init", "-q")
    (tmp_path / "f").write_text("x")
    run("add", "f")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "m")
    assert env._git(tmp_path, "rev-parse", "--verify", "--quiet", "HEAD") == run("rev-parse", "HEAD").stdout.strip()
    assert env._git(tmp_path / "missing", "rev-parse", "HEAD") is None


def test_the_cpu_isa_lists_the_int8_relevant_flags_of_x86_and_arm_cpuinfo():
    """Guards issue 16: results recorded the CPU model but not the ISA that picks CPU int8 paths."""
    x86 = "processor\t: 0\nmodel name\t: Intel Xeon\nflags\t\t: fpu sse2 avx2 fma avx512f avx512_vnni amx_int8 amx_tile\n"
    assert env.cpu_isa(x86) == ("amx_int8", "amx_tile", "avx2", "avx512_vnni", "avx512f", "fma")
    assert env.cpu_isa("processor\t: 0\nFeatures\t: fp asimd asimddp i8mm sve\n") == ("asimd", "asimddp", "i8mm", "sve")
    assert env.cpu_isa("no flags here\n") == ()


def test_every_manifest_records_the_cpu_model_and_isa():
    from alibi.governance.manifest import build_predicate

    record = build_predicate()["environment"]
    assert record["cpu"] == env.environment().cpu and record["cpu_isa"] == list(env.cpu_isa())
    flags = next((line for line in open("/proc/cpuinfo").read().splitlines() if line.startswith("flags")), "")
    assert ("avx2" in record["cpu_isa"]) == (" avx2" in flags)


def test_working_tree_is_clean_exactly_when_the_source_digest_is_heads(monkeypatch):
    real = env.toolkit()

    monkeypatch.setattr(env, "commit_source_digest", lambda repo, commit: real.source_digest["sha256"])
    assert env.working_tree().clean is (True if real.git_commit else None)
    monkeypatch.setattr(env, "commit_source_digest", lambda repo, commit: "0" * 64)
    assert env.working_tree().clean is (False if real.git_commit else None)
