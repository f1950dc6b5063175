"""Third-party kernels (the `alibi.kernels` entry-point group), loaded so that a broken or lying package can neither
take `alibi` down with it nor have its outputs reported under another kernel's name.

A plugin is foreign code run in this process. Its import, its factory and its `available()` run in a daemon thread
that this process waits for at most `ALIBI_PLUGIN_TIMEOUT` seconds (default 60): any exception is caught there,
`sys.exit` included (SystemExit is not an `Exception`), and a hang costs only the wait. A thread rather than a
subprocess, because the kernel must be a live object of this process (conform runs it here): a child could only
probe the import, which would then run a second time here, unbounded. A daemon thread still hanging does not keep
the process from exiting, and a plugin that hung is not touched again in this process (its thread may hold its
module's import lock). What no thread can bound: a plugin that ends the process itself (`os._exit`, a crash in
native code), or one that never releases the GIL; and a library that installs signal handlers at import time
fails there, since only the main thread may (its reason then says so).

A plugin is refused, as an `UnavailableKernel` carrying the reason (`alibi kernels` lists it; `alibi conform`
exits 3 naming it), when its import, factory or `available()` raises or does not return in time; when its factory
returns something other than a `Kernel`, or `available()` something other than (bool, str); when its kernel's
`name` is not its entry-point name (a report would attribute its outputs to that other name), or its declaration
(`formats`, `device`, `epilogue`) is malformed; and when two packages register the same name (which one ran would
depend on the install order). An entry-point name that is a built-in kernel's, or of a built-in family (`emulator:`,
`emulator-fp8:`, `mutant:`), always means the built-in: that plugin is never loaded, and `shadowed` says why.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import threading
from collections.abc import Callable, Collection
from typing import Any

from alibi.errors import InputError, one_line, shown
from alibi.exact.emulator import EpilogueModel
from alibi.kernels.base import Kernel, UnavailableKernel
from alibi.kernels.catalog import BUILTIN, PATTERN_PREFIXES

TIMEOUT_ENV = "ALIBI_PLUGIN_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_S = 3600.0

# Plugins (name, target) that did not return in time, with the reason: never loaded again in this process.
_HUNG: dict[tuple[str, str], str] = {}


def timeout_s() -> float:
    """How long a plugin's import (with its factory), and then its `available()`, may take: `ALIBI_PLUGIN_TIMEOUT`."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_TIMEOUT_S:  # NaN fails too
        raise InputError(f"{TIMEOUT_ENV}={shown(raw)}: expected the seconds a kernel plugin may take to load, a number "
                         f"in (0, {MAX_TIMEOUT_S:g}]; unset it for the default {DEFAULT_TIMEOUT_S:g}")
    return value


def shadowed(name: str, registered: Collection[str] = ()) -> str | None:
    """What a plugin registered as `name` would take the name of (a built-in kernel, a built-in family, a kernel
    registered in this process with `alibi.kernels.registry.register`), or None when the name is its own."""
    if name in BUILTIN:
        return f"the built-in kernel {name!r}"
    for prefix in PATTERN_PREFIXES:
        if name.startswith(prefix):
            return f"the built-in family {prefix}<…>"
    if name in registered:
        return f"the kernel {name!r} registered in this process"
    return None


def describe(entry_point: Any, *, package: bool = False) -> str:
    """`plugin entry point NAME = 'module:attr'` (and ` (package P)`), on one line."""
    text = f"plugin entry point {getattr(entry_point, 'name', '?')} = {getattr(entry_point, 'value', '?')!r}"
    return one_line(text + (f" (package {_package(entry_point)})" if package else ""))


def _package(entry_point: Any) -> str:
    return str(getattr(getattr(entry_point, "dist", None), "name", None) or "?")


def shadowing_reason(entry_point: Any, what: str) -> str:
    return (f"{describe(entry_point, package=True)} is refused: the name belongs to {what} and always means it; "
            "rename the entry point and its Kernel.name")


def load_plugin(name: str, registrations: list) -> Kernel:
    """The kernel of the plugin registered as `name` (`registrations`: every installed package's entry point of that
    name), or an `UnavailableKernel` saying in one line why it is refused and what to do."""
    if len(registrations) > 1:
        return UnavailableKernel(name, f"plugin name {name!r} is registered by {len(registrations)} entry points ("
                                       + "; ".join(describe(ep, package=True) for ep in registrations)
                                       + "): which one ran would depend on the install order; uninstall all but one")
    entry_point = registrations[0]
    key = (name, str(getattr(entry_point, "value", "?")))
    if key in _HUNG:
        return UnavailableKernel(name, _HUNG[key])
    where, limit = describe(entry_point), timeout_s()
    owner = f"the package that registers it ({_package(entry_point)})"

    def hung(what: str) -> UnavailableKernel:
        """Refused for the life of the process: a plugin that hung once is not waited on again."""
        _HUNG[key] = f"{what}; fix or uninstall {owner}, or allow more time with {TIMEOUT_ENV}=SECONDS"
        return UnavailableKernel(name, _HUNG[key])

    status, made = _isolated(lambda: entry_point.load()(), limit)
    if status == "hung":
        return hung(f"{where} did not finish loading within {limit:g} s (its import or factory hangs)")
    if status == "raised":
        return UnavailableKernel(name, f"{where} cannot be loaded ({_described(made)}); fix or uninstall {owner}")
    if not isinstance(made, Kernel):
        return UnavailableKernel(name, f"{where} returned {type(made).__name__}, not an alibi.kernels.base.Kernel; "
                                       f"fix {owner}")
    kernel: Kernel = made
    problem = _declaration_problem(name, kernel)
    if problem:
        return UnavailableKernel(name, f"{where} is refused: {problem}; fix {owner}")
    status, answer = _isolated(kernel.available, limit)
    if status == "hung":
        return hung(f"{where}: its available() did not return within {limit:g} s")
    if status == "raised":
        return UnavailableKernel(name, f"{where}: its available() raised ({_described(answer)}); fix {owner}")
    if not (isinstance(answer, tuple) and len(answer) == 2 and type(answer[0]) is bool and isinstance(answer[1], str)):
        return UnavailableKernel(name, f"{where}: its available() returned {shown(answer)}, not (True or False, "
                                       f"reason); fix {owner}")
    # Asked once, isolated: the kernel answers that from now on (an available kernel stays so for the life of an
    # instance anyway, `Kernel.require_available`), and no later caller runs the plugin's available() unguarded.
    vars(kernel)["available"] = functools.partial(_answer, answer)
    return kernel


def _answer(answer: tuple[bool, str]) -> tuple[bool, str]:
    return answer


def _declaration_problem(name: str, kernel: Kernel) -> str | None:
    """Why the kernel's declaration cannot be taken at its word, or None. Read statically (no plugin code runs): a
    `name` that is a property could answer one name now and another in the report."""
    declared = {attr: inspect.getattr_static(kernel, attr, None) for attr in ("name", "formats", "device", "epilogue")}
    if type(declared["name"]) is not str or declared["name"] != name:
        return (f"its kernel is named {shown(declared['name'])}, not {name!r}; a plugin's Kernel.name must be its "
                "entry-point name (a plain string), so that no report attributes its outputs to another kernel: make "
                "the two the same")
    available = inspect.getattr_static(type(kernel), "available", None)
    if hasattr(type(available), "__set__") or hasattr(type(available), "__delete__"):
        return "its kernel's available is a property, not a method; make it a method returning (bool, reason)"
    # The rest only where given as values (a property computes its own, which the plugin then answers for).
    formats, device, epilogue = (None if hasattr(type(v), "__get__") else v for v in list(declared.values())[1:])
    if formats is not None and not (isinstance(formats, tuple | list) and formats
                                    and all(type(f) is str for f in formats)):
        return f"its kernel declares formats = {shown(formats)}, not a tuple of format names such as ('int8',)"
    if device is not None and type(device) is not str:
        return f"its kernel declares device = {shown(device)}, not 'cpu', 'cuda' or 'cpu+cuda'"
    if epilogue is not None and not isinstance(epilogue, EpilogueModel):
        return (f"its kernel declares epilogue = {shown(epilogue)}, not an "
                "alibi.exact.emulator.EpilogueModel or None")
    return None


def _described(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({shown(exc.code)})"
    return f"{type(exc).__name__}: {one_line(str(exc))[:200]}"


def _isolated(call: Callable[[], Any], timeout: float) -> tuple[str, Any]:
    """`call()` in a daemon thread, waited for at most `timeout` seconds: ("returned", its value), ("raised", the
    exception, of any kind), or ("hung", None)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["returned"] = call()
        except BaseException as exc:  # noqa: BLE001 - foreign code: sys.exit and the like are its failure too
            box["raised"] = exc

    thread = threading.Thread(target=target, name="alibi-plugin-load", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return "hung", None
    return next(iter(box.items()))
