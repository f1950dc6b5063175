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
    assert set(first) == {"python", "platform", "cpu", "torch", "triton", "numpy", "cuda", "driver", "gpus"}


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
