"""A kernel that raises while it runs is a failure to produce bits, not a finding: `alibi conform` ends with one
line naming the kernel and the error, exit 4 (1 means a check fired), and keeps the finished units for
`--resume` (issue 25, item 5)."""

from __future__ import annotations

import json

import pytest
from faulty_kernels import Reference

from alibi.cli import main
from alibi.errors import KernelRaised, WorkerFailed
from alibi.kernels.registry import register
from alibi.tiles.synthetic import synthetic_tiles


class RaisesOnOneTile(Reference):
    """A correct a_then_w kernel with a bug on one tile shape (`broken_n` columns), until it is fixed."""

    name = "raises-on-one-tile"
    broken_n: int | None = None

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=None):
        if w_q.shape[0] == RaisesOnOneTile.broken_n:
            raise IndexError("tile index 3 out of range\nin block (0, 1)")
        return super().scaled_mm(a_q, s_a, w_q, s_w, bias, out_dtype)


@pytest.fixture
def raising(monkeypatch):
    register("test-raises", RaisesOnOneTile)
    last = synthetic_tiles("tiny", seed=0)[-1]
    monkeypatch.setattr(RaisesOnOneTile, "broken_n", last.N)
    return ["conform", "--kernel-a", "test-raises", "--kernel-b", "emulator:a_then_w", "--synthetic", "tiny"]


def test_a_kernel_that_raises_during_conform_gives_one_line_and_exit_4(tmp_path, capsys, raising):
    assert main([*raising, "--out", str(tmp_path / "r"), "--quiet"]) == KernelRaised.exit_code == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    line = err[0]
    assert line.startswith("alibi: error: kernel 'raises-on-one-tile' raised on tile ")
    assert "IndexError: tile index 3 out of range\\nin block (0, 1)" in line and "Traceback" not in line
    assert "finished unit(s) kept" in line and "--resume" in line
    assert not (tmp_path / "r" / "report.json").exists()


def test_the_units_finished_before_a_kernel_raised_are_kept_for_resume(tmp_path, capsys, raising, monkeypatch):
    out = tmp_path / "r"
    assert main([*raising, "--out", str(out), "--quiet"]) == 4
    monkeypatch.setattr(RaisesOnOneTile, "broken_n", None)  # the kernel is fixed
    assert main([*raising, "--out", str(out), "--quiet", "--resume"]) == 0
    source = json.loads((out / "report.json").read_text())["source"]
    assert source["units_from_disk"] >= 1


def test_a_kernel_refusing_its_input_keeps_its_exit_code_2_not_4(tmp_path, capsys):
    from alibi.errors import InputError

    class Refuses(Reference):
        name = "refuses"

        def scaled_mm(self, *a, **k):
            raise InputError("refuses: bias must be bf16; convert it")

    register("test-refuses", Refuses)
    assert main(["conform", "--kernel-a", "test-refuses", "--kernel-b", "emulator:a_then_w", "--synthetic", "tiny",
                 "--out", str(tmp_path / "r"), "--quiet"]) == 2
    assert "bias must be bf16" in capsys.readouterr().err


def test_a_raised_kernel_is_a_worker_failure_for_ci_not_a_finding():
    assert issubclass(KernelRaised, WorkerFailed) and KernelRaised.exit_code not in (0, 1, 2, 3)


class OnTheGpu(Reference):
    name = "on-the-gpu"
    device = "cuda"


def test_an_error_the_gpu_reports_when_the_pipeline_waits_names_both_kernels_of_the_unit(monkeypatch):
    """The pipeline queues a unit's launches (`Kernel.run(wait=False)`) and waits once (`wait_for`): a device error
    surfacing then is a KernelRaised naming every kernel that had launches queued, not a traceback."""
    import torch

    from alibi.kernels.base import wait_for

    def sticky_error():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", sticky_error)
    gpu, cpu = OnTheGpu(), Reference()
    with pytest.raises(KernelRaised) as raised:
        wait_for([gpu, cpu], "layers.0.q_proj")
    message = str(raised.value)
    assert message.startswith("kernel 'on-the-gpu' or 'ref' failed on the GPU (reported when waiting")
    assert "layers.0.q_proj" in message and "illegal memory access" in message and "\n" not in message
    wait_for([cpu, cpu], "layers.0.q_proj")  # only CPU kernels: nothing queued, nothing to wait for


def test_a_device_error_reported_while_a_batch_is_judged_names_its_kernels_and_other_errors_pass(monkeypatch):
    """The pipeline queues a batch's checks without waiting for its kernels (`device_errors_of`): a device error
    reported then, or when its numbers are read, is a KernelRaised naming the kernels; any other error is not
    theirs and passes as it is, as does a device error where no kernel had GPU launches."""
    import torch

    from alibi.kernels.base import device_errors_of

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu, cpu = OnTheGpu(), Reference()
    with pytest.raises(KernelRaised) as raised, device_errors_of([cpu, gpu], "layers.0.q_proj"):
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
    message = str(raised.value)
    assert message.startswith("kernel 'ref' or 'on-the-gpu' failed on the GPU (reported when waiting")
    assert "layers.0.q_proj" in message and "illegal memory access" in message
    with pytest.raises(ValueError, match="a bug of the checks"), device_errors_of([gpu], "t"):
        raise ValueError("a bug of the checks")
    with pytest.raises(torch.AcceleratorError), device_errors_of([cpu, cpu], "t"):
        raise torch.AcceleratorError("CUDA error: misaligned address")
