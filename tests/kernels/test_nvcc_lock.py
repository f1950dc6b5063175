"""The kernel cache's build lock is opened safely (alibi.kernels.nvcc.build_lock)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from alibi.errors import KernelUnavailable
from alibi.kernels import nvcc


def test_a_symlink_planted_at_the_lock_is_refused_and_its_target_is_not_truncated(tmp_path):
    """Guards: `open(lock_path, "w")` followed a planted symlink and truncated its target."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    lock = tmp_path / ".lib.lock"
    lock.symlink_to(victim)
    with pytest.raises(KernelUnavailable, match="symbolic link"), nvcc.build_lock(lock):
        pass
    assert victim.read_text() == "precious\n"


def test_build_refuses_a_planted_lock_symlink_before_compiling_anything(tmp_path, monkeypatch):
    if nvcc.shutil.which("nvcc") is None and not os.environ.get("ALIBI_NVCC"):
        pytest.skip("build() computes its cache key with nvcc's version; no nvcc here")
    from alibi.kernels.cutlass import int8_library

    monkeypatch.setenv("ALIBI_CACHE", str(tmp_path / "cache"))
    lib = int8_library("sm80", "sm_80")
    so = nvcc.library_path(lib)
    so.parent.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (so.parent / f".{so.stem}.lock").symlink_to(victim)
    with pytest.raises(KernelUnavailable, match="build lock"):
        nvcc.build(lib)
    assert victim.read_text() == "precious\n" and not so.exists()


def test_an_existing_lock_file_is_opened_without_truncation_and_excludes_a_second_holder(tmp_path):
    lock = tmp_path / ".lib.lock"
    lock.write_text("left by an earlier build\n")
    order = []

    def second() -> None:
        with nvcc.build_lock(lock):
            order.append("second")

    with nvcc.build_lock(lock):
        t = threading.Thread(target=second)
        t.start()
        time.sleep(0.2)
        order.append("first")  # the second holder is still waiting
    t.join(5)
    assert order == ["first", "second"]
    assert lock.read_text() == "left by an earlier build\n"


def test_a_lock_path_that_is_not_a_regular_file_is_refused(tmp_path):
    fifo = tmp_path / ".lib.lock"
    os.mkfifo(fifo)
    with pytest.raises(KernelUnavailable, match="not a regular file"), nvcc.build_lock(fifo):
        pass
