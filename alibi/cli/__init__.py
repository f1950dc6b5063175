"""The `alibi` command: a thin shell over the library.

Each command group lives in its own module under `alibi/cli/` and exposes `register(subparsers)`,
which adds its parser and sets `func` (called with the parsed namespace, returning an exit code).
Exit codes: 0 all applicable checks pass, 1 a check fired, 2 bad input or usage, 3 a requested
kernel is unavailable here.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from alibi import __version__
from alibi.errors import InputError, KernelUnavailable

# Command modules, in the order `alibi --help` lists them.
COMMAND_MODULES = [
    "alibi.cli.conform",
    "alibi.cli.kernels",
    "alibi.cli.identify",
    "alibi.cli.run",
    "alibi.cli.manifest",
    "alibi.cli.prereg",
    "alibi.cli.bench",
    "alibi.cli.model",
    "alibi.cli.prompts",
    "alibi.cli.capture",
    "alibi.cli.predict",
    "alibi.cli.eval",
    "alibi.cli.pow2",
    "alibi.cli.replay",
    "alibi.cli.analyze",
]


class _Parser(argparse.ArgumentParser):
    """argparse that exits with code 2 and a one-line message on usage errors (its default too)."""

    def error(self, message: str) -> None:  # pragma: no cover - exercised through main()
        self.exit(2, f"alibi: error: {message} (see 'alibi {self.prog.split(' ', 1)[-1]} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="alibi", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"alibi {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (InputError, KernelUnavailable) as exc:
        print(f"alibi: error: {exc}", file=sys.stderr)
        return exc.exit_code


def entry() -> None:
    sys.exit(main())
