"""The `alibi` command: a thin shell over the library.

Each command group lives in its own module under `alibi/cli/` and exposes `register(subparsers)`,
which adds its parser and sets `func` (called with the parsed namespace, returning an exit code).
Exit codes (`EXIT_CODES`, printed by `alibi --help`): 0 no check fired, 1 a check fired (or an
inconclusive verdict under --strict), 2 bad input or usage, 3 a requested kernel is unavailable here,
4 a kernel raised while it ran (or a worker died), 130 interrupted (Ctrl-C).

Command modules import torch and the other heavy libraries inside their command functions, so
`alibi --help` and `alibi --version` start in a fraction of a second (a test holds this for every
module listed here). A command whose interruption leaves something worth keeping sets
`interrupted` (a function of the parsed namespace returning one line: what was kept and how to
continue) next to `func`; every other command writes its outputs only once they are complete.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
import sys

from alibi import __version__
from alibi.cli.examples import attach_examples
from alibi.errors import InputError, KernelUnavailable, WorkerFailed, is_disk_full, one_line

# Command modules, in the order `alibi --help` lists them.
COMMAND_MODULES = [
    "alibi.cli.conform",
    "alibi.cli.matrix",
    "alibi.cli.kernels",
    "alibi.cli.identify",
    "alibi.cli.probe",
    "alibi.cli.mutants",
    "alibi.cli.boundary",
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
    "alibi.cli.variations",
    "alibi.cli.analyze",
    "alibi.cli.sweep",
    "alibi.cli.report",
]


EXIT_CODES = """exit codes:
  0    no check fired (the verdict is pass, or inconclusive without --strict)
  1    a check fired: a finding about the kernels' bits (or an inconclusive verdict under --strict)
  2    bad input or usage: one line naming the input and the fix, nothing written
  3    a requested kernel is unavailable here (no GPU, a missing package, a broken plugin)
  4    a kernel raised while it ran, or a worker died: a failure to produce bits, not a finding
  130  interrupted (Ctrl-C)"""


def usage_message(message: str) -> str:
    """argparse's usage error, with a "did you mean" for a mistyped command instead of the list of every one."""
    m = re.search(r"argument (\S+): invalid choice: '?([^'\s]*)'? \(choose from (.*)\)$", message)
    if m is None:
        return message
    argument, typed, choices = m.group(1), m.group(2), [c.strip().strip("'") for c in m.group(3).split(",")]
    close = difflib.get_close_matches(typed, choices, n=1)
    what = f"{argument}: unknown value" if argument.startswith("-") else "unknown command"
    return f"{what} {typed!r}; " + (f"did you mean {close[0]!r}?" if close else f"choose from {', '.join(choices)}")


class _Parser(argparse.ArgumentParser):
    """argparse that exits with code 2 and a one-line message on usage errors (its default too)."""

    def error(self, message: str) -> None:  # pragma: no cover - exercised through main()
        command = self.prog.split(" ", 1)[1] + " " if " " in self.prog else ""
        self.exit(2, f"alibi: error: {usage_message(message)} (see 'alibi {command}--help')\n")


DESCRIPTION = ("Decide whether two scaled INT8 or FP8 GEMM kernels are interchangeable, bit for bit, and where "
               "they are not, show where they differ, why, and what it does to a model's tokens.")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="alibi", description=DESCRIPTION, epilog=EXIT_CODES,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"alibi {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    attach_examples(parser)  # each command's --help ends with an example (alibi/cli/examples.py)
    parser.set_defaults(_commands=sub.choices)
    return parser


EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C
NOTHING_KEPT = "nothing was written (alibi writes its outputs only once they are complete); run the command again"


def interrupted_line(args: argparse.Namespace | None) -> str:
    """The one line printed on Ctrl-C: what was kept, and how to resume or start over."""
    describe = getattr(args, "interrupted", None)
    what = NOTHING_KEPT
    if describe is not None:
        try:
            what = describe(args)
        except Exception:  # noqa: BLE001 - describing the state must never turn Ctrl-C into a traceback
            what = "the command's own intermediate files may remain; see its --help for how to resume"
    return f"alibi: interrupted (Ctrl-C): {what}"


def last_resort_line(exc: BaseException) -> str:
    """The one line for an OSError, RecursionError, UnicodeError or MemoryError no validation caught, or any
    error that says the disk is full."""
    if is_disk_full(exc):  # a write outside alibi's staged outputs (those name their destination themselves)
        where = getattr(exc, "filename", None)
        what = ((f"{where}: " if where is not None else "") + "the file system ran out of space (No space left on "
                "device); free space on it, or choose another output location (and TMPDIR for temporary files)")
    elif isinstance(exc, MemoryError):
        what = ("out of memory: the input asks for more than this machine has; use smaller inputs, or check the "
                "element budget (ALIBI_MAX_ELEMENTS)")
    elif isinstance(exc, RecursionError):
        what = "an input is nested too deeply to process (RecursionError); it is not a file alibi wrote"
    elif isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename is not None else ""
        what = f"{where}{exc.strerror or str(exc) or exc.__class__.__name__} ({exc.__class__.__name__}); check the path, " \
               "its permissions and the free space"
    else:
        what = f"an input is not valid text ({exc.__class__.__name__}: {exc})"
    return f"alibi: error: {one_line(what)[:400]}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv == ["--version"]:
        # Answered before any command module is imported: it needs nothing else.
        print(f"alibi {__version__}")
        return 0
    args = None
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra:  # named by the command they were given to, not by the top-level parser
            getattr(args, "_commands", {}).get(args.command, parser).error(f"unrecognized arguments: {' '.join(extra)}")
        return int(args.func(args))
    except (InputError, KernelUnavailable, WorkerFailed) as exc:
        print(f"alibi: error: {one_line(str(exc))}", file=sys.stderr)  # a path's newline cannot split it
        return exc.exit_code
    except KeyboardInterrupt:
        print(interrupted_line(args), file=sys.stderr)
        return EXIT_INTERRUPTED
    except (OSError, RecursionError, UnicodeError, MemoryError) as exc:
        # The last resort: every input is validated where it enters, so reaching here is a gap in
        # that validation. Still one line and exit 2, never a traceback (see `last_resort_line`).
        print(last_resort_line(exc), file=sys.stderr)
        return InputError.exit_code
    except Exception as exc:
        if not is_disk_full(exc):  # a library's error wrapping ENOSPC (safetensors, tokenizers): one line too
            raise
        print(last_resort_line(exc), file=sys.stderr)
        return InputError.exit_code


def entry() -> None:
    sys.exit(main())
