"""Kernel registry: built-in kernels (imported lazily) plus the `alibi.kernels` entry-point group.

Names: `emulator:<order>[+<bias mode>]` (e.g. `emulator:w_then_a`, `emulator:a_then_w+add_after_cast`),
`torch-cpu`, `triton`, `triton:w_then_a+fma`, the kernels of `alibi.kernels.catalog.BUILTIN`, and the positive controls
`mutant:<fault>[@<severity>]:<base>` (any int8 base; see `alibi.kernels.mutants`). A third-party
package registers its own kernel under the entry-point group `alibi.kernels`
(`name = "pkg.module:KernelClass"`); the object loaded must be a zero-argument callable returning a
`Kernel`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from alibi.errors import InputError, one_line
from alibi.exact.emulator import ORDERS, EpilogueModel
from alibi.kernels.base import Kernel, UnavailableKernel
from alibi.kernels.catalog import BUILTIN, did_you_mean, plugin_entry_points
from alibi.kernels.cpu import EmulatorKernel
from alibi.kernels.mutants import parse_mutant

_BUILTIN = BUILTIN
_EXTRA: dict[str, Callable[[], Kernel]] = {}


def register(name: str, factory: Callable[[], Kernel]) -> None:
    """Register a kernel factory at run time (tests, notebooks). Entry points are the packaged way."""
    _EXTRA[name] = factory


def _plugins() -> dict[str, object]:
    return plugin_entry_points()


def kernel_names() -> list[str]:
    emulators = [f"emulator:{o}" for o in ORDERS]
    return emulators + sorted(_BUILTIN) + sorted(_EXTRA) + sorted(_plugins())


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
        return parse_mutant(name, get_kernel)
    plugins = _plugins()
    if name in plugins:
        return _load_plugin(name, plugins[name])
    raise InputError(f"unknown kernel {name!r}; {did_you_mean(name, kernel_names())} (see 'alibi kernels')")


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
                                       "not an alibi.kernels.base.Kernel; fix the package that registers it")
    return kernel


def _emulator(name: str) -> Kernel:
    spec = name.removeprefix("emulator:")
    try:
        model = EpilogueModel.parse(spec)
    except InputError as exc:
        raise InputError(f"unknown kernel {name!r}: {exc}") from None
    return EmulatorKernel(model)


__all__ = ["get_kernel", "kernel_names", "register"]
