"""Recording kernel launches in a CUDA graph, for the callers that replay them (the conformance pipeline's arms,
`alibi.conform.launches`; the model runner's decode steps, `alibi.model.decode_graphs`).

A capture records the launches a function makes on the device without running them; a replay runs them again,
reading and writing the same addresses. What the function's host code decided (a configuration, a shape, an
allocation) is fixed at the capture, so only launches that depend on nothing but the shapes and the values of
their inputs are replayed faithfully. A capture fails where the function synchronizes with the host or
copies from pageable host memory; the caller then launches eagerly and says why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def release_generator(device: torch.device) -> None:
    """Free the device's default generator after a failed capture. torch ends a capture that a host sync
    invalidated with an error before it takes the generator out of capture mode, and from then on every random
    op on the device raises "Offset increment outside graph capture encountered unexpectedly" (seen on an H100,
    torch 2.11: the next model's initialisation failed). The generator gets a copy of its own state: the same
    seed and offset, not capturing."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    generator = torch.cuda.default_generators[index]
    generator.graphsafe_set_state(generator.clone_state())


def captured(record: Callable[[], T], device: torch.device, pool: object) -> tuple[torch.cuda.CUDAGraph, T]:
    """The launches `record()` makes, captured (not run) in a CUDA graph on a side stream, its allocations from
    `pool` (`torch.cuda.graph_pool_handle()`), with what `record` returned: its tensors are the graph's, and each
    replay writes them again. Raises what the capture raised, the device left usable.

    Unlike `torch.cuda.graph`, which synchronizes the device, collects garbage and empties the allocator's cache
    before every capture, this costs the capture alone: a caller capturing once per tile shape pays it many times.
    The capture is local to this thread (`thread_local`): the pipeline launches from one thread."""
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            result = record()
        except BaseException:
            try:
                graph.capture_end()
            except RuntimeError:  # the capture the failure invalidated: what `record` raised is the news
                pass
            release_generator(device)
            raise
        try:
            graph.capture_end()
        except BaseException:
            release_generator(device)
            raise
    torch.cuda.current_stream(device).wait_stream(side)
    return graph, result


__all__ = ["captured", "release_generator"]
