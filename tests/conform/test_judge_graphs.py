"""A batch's checks replayed from a CUDA graph give every unit the bits the eager checks give
(alibi/conform/judge_graphs.py); a graph whose results a batch still reads is not replayed; a failed capture leaves
the judge eager, with the same results, and says so."""

from __future__ import annotations

import math
from contextlib import nullcontext

import pytest
import torch

from alibi.conform import checks
from alibi.conform.judge_graphs import JudgeGraphs, judge_graphs
from alibi.conform.pipeline import Pair, run_conformance, source_from_preset
from alibi.kernels.registry import get_kernel
from alibi.kernels.triton_int8 import TruncatingTritonKernel


def _stage(_name: str):
    return nullcontext()


def _summed(x: dict[str, torch.Tensor], _stage) -> torch.Tensor:
    return x["v"].flatten(1).sum(1) * 2


def test_max_relative_difference_is_the_largest_quotient_over_the_chosen_elements_of_each_unit():
    gen = torch.Generator().manual_seed(11)
    a = torch.randn((3, 4, 5), generator=gen).to(torch.bfloat16)
    b = (a.float() + torch.randn((3, 4, 5), generator=gen) * 0.01).to(torch.bfloat16)
    exact = torch.randn((3, 4, 5), generator=gen, dtype=torch.float64)
    exact[0, 0, 0] = 0.0  # never chosen: the near-zero split sets exact zeros aside
    where = torch.rand((3, 4, 5), generator=gen) > 0.6
    where[0, 0, 0] = False
    where[2] = False  # a unit with no chosen element
    got = checks.max_relative_difference(a, b, exact, where).tolist()
    for u in range(3):
        quotients = [abs(float(a[u].flatten()[i]) - float(b[u].flatten()[i])) / abs(float(exact[u].flatten()[i]))
                     for i in range(20) if where[u].flatten()[i]]
        assert got[u] == (max(quotients) if quotients else -math.inf)
    assert got[2] == -math.inf and got[0] > 0


def test_on_the_cpu_the_judge_runs_eagerly_and_captures_nothing():
    graphs = JudgeGraphs()
    tensors = {"v": [torch.arange(6.0).reshape(2, 3), torch.ones(2, 3)]}
    for _ in range(2):
        result, release = graphs.measure("key", tensors, _summed, _stage, graphs=True)
        release()
        assert result.tolist() == [30.0, 12.0]
    assert graphs.graphs == {} and graphs.replays == 0 and graphs.refused is None


@pytest.mark.gpu
def test_a_layouts_graph_replays_on_new_values_and_is_not_replayed_while_a_batch_reads_its_results():
    graphs = JudgeGraphs()

    def tensors(k: float) -> dict[str, list[torch.Tensor]]:
        return {"v": [torch.full((2, 3), k, device="cuda"), torch.arange(6.0, device="cuda").reshape(2, 3) * k]}

    first, release = graphs.measure("key", tensors(1.0), _summed, _stage, graphs=True)  # eager, then captured
    release()
    assert first.tolist() == [12.0, 30.0] and len(graphs.graphs) == 1 and graphs.replays == 0
    replayed, release = graphs.measure("key", tensors(2.0), _summed, _stage, graphs=True)
    assert replayed.tolist() == [24.0, 60.0] and graphs.replays == 1
    # while `replayed` is read, the next batch of the layout is judged eagerly, leaving it as it is
    meanwhile, _ = graphs.measure("key", tensors(3.0), _summed, _stage, graphs=True)
    assert meanwhile.tolist() == [36.0, 90.0] and replayed.tolist() == [24.0, 60.0]
    assert graphs.replays == 1
    release()
    again, release = graphs.measure("key", tensors(4.0), _summed, _stage, graphs=True)
    release()
    assert again.tolist() == [48.0, 120.0] and graphs.replays == 2


@pytest.mark.gpu
def test_a_judge_whose_capture_fails_stays_eager_with_the_same_results_and_says_why():
    graphs = JudgeGraphs()

    def syncing(x, _stage):
        if float(x["v"].max()) < 0:  # a host read: illegal while a stream is being captured
            raise AssertionError("values are positive")
        return x["v"] + 1

    tensors = {"v": [torch.ones(4, device="cuda")]}
    with pytest.warns(RuntimeWarning, match="checks run eagerly: they could not be captured"):
        first, _ = graphs.measure("key", tensors, syncing, _stage, graphs=True)
    second, _ = graphs.measure("key", tensors, syncing, _stage, graphs=True)
    assert first.tolist() == second.tolist() == [[2.0, 2.0, 2.0, 2.0]]
    assert graphs.refused is not None and graphs.graphs == {} and graphs.replays == 0
    assert "could not be captured" in graphs.how()
    torch.randn(8, device="cuda")  # the failed capture left the device usable


@pytest.mark.gpu
@pytest.mark.parametrize("a, b, preset", [
    ("cutlass", "triton", "smollm2-135m-bias"),  # int8, two scale orders, a bias: predicted differences and causes
    ("triton", "test:truncating", "smollm2-135m-bias"),  # a check fires: its first mismatch read from the replay
    ("cutlass-fp8", "triton-fp8", "smollm2-135m-fp8"),  # fp8: declared schedules' accumulators
    ("cublaslt-fp8-block", "cublaslt-fp8-block", "smollm2-135m-fp8-block"),  # block-scaled
])
def test_replayed_checks_give_every_unit_the_bits_of_eager_checks(a, b, preset):
    def kernel(name):
        return TruncatingTritonKernel() if name == "test:truncating" else get_kernel(name)
    for name in (a, b):
        ok, why = kernel(name).available()
        if not ok:
            pytest.skip(f"{name} is not available here: {why}")
    source = source_from_preset(preset, rows=64)
    pair = Pair(kernel(a), kernel(b), "test")
    eager = run_conformance(pair, source, created_at=None, graphs=False)
    before = judge_graphs().replays
    captured = run_conformance(pair, source, created_at=None, graphs=True)  # each layout's first batch is captured
    replayed = run_conformance(pair, source, created_at=None, graphs=True)  # every batch replayed
    assert judge_graphs().refused is None, judge_graphs().refused
    assert judge_graphs().replays - before >= 2  # the second run's batches, at least
    assert captured.tiles == eager.tiles == replayed.tiles
    assert captured.verdict == eager.verdict == replayed.verdict
    if b == "test:truncating":
        assert eager.verdict == "fail"
