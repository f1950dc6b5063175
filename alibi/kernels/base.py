"""The kernel interface: an implementation of the scaled GEMM under test.

A kernel declares its epilogue model (the exact fp32 program it claims to run); the
epilogue-model conformance check holds it to that claim bit for bit. A kernel that cannot run on
this machine says why through `available()` and is never silently replaced by another.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import platform
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from alibi.errors import InputError, KernelRaised, KernelUnavailable, one_line, shown
from alibi.exact.emulator import EpilogueModel
from alibi.exact.fp8_mma import AccumulationSchedule
from alibi.governance.manifest import folder_files
from alibi.io.digests import sha256_file, sha256_listing
from alibi.tiles.tile import Tile

T = TypeVar("T")  # what `availability`'s locate finds


@dataclass(frozen=True)
class KernelOutput:
    """What one run of a kernel produced, on the CPU.

    out: the output [M,N] in the tile's out_dtype; acc: the kernel's own int32 accumulator when it
    can expose one (else None); evidence: how it ran (device, backend, versions, build digest).
    """

    out: torch.Tensor
    acc: torch.Tensor | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


TORCH_EPILOGUE = EpilogueModel("w_then_a", "add_before_cast")


def torch_epilogue(acc: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor, bias: torch.Tensor | None,
                   out_dtype: torch.dtype) -> torch.Tensor:
    """`TORCH_EPILOGUE` in separate torch fp32 ops on `acc`'s device (each op rounds once, no fusion):
    RN32(s_w·float(acc)), then RN32(s_a·t), then RN32(y + bias), then the output cast."""
    M, N = acc.shape
    y = acc.to(torch.float32) * s_w.to(torch.float32).reshape(1, -1).expand(1, N)
    y = y * s_a.to(torch.float32).reshape(-1, 1).expand(M, 1)
    if bias is not None:
        y = y + bias.to(torch.float32).reshape(1, N)
    return y.to(out_dtype)


def _source_file(obj: Any) -> str | None:
    try:
        return inspect.getsourcefile(obj)
    except (OSError, TypeError):  # defined in __main__ or a C extension: no source file
        return None


class Kernel:
    """Base class. Subclasses set the class attributes and implement `scaled_mm`."""

    name: str = "?"
    formats: tuple[str, ...] = ("int8",)
    device: str = "cpu"  # where it runs: "cpu", "cuda" or "cpu+cuda"
    epilogue: EpilogueModel | None = None
    description: str = ""
    bias_in_output_dtype: bool = False
    """True for a kernel that takes a bias only in the output dtype (vLLM's: its epilogue loads the bias as
    the output type); `alibi identify` then probes it with tiles whose bias is in that dtype."""
    accumulation: AccumulationSchedule | None = None
    """fp8 kernels: how the tensor core's chains are accumulated (`alibi.exact.fp8_mma`), the declaration conform
    holds the accumulator to beside the epilogue; None for int8 (exact) and for a kernel that declares none."""

    replayable: bool = False
    """True where every launch of `run` depends on nothing but the shapes, dtypes and values of the tile's operands
    (no host state that changes from call to call, no synchronization with the host): the conformance pipeline then
    records an arm's launches once per tile layout in a CUDA graph and replays them (`alibi.conform.launches`).
    Only the class that sets it counts (`launches_replayable`): a subclass that launches otherwise (a plugin's,
    a mutant) launches eagerly unless it declares it again."""

    scaled_accumulator: bool = False
    """Block-scaled fp8 kernels: the scales enter the accumulation, so `accumulator` takes them too
    (`accumulator(a_q, w_q, s_a, s_w)`, the fp32 accumulator after the scales) and `run` passes them."""

    def epilogue_at(self, M: int) -> EpilogueModel | None:
        """The epilogue model of a call with M rows (a kernel whose epilogue depends on M overrides this)."""
        return self.epilogue

    def schedule_at(self, M: int, N: int, K: int) -> AccumulationSchedule | None:
        """The accumulation schedule of an M × N × K call (a kernel whose schedule depends on the shape overrides
        this; `nondeterministic` reductions are declared in the schedule itself)."""
        return self.accumulation

    def available(self) -> tuple[bool, str]:
        """(True, how it will run) or (False, why not and what to install)."""
        return True, "runs on the CPU"

    def build_digest(self) -> str:
        """Hex sha256 identifying the code this kernel runs (recorded in every manifest's treatment).

        The default covers the source the kernel can run: every module of the class's hierarchy (a
        plugin's own module included), the emulator and numerics modules, and the C++/CUDA files in
        a `csrc/` folder beside the kernel's module, with the class's name. It changes whenever that
        code changes (and sometimes when a neighbour's does: over-inclusive, never blind); a class
        defined without a source file (`python -c`) contributes its name only. A kernel that knows
        its build (a compiled library it loaded, a wheel's sources) overrides this with that digest.
        """
        modules = {c.__module__ for c in type(self).__mro__ if c.__module__ != "builtins"}
        modules |= {"alibi.exact.emulator", "alibi.exact.numerics"}
        files: dict[str, Path] = {}
        for name in sorted(modules):
            source = _source_file(sys.modules.get(name) or importlib.import_module(name))
            if source:
                files[name] = Path(source)
        kernel_source = _source_file(type(self))
        csrc = Path(kernel_source).parent / "csrc" if kernel_source else None
        if csrc is not None and csrc.is_dir():
            files |= {f"csrc/{rel}": csrc / rel for rel in folder_files(csrc, exclude=())}
        return sha256_listing(((label, sha256_file(path)) for label, path in sorted(files.items())),
                              header=f"class {type(self).__module__}.{type(self).__qualname__}\n")

    def launches_replayable(self) -> bool:
        """Whether this kernel's own class declares its launches replayable (`replayable`; an inherited
        declaration does not count)."""
        return type(self).__dict__.get("replayable", False) is True

    def torch_device(self) -> torch.device:
        return torch.device("cuda" if self.device == "cuda" else "cpu")

    def require_available(self) -> None:
        """Raise KernelUnavailable unless `available()`. A kernel found available stays so for the life of this
        instance: `run` asks before every launch, and some checks import a library or hash its files, so the
        answer is taken once per kernel (once per pair in a conformance run), not once per launch."""
        if self.__dict__.get("_found_available"):
            return
        ok, reason = self.available()
        if not ok:
            raise KernelUnavailable(f"kernel {self.name!r} is not available here: {reason}")
        self._found_available = True

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """The raw op: operands already on `torch_device()`, output [M,N] there too."""
        raise NotImplementedError

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor | None:
        """The kernel's own int32 accumulator for these operands, when it can expose one."""
        return None

    def evidence(self) -> dict[str, Any]:
        """How this kernel runs here: enough to tell two runs apart (versions, device, backend)."""
        ev: dict[str, Any] = {"kernel": self.name, "device": self.device, "torch": torch.__version__,
                              "python": platform.python_version(),
                              "epilogue_model": self.epilogue.name if self.epilogue else None}
        if self.torch_device().type == "cuda" and torch.cuda.is_available():
            ev["gpu"] = gpu_name(torch.cuda.current_device())
            ev["cuda"] = torch.version.cuda
        return ev

    def run(self, tile: Tile, *, accumulator: bool = False, on_device: bool = False,
            evidence: bool = True, wait: bool = True) -> KernelOutput:
        """Run on one tile: the operands go to the kernel's device (no copy when they are there already).

        accumulator: also launch the kernel's accumulator op (`KernelOutput.acc`, None when it exposes
        none); only a check that uses it asks, so other launches cost one GEMM. evidence: this
        launch's, taken right after the output was produced (before any accumulator launch).
        on_device: leave the output on the kernel's device (the conformance pipeline compares there);
        by default it comes back on the CPU. evidence=False skips recording it (for launches whose
        output only a check compares, e.g. M-invariance subsets). wait: on a GPU, wait for the launch to finish,
        so that an error the device reports afterwards is raised here, naming this kernel and tile; False (with
        on_device) leaves the launch queued, and the caller waits with `wait_for` (the conformance pipeline, once
        per unit: a synchronization per launch costs more than a small tile's kernel).
        """
        self.require_available()
        if tile.fmt not in self.formats:
            raise InputError(f"kernel {self.name!r} handles {', '.join(self.formats)} tiles; "
                             f"tile {tile.name!r} is {tile.fmt}")
        dev = self.torch_device()
        ops = {k: (v if v is None or v.device == dev else v.to(dev)) for k, v in operands(tile).items()}
        with raised_as_kernel_failure(repr(self.name), tile.name):
            out = self.scaled_mm(ops["a_q"], ops["s_a"], ops["w_q"], ops["s_w"], ops["bias"], tile.out_dtype)
            ev = self.evidence() if evidence else {}
            scales = (ops["s_a"], ops["s_w"]) if self.scaled_accumulator else ()
            acc = self.accumulator(ops["a_q"], ops["w_q"], *scales) if accumulator else None
            if dev.type == "cuda" and (wait or not on_device):
                torch.cuda.synchronize()
        if not on_device:
            out, acc = out.cpu(), (None if acc is None else acc.cpu())
        return KernelOutput(out=out, acc=acc, evidence=ev)


@functools.cache
def gpu_name(index: int) -> str:
    """The name of CUDA device `index`, asked once per process (every launch's evidence names it)."""
    return torch.cuda.get_device_name(index)


def cuda_problem(*, fp8: bool) -> str | None:
    """Why this machine cannot run a CUDA kernel (an `fp8` one needs compute capability 8.9 or newer), or None."""
    if not torch.cuda.is_available():
        return "no CUDA GPU here (torch.cuda.is_available() is False)"
    if fp8 and torch.cuda.get_device_capability() < (8, 9):
        major, minor = torch.cuda.get_device_capability()
        return f"fp8 needs compute capability 8.9 or newer; this GPU is sm_{major}{minor}"
    return None


def availability(locate: Callable[[], T], gpu_problem: Callable[[], str | None],
                 ready: Callable[[T], str]) -> tuple[bool, str]:
    """`Kernel.available()` for a kernel whose code must be found and that needs a GPU: `locate()` finds the code
    (KernelUnavailable saying why when it cannot), `gpu_problem()` says why this machine's GPU cannot run it (None
    when it can). Unavailable with every problem joined by "; ", else available with `ready(what locate found)`."""
    problems = []
    found = None
    try:
        found = locate()
    except KernelUnavailable as exc:
        problems.append(str(exc))
    problem = gpu_problem()
    if problem:
        problems.append(problem)
    if problems:
        return False, "; ".join(problems)
    return True, ready(found)


@contextmanager
def raised_as_kernel_failure(kernel: str, tile: str, *, when: str = "raised") -> Iterator[None]:
    """Turn an exception a kernel raises while it runs into `KernelRaised` (exit 4), one line naming the kernel
    (`kernel`: its name, or a phrase naming several), the tile and the error: a crash must not read as a finding
    (exit 1) or end in a traceback. A kernel's own refusals (InputError, KernelUnavailable) and MemoryError keep
    their meaning and pass through; so does KeyboardInterrupt, but not SystemExit (a kernel's `sys.exit` must not
    end a run without its report, or with exit 0). when: what the kernel did, as the message says it."""
    try:
        yield
    except (InputError, KernelUnavailable, KernelRaised, MemoryError):
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any other exception of third-party code is its failure
        raise KernelRaised(f"kernel {kernel} {when} on tile {shown(tile)}: {type(exc).__name__}: "
                           f"{one_line(str(exc))[:300]}") from exc


def _queued_on_gpu(kernels: list[Kernel]) -> str | None:
    """The names of `kernels`, as a phrase, when any of them queues launches on a GPU (else None)."""
    if any(k.torch_device().type == "cuda" for k in kernels) and torch.cuda.is_available():
        return " or ".join(repr(name) for name in dict.fromkeys(k.name for k in kernels))
    return None


WAITING = "failed on the GPU (reported when waiting for its launches)"


def wait_for(kernels: list[Kernel], tile: str) -> None:
    """Wait for the GPU launches of `kernels` on `tile`, queued with `run(..., wait=False)`. An error the device
    reports now is one of theirs: `KernelRaised` names them all, since the device does not say which launch
    failed (`alibi identify --kernel K` runs one alone)."""
    names = _queued_on_gpu(kernels)
    if names is not None:
        with raised_as_kernel_failure(names, tile, when=WAITING):
            torch.cuda.synchronize()


@contextmanager
def device_errors_of(kernels: list[Kernel], tile: str) -> Iterator[None]:
    """Work queued after the GPU launches of `kernels` on `tile` without waiting for them (the checks of their
    outputs), and the wait for its results: a device error (`torch.AcceleratorError`) reported in this block is
    one of the launches' (`wait_for`'s `KernelRaised`: the device does not say which launch failed, and the work
    queued after them, torch's own operations on valid tensors, does not fail on the device). Any other error
    passes as it is."""
    names = _queued_on_gpu(kernels)
    try:
        yield
    except torch.AcceleratorError as exc:
        if names is None:
            raise
        with raised_as_kernel_failure(names, tile, when=WAITING):
            raise exc from None


OPERANDS = ("a_q", "s_a", "w_q", "s_w", "bias")


def operands(tile: Tile) -> dict[str, torch.Tensor | None]:
    """A tile's five operand tensors by name (bias None when the tile has none)."""
    return {k: getattr(tile, k) for k in OPERANDS}


# Where `packed` places each operand in its buffer: at a multiple of this many bytes (every dtype's alignment, and the
# 16 bytes vectorized kernels want).
PACK_ALIGN = 256


def _aligned_bytes(t: torch.Tensor) -> int:
    return -(-t.numel() * t.element_size() // PACK_ALIGN) * PACK_ALIGN


def packed_views(buffer: torch.Tensor, present: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The views of `buffer` (uint8) that `packed` placed tensors like `present` (shapes, dtypes, order) at."""
    views, offset = {}, 0
    for k, v in present.items():
        views[k] = buffer[offset:offset + v.numel() * v.element_size()].view(v.dtype).view(v.shape)
        offset += _aligned_bytes(v)
    return views


def views_like(buffer: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors of `buffer` (uint8, starting its storage) placed as `like`'s lie in theirs: each with the dtype,
    shape, strides and offset of its namesake, views of a buffer of the same size (a copy of it: `packed`'s views
    of the copy). One view of `buffer` per dtype, one strided view of that per tensor."""
    typed: dict[torch.dtype, torch.Tensor] = {}
    views = {}
    for k, v in like.items():
        if v.dtype not in typed:
            typed[v.dtype] = buffer.view(v.dtype)
        views[k] = typed[v.dtype].as_strided(v.shape, v.stride(), v.storage_offset())
    return views


def packed(tensors: dict[str, torch.Tensor], device: torch.device | str
           ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`tensors` copied onto `device` into one buffer (uint8), each contiguous at an offset aligned to `PACK_ALIGN`
    bytes: the buffer and the views, by name. Host tensors bound for a GPU are packed on the host first, in pinned
    memory, and cross in one asynchronous copy: a copy from pageable memory, one per tensor, would hold the host
    until it is done."""
    device = torch.device(device)
    staged = device.type == "cuda" and all(v.device.type == "cpu" for v in tensors.values())
    size = sum(_aligned_bytes(v) for v in tensors.values())
    buffer = torch.empty(size, dtype=torch.uint8, device="cpu" if staged else device, pin_memory=staged)
    views = packed_views(buffer, tensors)
    for k, view in views.items():
        view.copy_(tensors[k])
    if staged:
        buffer = buffer.to(device, non_blocking=True)  # the pinned block is kept until the copy is done
        views = views_like(buffer, views)
    return buffer, views


def pack(tensors: dict[str, torch.Tensor], device: torch.device | str) -> dict[str, torch.Tensor]:
    """The views of `packed`: `tensors` on `device` in one buffer, by name."""
    return packed(tensors, device)[1]


def buffer_groups(present: dict[str, torch.Tensor]) -> list[tuple[list[str], bool]]:
    """The names of `present` grouped by the buffer (storage) their tensors lie in, each group with whether it is
    copied as its whole buffer: tensors that fill a buffer between them (a `pack`ed tile's operands, or all but a
    regime's own scales of one) are, one copy keeping each in its place; a tensor alone in its buffer, or in a
    buffer much larger than the group, is copied by itself (a group of one each)."""
    by_buffer: dict[tuple[torch.device, int], list[str]] = {}
    for k, v in present.items():
        by_buffer.setdefault((v.device, v.untyped_storage().data_ptr()), []).append(k)
    groups: list[tuple[list[str], bool]] = []
    for keys in by_buffer.values():
        filled = sum(_aligned_bytes(present[k]) for k in keys)
        if len(keys) > 1 and present[keys[0]].untyped_storage().nbytes() <= filled + filled // 8:
            groups.append((keys, True))
        else:
            groups.extend(([k], False) for k in keys)
    return groups


def whole_buffer(t: torch.Tensor) -> torch.Tensor:
    """The whole buffer (storage) `t` lies in, as uint8."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def placed_like(buffer: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """A tensor in `buffer` (a whole buffer, uint8) where `t` lies in its own: same offset, shape and strides."""
    return torch.empty(0, dtype=t.dtype, device=buffer.device).set_(
        buffer.untyped_storage(), t.storage_offset(), t.shape, t.stride())


def private_copy(tile: Tile, device: torch.device | str | None = None) -> Tile:
    """`tile` with every operand cloned (onto `device` when given): an arm that writes into its
    inputs cannot change what the other arm, or a later check, sees. Operands that fill one buffer between them
    are copied with one copy of the buffer, each keeping its place, shape and strides (`buffer_groups`)."""
    def copy(t: torch.Tensor) -> torch.Tensor:
        return t.to(device, copy=True) if device is not None else t.clone()

    present = {k: v for k, v in operands(tile).items() if v is not None}
    copies: dict[str, torch.Tensor] = {}
    for keys, whole in buffer_groups(present):
        if whole:
            buffer = copy(whole_buffer(present[keys[0]]))
            copies.update((k, placed_like(buffer, present[k])) for k in keys)
        else:
            copies.update((k, copy(present[k])) for k in keys)
    return tile.replace(**copies)


class UnavailableKernel(Kernel):
    """Stands in for a built-in kernel whose module cannot be imported here; it never runs."""

    def __init__(self, name: str, reason: str):
        self.name, self._reason = name, reason

    def available(self) -> tuple[bool, str]:
        return False, self._reason
