"""Each arm's launches of a unit: eager, or replayed from a CUDA graph.

Per unit, an arm runs on a private copy of the tile's operands (its output, and its accumulator where a check
asks for it) and, in the real regime with the invariance checks on, on three row subsets and a second time
(`arm_launches`): about a dozen launches and copies, each costing the host tens of µs of Python and driver
calls, more than the device spends on a small tile's GEMMs (`alibi bench conform`). So on a GPU, an arm whose
kernel declares its launches replayable (`Kernel.replayable`) has them recorded once per launch key in a CUDA
graph (`ArmGraph`) and replayed for every later unit of that key: the unit's operands are copied into the
graph's inputs, the graph replays, and what it wrote (the output, the accumulator, the operands as the arm left
them, the invariance runs' outputs, packed into one buffer inside the graph) comes out in one copy. The key is
what fixes the launches (`launch_key`): the layout of the tile's operands (shapes, dtypes, strides), its scale
layout, its output dtype, whether the accumulator is asked for and whether the invariance runs are made.

The first unit of a key runs eagerly (its launches compile kernels and set libraries up, which a capture must
not do; their result is that unit's), then the capture records the same launches without running them. A kernel
whose class does not declare its launches replayable, or whose capture fails (it synchronizes with the host,
say), launches eagerly, and the report's kernel record says which and why (`ArmLauncher.how`). A replay makes
on the device exactly the launches the eager path makes, so every unit's result is to be the same bit for bit:
tests/conform/test_launches.py holds every declaring built-in kernel to that on a GPU. The pipeline replays unless
told not to (`run_conformance(..., graphs=False)`, `alibi conform --no-cuda-graphs`).

Graphs are kept per kernel instance while it lives (`launcher`), at most `GRAPH_BYTES` of output buffers each
(the least recently used graph goes first), all of one kernel's graphs in one memory pool: one capture's scratch
memory is reused by the next, which is safe because every replay is followed, on the same stream, by the copy of
its outputs, before any other replay.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from alibi.errors import InputError, one_line
from alibi.exact.fp8_block import LAYOUT_KEY
from alibi.exact.numerics import dtype_name
from alibi.kernels.base import (
    Kernel,
    buffer_groups,
    operands,
    packed,
    placed_like,
    private_copy,
    views_like,
    whole_buffer,
)
from alibi.kernels.graphs import captured
from alibi.tiles.tile import Tile

SUB_BATCH_SIZES = (1, 4, 16)

GRAPH_BYTES = 2**31
"""The output buffers one kernel's graphs may hold (2 GiB): past it, the least recently replayed graph is dropped."""


def sub_batches(M: int) -> list[list[int]]:
    """Row sets for the M-invariance check: 1 row at the start, 4 from the middle, 16 at the end."""
    rows = []
    for i, size in enumerate(SUB_BATCH_SIZES):
        if size >= M:
            continue
        start = (0, (M - size) // 2, M - size)[i]
        rows.append(list(range(start, start + size)))
    return rows


def sub_tile(t: Tile, rows: list[int]) -> Tile:
    """The rows `rows` (consecutive, as `sub_batches` gives them) of `t` as a tile of their own, its activations
    and their scales copied."""
    sub = t.rows(slice(rows[0], rows[-1] + 1))
    return sub.replace(a_q=sub.a_q.clone(), s_a=sub.s_a.clone())


@dataclass(frozen=True)
class ArmRun:
    """One arm's launches of a unit, on the check device: its output, its accumulator (when asked for; None where
    the kernel exposes none), the operands as it left them, and with the invariance runs the sub-batch outputs
    (rows, output) and a second run's output; the evidence of the launch that produced the output."""

    out: torch.Tensor
    acc: torch.Tensor | None
    operands: dict[str, torch.Tensor | None]
    subsets: list[tuple[list[int], torch.Tensor]] | None
    again: torch.Tensor | None
    evidence: dict[str, Any]

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor of the run by a name (`from_tensors` puts them back)."""
        named = {"out": self.out, **({"acc": self.acc} if self.acc is not None else {})}
        named |= {f"operand:{k}": v for k, v in self.operands.items() if v is not None}
        named |= {f"subset:{j}": out for j, (_, out) in enumerate(self.subsets or ())}
        return named | ({"again": self.again} if self.again is not None else {})

    def from_tensors(self, named: dict[str, torch.Tensor]) -> ArmRun:
        """This run with its tensors replaced by those of `named` (names as `tensors` gives them)."""
        return ArmRun(named["out"], named.get("acc"), {k: named.get(f"operand:{k}") for k in self.operands},
                      None if self.subsets is None else
                      [(rows, named[f"subset:{j}"]) for j, (rows, _) in enumerate(self.subsets)],
                      named.get("again"), self.evidence)


def arm_output(kernel: Kernel, out: torch.Tensor, t: Tile) -> torch.Tensor:
    if out.shape != (t.M, t.N) or out.dtype != t.out_dtype:
        raise InputError(f"kernel {kernel.name!r} returned {dtype_name(out.dtype)}{list(out.shape)} for tile "
                         f"{t.name!r}; expected {dtype_name(t.out_dtype)}[{t.M}, {t.N}]")
    return out.to(t.a_q.device)


def arm_launches(kernel: Kernel, t: Tile, *, accumulator: bool, invariance: bool) -> ArmRun:
    """The arm's launches on `t` (module docstring), queued, not waited for."""
    dev = t.a_q.device
    own = private_copy(t, kernel.torch_device())
    run = kernel.run(own, accumulator=accumulator, on_device=True, wait=False)
    out = arm_output(kernel, run.out, t)
    acc = None if run.acc is None else run.acc.to(dev)
    subsets = again = None
    if invariance:
        def output(tile: Tile) -> torch.Tensor:  # a launch only a check compares
            return kernel.run(tile, on_device=True, evidence=False, wait=False).out.to(dev)
        subsets = [(rows, output(sub_tile(t, rows))) for rows in sub_batches(t.M)]
        again = output(private_copy(t, kernel.torch_device()))
    return ArmRun(out, acc, operands(own), subsets, again, run.evidence)


def launch_key(t: Tile, accumulator: bool, invariance: bool) -> tuple:
    """What fixes an arm's launches on `t`: its operands' layout (and how they share buffers: `buffer_groups`),
    scale layout and output dtype, and which runs."""
    present = {k: v for k, v in operands(t).items() if v is not None}
    layout = tuple((k, v.dtype, tuple(v.shape), v.stride()) for k, v in present.items())
    sharing = []
    for keys, whole in buffer_groups(present):
        if whole:
            nbytes = present[keys[0]].untyped_storage().nbytes()
            sharing.append((nbytes, tuple((k, present[k].storage_offset()) for k in keys)))
    return layout, tuple(sharing), t.meta.get(LAYOUT_KEY), t.out_dtype, accumulator, invariance


@dataclass
class ArmGraph:
    """An arm's launches for one launch key, captured: the buffers the graph reads its operands from, each with the
    names it holds and whether it is a whole shared buffer (`inputs`, as `buffer_groups` groups a tile of the key),
    the buffer it writes its outputs into and their views at capture (`buffer`, `like`), and the eager run's
    structure (`template`: its rows, evidence and which outputs exist)."""

    graph: torch.cuda.CUDAGraph
    inputs: list[tuple[list[str], bool, torch.Tensor]]
    buffer: torch.Tensor
    like: dict[str, torch.Tensor]
    template: ArmRun

    @classmethod
    def capture(cls, kernel: Kernel, t: Tile, pool: object, *, accumulator: bool, invariance: bool) -> ArmGraph:
        present = {k: v for k, v in operands(t).items() if v is not None}
        inputs, static = [], {}
        for keys, whole in buffer_groups(present):
            v = present[keys[0]]
            if whole:
                buffer = torch.empty(v.untyped_storage().nbytes(), dtype=torch.uint8, device=v.device)
                static.update((k, placed_like(buffer, present[k])) for k in keys)
            else:
                buffer = static[keys[0]] = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
            inputs.append((keys, whole, buffer))
        static_tile = t.replace(**static)

        def record() -> tuple[ArmRun, torch.Tensor, dict[str, torch.Tensor]]:
            run = arm_launches(kernel, static_tile, accumulator=accumulator, invariance=invariance)
            return (run, *packed(run.tensors(), static_tile.a_q.device))
        graph, (run, buffer, like) = captured(record, t.a_q.device, pool)
        # the template holds the buffer's views, not the launches' own tensors: those go back to the pool, whose
        # next capture reuses them
        return cls(graph, inputs, buffer, like, run.from_tensors(like))

    def replay(self, t: Tile) -> ArmRun:
        """The arm's launches on `t` (of this graph's key): its operands copied in (a shared buffer in one copy),
        the graph replayed, what it wrote copied out."""
        for keys, whole, buffer in self.inputs:
            v = getattr(t, keys[0])
            buffer.copy_(whole_buffer(v) if whole else v)
        self.graph.replay()
        run = self.template.from_tensors(views_like(self.buffer.clone(), self.like))
        return replace(run, evidence=dict(run.evidence))


@dataclass
class ArmLauncher:
    """One kernel's launches for the conformance pipeline: its graphs by launch key, or why it launches eagerly
    (`refused`: the first failed capture, after which it is not tried again). The kernel holds its launcher
    (`launcher`) and the launcher holds the kernel weakly (`owner`): no reference cycle, so a kernel let go frees its
    graphs and their device memory at once, not at the garbage collector's next full pass."""

    owner: weakref.ReferenceType[Kernel]
    graphs: OrderedDict[tuple, ArmGraph] = field(default_factory=OrderedDict)
    refused: str | None = None
    pool: object = None

    @property
    def kernel(self) -> Kernel:
        kernel = self.owner()
        if kernel is None:  # a launcher is reached through its kernel only
            raise RuntimeError("an arm launcher outlived its kernel")
        return kernel

    def replayable(self, t: Tile) -> bool:
        return (self.refused is None and self.kernel.launches_replayable() and t.a_q.device.type == "cuda"
                and self.kernel.torch_device().type == "cuda")

    def launch(self, t: Tile, *, accumulator: bool, invariance: bool, graphs: bool = False) -> ArmRun:
        """The arm's launches on `t`: replayed from its key's graph when there is one, else eagerly (then, with
        `graphs` and a replayable kernel, the key's graph is captured for the next unit)."""
        if not graphs or not self.replayable(t):
            return arm_launches(self.kernel, t, accumulator=accumulator, invariance=invariance)
        key = launch_key(t, accumulator, invariance)
        graph = self.graphs.get(key)
        if graph is not None:
            self.graphs.move_to_end(key)
            return graph.replay(t)
        run = arm_launches(self.kernel, t, accumulator=accumulator, invariance=invariance)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        try:
            self.graphs[key] = ArmGraph.capture(self.kernel, t, self.pool, accumulator=accumulator,
                                                invariance=invariance)
        except Exception as exc:  # noqa: BLE001 - any failure of a kernel's code under capture: it launches eagerly
            self.refused = f"{type(exc).__name__}: {one_line(str(exc))}"[:300]
            self.graphs.clear()
            return run
        while sum(g.buffer.numel() for g in self.graphs.values()) > GRAPH_BYTES and len(self.graphs) > 1:
            self.graphs.popitem(last=False)
        return run

    def how(self, eager_because: str | None = None) -> str:
        """How the arm launched in a run that asked for CUDA graphs, for the report's kernel record: replayed from
        graphs, or eagerly and why (`eager_because`: why no arm of the run could be); '' for a CPU kernel."""
        if self.kernel.torch_device().type != "cuda":
            return ""
        if eager_because is not None:
            return f"launched eagerly: {eager_because}"
        if not self.kernel.launches_replayable():
            return ("launched eagerly: its class does not declare its launches replayable in a CUDA graph "
                    "(Kernel.replayable)")
        if self.refused is not None:
            return f"launched eagerly: its launches could not be captured in a CUDA graph ({self.refused})"
        return ("launches captured in a CUDA graph at the first unit of each tile layout and regime, replayed for "
                "the others")


def launcher(kernel: Kernel) -> ArmLauncher:
    """The kernel's launcher, kept on the instance while it lives (its graphs serve every pair it is an arm of)."""
    if "_arm_launcher" not in kernel.__dict__:
        kernel.__dict__["_arm_launcher"] = ArmLauncher(weakref.ref(kernel))
    return kernel.__dict__["_arm_launcher"]


__all__ = ["GRAPH_BYTES", "SUB_BATCH_SIZES", "ArmGraph", "ArmLauncher", "ArmRun", "arm_launches", "arm_output",
           "launch_key", "launcher", "sub_batches", "sub_tile"]
