"""`alibi kernels`: list the kernels this machine can run (and why not); `alibi kernels build` compiles one."""

from __future__ import annotations

import argparse
import json

from alibi.errors import InputError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("kernels", help="list kernels and their availability here")
    p.add_argument("--json", action="store_true", help="print a JSON list of objects")
    p.set_defaults(func=list_kernels)
    ks = p.add_subparsers(dest="kernels_command", parser_class=type(p))
    b = ks.add_parser("build", help="compile a JIT-built kernel without running it (needs nvcc, not a GPU)")
    b.add_argument("name", help="kernel to build, e.g. cutlass")
    b.add_argument("--arch", default="sm_90", help="target architecture, e.g. sm_90, sm_80 (default sm_90)")
    b.set_defaults(func=build_kernel)


def kernel_rows() -> list[dict]:
    # deferred: keeps torch out of start-up
    from alibi.kernels.registry import get_kernel, kernel_names, shadowing_plugins

    rows = []
    for name in kernel_names():
        k = get_kernel(name)
        ok, reason = k.available()
        rows.append({"name": name, "formats": list(k.formats), "device": k.device, "available": ok,
                     "reason": reason, "epilogue_model": k.epilogue.name if k.epilogue else None})
    # A plugin registered under a built-in's name is never loaded (the name means the built-in): marked, under a
    # name of its own, so that no row of the built-in's name describes it.
    for name, reason in shadowing_plugins():
        rows.append({"name": f"{name} (refused plugin)", "formats": [], "device": "-", "available": False,
                     "reason": reason, "epilogue_model": None})
    return rows


def list_kernels(args: argparse.Namespace) -> int:
    rows = kernel_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    header = ("name", "formats", "device", "available", "epilogue", "reason")
    table = [(r["name"], ",".join(r["formats"]), r["device"], "yes" if r["available"] else "no",
              r["epilogue_model"] or "-", r["reason"]) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *table)]
    for line in (header, *table):
        print("  ".join(str(x).ljust(w) for x, w in zip(line[:-1], widths[:-1])) + "  " + line[-1])
    return 0


def build_kernel(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    from alibi.kernels.registry import get_kernel

    kernel = get_kernel(args.name)
    if not hasattr(kernel, "build"):
        raise InputError(f"kernel {args.name!r} is not built ahead of time; only JIT-compiled kernels can be built")
    path = kernel.build(args.arch)
    print(f"built {args.name} for {args.arch}: {path}")
    return 0
