"""Kernel registry: built-in kernels (imported lazily) plus the `alibi.kernels` entry-point group.

Names: `emulator:<order>[+<bias mode>]` (e.g. `emulator:w_then_a`, `emulator:a_then_w+add_after_cast`),
`emulator-fp8:<schedule>:<order>[+<bias mode>]` (the fp8 step model under a declared accumulation schedule, e.g.
`emulator-fp8:fast-accum:w_then_a`, `emulator-fp8:promote-128:a_then_w+add_after_cast`),
`emulator-fp8-block:<block schedule>:<bias mode>` (block-scaled fp8 under a declared block schedule, e.g.
`emulator-fp8-block:block128:fma(sa*sw,p,acc):add_before_cast`; `alibi.exact.fp8_block_mma`), `torch-cpu`, `triton`, `triton:w_then_a+fma`, the kernels of `alibi.kernels.catalog.BUILTIN`, and the positive controls
`mutant:<fault>[@<severity>]:<base>` (any int8 base; see `alibi.kernels.mutants`). A third-party
package registers its own kernel under the entry-point group `alibi.kernels`
(`name = "pkg.module:KernelClass"`); the object loaded must be a zero-argument callable returning a
`Kernel` named like its entry point. `alibi.kernels.plugins` loads it isolated (a time limit, every exception caught)
and refuses one that fails, hangs, lies about its name or takes a built-in's name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from alibi.errors import InputError
from alibi.exact.emulator import ORDERS, EpilogueModel
from alibi.kernels.base import Kernel, UnavailableKernel
from alibi.kernels.catalog import BUILTIN, did_you_mean, plugin_registrations
from alibi.kernels.plugins import load_plugin, shadowed, shadowing_reason
from alibi.exact.fp8_block_mma import PROMOTIONS, RESCALE, parse_block_schedule
from alibi.exact.fp8_mma import parse_schedule
from alibi.kernels.block_mutants import parse_block_mutant
from alibi.kernels.cpu import BlockFp8EmulatorKernel, EmulatorKernel, Fp8EmulatorKernel
from alibi.kernels.mutants import parse_mutant

_BUILTIN = BUILTIN
_EXTRA: dict[str, Callable[[], Kernel]] = {}


def register(name: str, factory: Callable[[], Kernel]) -> None:
    """Register a kernel factory at run time (tests, notebooks). Entry points are the packaged way."""
    _EXTRA[name] = factory


def _plugins() -> dict[str, list]:
    """The installed plugins by name (each with every package's entry point of that name), but for those whose name
    is a built-in's or a registered kernel's: that name means the built-in (`shadowing_plugins` lists them)."""
    return {name: eps for name, eps in plugin_registrations().items() if shadowed(name, _EXTRA) is None}


def shadowing_plugins() -> list[tuple[str, str]]:
    """(entry-point name, why it is refused) of each installed plugin registered under a built-in's name (or a
    registered kernel's), which is never loaded: `alibi kernels` lists them apart, marked."""
    return [(name, shadowing_reason(ep, what)) for name, eps in sorted(plugin_registrations().items())
            if (what := shadowed(name, _EXTRA)) is not None for ep in eps]


def kernel_names() -> list[str]:
    emulators = [f"emulator:{o}" for o in ORDERS]
    emulators += [f"{Fp8EmulatorKernel.PREFIX}{s}:{o}" for s in ("fast-accum", "promote-128") for o in ORDERS]
    emulators += [f"{BlockFp8EmulatorKernel.PREFIX}block128:{p}:add_before_cast" for p in [*PROMOTIONS, RESCALE]]
    return emulators + sorted(_BUILTIN) + sorted(_EXTRA) + sorted(_plugins())


def split_kernel_names(text: str) -> list[str]:
    """A comma-separated list of kernel names, split only at commas outside parentheses: a block emulator's name
    holds its promotion, `fma(sa*sw,p,acc)`, whose commas are part of the name."""
    names, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            names.append(text[start:i])
            start = i + 1
    names.append(text[start:])
    return [n.strip() for n in names if n.strip()]


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
    if name.startswith(Fp8EmulatorKernel.PREFIX):
        return _fp8_emulator(name)
    if name.startswith(BlockFp8EmulatorKernel.PREFIX):
        return _fp8_block_emulator(name)
    if name in _EXTRA:
        return _EXTRA[name]()
    if name in _BUILTIN:
        return _load(name, _BUILTIN[name])
    if name.startswith("mutant:"):  # mutant:<fault>[@<severity>]:<base>
        return parse_block_mutant(name, get_kernel) or parse_mutant(name, get_kernel)
    plugins = _plugins()
    if name in plugins:
        return load_plugin(name, plugins[name])
    raise InputError(f"unknown kernel {name!r}; {did_you_mean(name, kernel_names())} (see 'alibi kernels')")


def _emulator(name: str) -> Kernel:
    spec = name.removeprefix("emulator:")
    try:
        model = EpilogueModel.parse(spec)
    except InputError as exc:
        raise InputError(f"unknown kernel {name!r}: {exc}") from None
    return EmulatorKernel(model)


def _fp8_emulator(name: str) -> Kernel:
    schedule, sep, spec = name.removeprefix(Fp8EmulatorKernel.PREFIX).partition(":")
    if not sep:
        raise InputError(f"unknown kernel {name!r}: expected {Fp8EmulatorKernel.PREFIX}<schedule>:<epilogue model>, "
                         "e.g. emulator-fp8:fast-accum:w_then_a")
    try:
        return Fp8EmulatorKernel(parse_schedule(schedule), EpilogueModel.parse(spec))
    except InputError as exc:
        raise InputError(f"unknown kernel {name!r}: {exc}") from None


def _fp8_block_emulator(name: str) -> Kernel:
    schedule, sep, bias_mode = name.removeprefix(BlockFp8EmulatorKernel.PREFIX).rpartition(":")
    if not sep:
        raise InputError(f"unknown kernel {name!r}: expected {BlockFp8EmulatorKernel.PREFIX}<block schedule>:"
                         "<add_before_cast|add_after_cast>, e.g. emulator-fp8-block:block128:fma(sa*sw,p,acc):add_before_cast")
    try:
        return BlockFp8EmulatorKernel(parse_block_schedule(schedule), bias_mode)
    except InputError as exc:
        raise InputError(f"unknown kernel {name!r}: {exc}") from None


__all__ = ["get_kernel", "kernel_names", "register", "split_kernel_names"]
