"""An arm's launches replayed from CUDA graphs give every unit the bits its eager launches give
(alibi/conform/launches.py); a kernel that does not declare its launches replayable, or whose capture fails,
launches eagerly and the report says so."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from alibi.conform.launches import ArmRun, arm_launches, launcher
from alibi.conform.pipeline import Pair, prepare, run_conformance, source_from_preset, source_from_tiles
from alibi.kernels.base import packed, views_like
from alibi.kernels.catalog import BUILTIN
from alibi.kernels.registry import get_kernel
from alibi.kernels.triton_int8 import TritonInt8Kernel, TruncatingTritonKernel
from alibi.tiles.tile import BLOCK_FORMAT

# A SmolLM2 layer's tiles in the kernel's format (and scale layout), twice with other values: every launch key (the
# seven projections, gate and up sharing one) comes at least twice; the first unit of a key runs eagerly and is
# captured, the later ones replay.
PRESET_OF_FORMAT = {"int8": "smollm2-135m-bias", "fp8_e4m3": "smollm2-135m-fp8", BLOCK_FORMAT: "smollm2-135m-fp8-block"}
TENSORWISE_PRESET = "smollm2-135m-fp8-tensor"


def _declaring_builtins() -> list[str]:
    import importlib

    names = []
    for name, where in BUILTIN.items():
        module, cls = where.split(":")
        try:
            found = getattr(importlib.import_module(module), cls)
        except Exception:  # noqa: BLE001 - a kernel whose module cannot be imported here declares nothing here
            continue
        if isinstance(found, type) and found.__dict__.get("replayable") is True:
            names.append(name)
    return names


def test_only_the_class_that_declares_its_launches_replayable_has_them_replayed():
    class Subclass(TritonInt8Kernel):  # a plugin changing how the kernel launches, declaring nothing
        name = "test:subclass"

    class Declaring(TritonInt8Kernel):
        name = "test:declaring"
        replayable = True

    assert TritonInt8Kernel().launches_replayable()
    assert not Subclass().launches_replayable() and Declaring().launches_replayable()
    assert not TruncatingTritonKernel().launches_replayable()  # a mutant of a declaring kernel
    assert {"cutlass", "triton", "cublas", "cutlass-fp8", "triton-fp8"} <= set(_declaring_builtins())
    assert not any(name.startswith("mutant:") for name in _declaring_builtins())


def test_cpu_arms_asked_for_graphs_launch_as_before_and_their_record_adds_nothing():
    kernel = get_kernel("torch-cpu")
    report = run_conformance(Pair(kernel, get_kernel("emulator:a_then_w"), "test"),
                             source_from_preset("tiny"), created_at=None, graphs=True)
    assert report.kernel_a.how == kernel.available()[1]
    assert launcher(kernel).graphs == {}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def test_an_arm_run_packed_into_one_buffer_comes_back_bit_for_bit():
    """What a replay hands over: the run's tensors packed into one buffer (as the graph writes them), a copy of the
    buffer, and the run rebuilt from its views: every tensor (a strided output, the operands, the sub-batches, the
    second run) with its shape, dtype and bits, the missing ones (no accumulator asked, no bias) missing."""
    tile = source_from_preset("smollm2-135m-bias", rows=32).tiles[0]
    t = prepare(tile, torch.device("cpu")).regimes["real"]
    run = arm_launches(get_kernel("emulator:w_then_a"), t, accumulator=False, invariance=True)
    run = ArmRun(run.out.t().contiguous().t(), run.acc, run.operands, run.subsets, run.again, run.evidence)
    assert not run.out.is_contiguous() and run.acc is None and run.subsets and run.again is not None
    buffer, like = packed(run.tensors(), "cpu")
    back = run.from_tensors(views_like(buffer.clone(), like))  # as a replay rebuilds it
    assert back.acc is None and back.evidence == run.evidence
    assert [rows for rows, _ in back.subsets] == [rows for rows, _ in run.subsets] == [[0], [14, 15, 16, 17],
                                                                                        list(range(16, 32))]
    pairs = [(back.out, run.out), (back.again, run.again)] + [(b, r) for (_, b), (_, r) in zip(back.subsets,
                                                                                              run.subsets)]
    pairs += [(back.operands[k], run.operands[k]) for k in run.operands if run.operands[k] is not None]
    assert sorted(k for k, v in back.operands.items() if v is None) == sorted(
        k for k, v in run.operands.items() if v is None)
    for got, want in pairs:
        assert (got.shape, got.dtype) == (want.shape, want.dtype) and torch.equal(_bits(got), _bits(want))
    assert back.out.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr()  # a copy, not the buffer


def test_tiles_of_one_shape_share_a_launch_key_and_their_layout_in_a_shared_buffer_is_part_of_it():
    """A graph copies a tile's shared buffer in with one copy, so tiles whose operands lie at other places in their
    buffer (the pow2 regime's own scales), or in buffers of their own, need graphs of their own."""
    from alibi.conform.launches import launch_key
    from alibi.kernels.base import buffer_groups, operands

    first, second = (prepare(tile, torch.device("cpu"), regimes=("real", "pow2"))
                     for tile in source_from_preset("smollm2-135m-bias", rows=16).tiles[4:6])  # gate, up
    real, pow2 = first.regimes["real"], first.regimes["pow2"]
    assert launch_key(real, True, True) == launch_key(second.regimes["real"], True, True)
    assert launch_key(pow2, False, False) == launch_key(second.regimes["pow2"], False, False)
    assert launch_key(real, False, False) != launch_key(pow2, False, False)
    assert launch_key(real, False, False) != launch_key(real, True, False) != launch_key(real, True, True)
    present = {k: v for k, v in operands(real).items() if v is not None}
    assert buffer_groups(present) == [(list(present), True)]  # every operand in one buffer: one copy
    apart = real.replace(**{k: v.clone() for k, v in present.items()})  # the same operands, each in its own buffer
    assert buffer_groups({k: getattr(apart, k) for k in present}) == [([k], False) for k in present]
    assert launch_key(apart, False, False) != launch_key(real, False, False)


def _two_layers(kernel):
    preset = TENSORWISE_PRESET if getattr(kernel, "tensorwise", False) else PRESET_OF_FORMAT[kernel.formats[0]]
    first, second = (source_from_preset(preset, seed=seed).tiles for seed in (0, 1))
    assert len(first) == 7 and first[0].a_q.data_ptr() != second[0].a_q.data_ptr()
    return source_from_tiles([*first, *(t.replace(name=t.name.replace("layers.0.", "layers.1.")) for t in second)])


def _results(report):
    return [u for u in report.tiles], report.verdict, report.kernel_a.evidence, report.kernel_b.evidence


@pytest.mark.gpu
@pytest.mark.parametrize("name", _declaring_builtins())
def test_replayed_launches_give_every_unit_the_bits_and_evidence_of_eager_launches(name):
    kernel = get_kernel(name)
    ok, why = kernel.available()
    if not ok:
        pytest.skip(f"{name} is not available here: {why}")
    source = _two_layers(kernel)
    eager = run_conformance(Pair(get_kernel(name), get_kernel(name), "eager"), source, created_at=None, graphs=False)
    replayed = run_conformance(Pair(kernel, get_kernel(name), "graphs"), source, created_at=None, graphs=True)
    assert _results(replayed) == _results(eager)
    assert launcher(kernel).refused is None and len(launcher(kernel).graphs) >= 2
    assert "launches captured in a CUDA graph" in replayed.kernel_a.how
    assert eager.kernel_a.how == kernel.available()[1]  # without graphs asked, the record is as before
    again = run_conformance(Pair(kernel, get_kernel(name), "graphs, every unit replayed"), source, created_at=None,
                            graphs=True)
    assert _results(again) == _results(eager)


class HostSyncingTriton(TritonInt8Kernel):
    """Declares its launches replayable, but reads a value back to the host at every launch."""

    name = "test:host-syncing-triton"
    replayable = True

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        if float(s_a.max()) < 0:  # a host read: illegal while a stream is being captured
            raise AssertionError("scales are positive")
        return super().scaled_mm(a_q, s_a, w_q, s_w, bias, out_dtype)


@pytest.mark.gpu
def test_a_kernel_whose_capture_fails_launches_eagerly_with_the_same_bits_and_the_report_says_why():
    source = _two_layers(get_kernel("triton"))
    syncing = HostSyncingTriton()
    report = run_conformance(Pair(syncing, get_kernel("triton"), "test"), source, created_at=None, graphs=True)
    eager = run_conformance(Pair(HostSyncingTriton(), get_kernel("triton"), "test"), source, created_at=None,
                            graphs=False)
    assert report.tiles == eager.tiles
    assert "launched eagerly: its launches could not be captured in a CUDA graph" in report.kernel_a.how
    assert "launches captured in a CUDA graph" in report.kernel_b.how
    torch.randn(8, device="cuda")  # the failed capture left the device's generator usable


def _launcher_after_a_run(a: str, b: str, device: str) -> tuple[Pair, weakref.ReferenceType]:
    pair = Pair(get_kernel(a), get_kernel(b), "launcher test")
    run_conformance(pair, source_from_preset("tiny"), device=device, created_at=None)
    return pair, weakref.ref(launcher(pair.a))


def test_a_kernel_let_go_frees_its_launcher_by_reference_counting_alone():
    """The kernel holds its launcher, the launcher holds it weakly: no cycle for the garbage collector to find."""
    pair, gone = _launcher_after_a_run("emulator:w_then_a", "emulator:a_then_w", "cpu")
    assert gone() is not None and gone().kernel is pair.a
    gc.disable()
    try:
        del pair
        assert gone() is None
    finally:
        gc.enable()


@pytest.mark.gpu
def test_a_kernel_let_go_returns_its_graphs_device_memory_without_a_garbage_collection():
    pair, gone = _launcher_after_a_run("cutlass", "triton", "cuda")
    assert gone().graphs, "the run captured no graph for the cutlass arm"
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    gc.disable()
    try:
        del pair
        assert gone() is None
        assert torch.cuda.memory_allocated() < held
    finally:
        gc.enable()


def test_conform_with_cuda_graphs_on_cpu_kernels_writes_the_report_it_writes_without(tmp_path):
    from alibi.cli import main
    from alibi.conform.results import Report

    args = ["conform", "--kernel-a", "torch-cpu", "--kernel-b", "emulator:a_then_w", "--synthetic", "tiny", "--quiet"]
    assert main([*args, "--no-cuda-graphs", "--out", str(tmp_path / "eager")]) == 0
    assert main([*args, "--out", str(tmp_path / "graphs")]) == 0  # graphs are the default
    eager, graphs = (Report.from_json((tmp_path / d / "report.json").read_text()) for d in ("eager", "graphs"))
    assert graphs.tiles == eager.tiles and graphs.kernel_a == eager.kernel_a and graphs.kernel_b == eager.kernel_b
