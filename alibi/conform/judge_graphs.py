"""A batch's checks replayed from a CUDA graph.

Judging a batch (`alibi.conform.judge.measured`) is a few hundred small device operations: the epilogue models, the
exact values, every check's masks and reductions, and the gathering of every value into one tensor. Launched one by
one, each costs the host tens of µs, so on a GPU the host, not the device, sets the pace (`alibi bench conform`).
But what those operations are depends only on the batch's layout (`alibi.conform.judge.BatchLayout`: the shapes,
the declarations, which units are of which regime), not on its values. So the first batch of a layout is judged
eagerly (its result is that batch's), then the same operations are captured in a CUDA graph (`JudgeGraph`), with
its inputs as fixed buffers; every later batch of the layout has its inputs stacked into those buffers and the graph
replayed: the same kernels on the same values, so the same bits (tests/conform/test_judge_graphs.py holds replayed
reports to eager ones on a GPU).

A graph's results stay in its own memory until the batch is judged (`Measurement.release`): a graph is not replayed
while a batch holds its results (that batch's layout is then judged eagerly). The graphs live while the process
does, each in its own memory pool, at most a quarter of the device's memory in all (`GRAPH_SHARE`; past it the least
recently replayed goes first). A capture that fails (an operation that waits for the host, say) leaves the judge
eager for the rest of the process: a warning says so when it happens, and `JudgeGraphs.how` says why (`alibi bench
conform` records it). The report does not change: its bits are the eager ones either way.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from alibi.errors import one_line
from alibi.kernels.graphs import captured

Stage = Callable[[str], AbstractContextManager[None]]

GRAPH_SHARE = 4
"""The judge's graphs may hold 1/GRAPH_SHARE of the device's memory (inputs and memory pools; a batch of
`alibi.conform.pipeline.BATCH_ELEMENTS` output elements takes about 2 GB): past it, the least recently replayed graph
is dropped."""


@contextmanager
def _untimed(_name: str):
    yield


@dataclass
class JudgeGraph:
    """One layout's judging, captured: the buffers it reads its inputs from (`inputs`, by name), what it returns (its
    tensors written again by every replay), the device memory it holds, and whether a batch still reads its
    results (`busy`)."""

    graph: torch.cuda.CUDAGraph
    inputs: dict[str, torch.Tensor]
    result: Any
    nbytes: int
    busy: bool = False

    def release(self) -> None:
        self.busy = False


class JudgeGraphs:
    """The judge's graphs of one process, by layout (module docstring); `refused`: why the judge runs eagerly
    since a capture failed."""

    def __init__(self) -> None:
        self.graphs: OrderedDict[Hashable, JudgeGraph] = OrderedDict()
        self.refused: str | None = None
        self.replays = 0  # batches judged by a replay, in this process

    def measure(self, key: Hashable, tensors: dict[str, list[torch.Tensor]],
                work: Callable[[dict[str, Any], Stage], Any], stage: Stage, *, graphs: bool, capturable: bool = True
                ) -> tuple[Any, Callable[[], None]]:
        """`work(inputs, stage)` on `tensors` stacked (each list into one [B, ...] tensor), eagerly or replayed from
        `key`'s graph (with `graphs`, on a GPU, where every tensor lies on it and the layout is `capturable`); with
        the callable that hands the graph back once the result has been read (nothing to hand back when eager). The
        key fixes each input's shape, dtype and device: a graph is captured only where every tensor lies on the GPU,
        so a batch of a key that has one is not checked again."""
        if not graphs or self.refused is not None or not capturable:
            return self._eager(tensors, work, stage), _nothing
        graph = self.graphs.get(key)
        if graph is None:
            device = next(iter(tensors.values()))[0].device
            if device.type != "cuda" or any(t.device != device for ts in tensors.values() for t in ts):
                return self._eager(tensors, work, stage), _nothing
        if graph is not None and not graph.busy:
            with stage("reference"):
                for name, ts in tensors.items():
                    torch.stack(ts, out=graph.inputs[name])
            with stage("checks"):  # the models and the checks, one replay
                graph.graph.replay()
            graph.busy = True
            self.replays += 1
            self.graphs.move_to_end(key)
            return graph.result, graph.release
        result = self._eager(tensors, work, stage)  # the layout's first batch, or its graph is busy
        if graph is None:
            self._capture(key, tensors, work, device)
        return result, _nothing

    @staticmethod
    def _eager(tensors: dict[str, list[torch.Tensor]], work: Callable[[dict[str, Any], Stage], Any], stage: Stage
               ) -> Any:
        with stage("reference"):
            x = {name: torch.stack(ts) for name, ts in tensors.items()}
        return work(x, stage)

    def _capture(self, key: Hashable, tensors: dict[str, list[torch.Tensor]],
                 work: Callable[[dict[str, Any], Stage], Any], device: torch.device) -> None:
        inputs = {name: torch.empty((len(ts), *ts[0].shape), dtype=ts[0].dtype, device=device)
                  for name, ts in tensors.items()}
        before = torch.cuda.memory_reserved(device)
        try:
            graph, result = captured(lambda: work(inputs, _untimed), device, torch.cuda.graph_pool_handle())
        except Exception as exc:  # noqa: BLE001 - any failure under capture: the judge stays eager, saying why
            self.refused = f"{type(exc).__name__}: {one_line(str(exc))}"[:300]
            self.graphs.clear()
            warnings.warn(f"alibi: {self.how()}; the same results, more host time per batch", RuntimeWarning,
                          stacklevel=2)
            return
        held = torch.cuda.memory_reserved(device) - before + sum(t.numel() * t.element_size()
                                                                   for t in inputs.values())
        self.graphs[key] = JudgeGraph(graph, inputs, result, held)
        budget = torch.cuda.get_device_properties(device).total_memory // GRAPH_SHARE
        while sum(g.nbytes for g in self.graphs.values()) > budget and len(self.graphs) > 1:
            oldest = next((k for k, g in self.graphs.items() if not g.busy), None)
            if oldest is None:
                break
            del self.graphs[oldest]

    def how(self) -> str:
        """How the judge runs on a GPU when asked for CUDA graphs."""
        if self.refused is not None:
            return (f"checks run eagerly: they could not be captured in a CUDA graph ({self.refused}), so none is "
                    "tried again in this process")
        return ("checks captured in a CUDA graph after the first batch of each batch layout, replayed for the other "
                "batches of that layout")


def _nothing() -> None:
    pass


_GRAPHS = JudgeGraphs()


def judge_graphs() -> JudgeGraphs:
    """This process's judge graphs."""
    return _GRAPHS


__all__ = ["GRAPH_SHARE", "JudgeGraph", "JudgeGraphs", "judge_graphs"]
