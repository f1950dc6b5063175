"""The CLI boundary (alibi.cli.main): the last resort for errors no validation caught is one line, exit 2."""

from __future__ import annotations

import argparse

import pytest

import alibi.cli
from alibi.errors import InputError


def _parser_raising(exc: BaseException):
    def build() -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(prog="alibi")
        sub = p.add_subparsers(dest="command", required=True)

        def fail(args):
            raise exc

        sub.add_parser("boom").set_defaults(func=fail)
        return p
    return build


@pytest.mark.parametrize("exc,fragment", [
    (PermissionError(13, "Permission denied", "/data/tiles/t.safetensors"),
     "/data/tiles/t.safetensors: Permission denied (PermissionError)"),
    (OSError(28, "No space left on device"), "No space left on device"),
    (RecursionError("maximum recursion depth exceeded"), "nested too deeply"),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "not valid text (UnicodeDecodeError"),
    (MemoryError(), "out of memory"),
])
def test_an_uncaught_os_recursion_unicode_or_memory_error_is_one_line_and_exit_2(monkeypatch, capsys, exc, fragment):
    """Guards: these escaped main() as tracebacks (exit 1) wherever an input was not validated where it enters."""
    monkeypatch.setattr(alibi.cli, "build_parser", _parser_raising(exc))
    assert alibi.cli.main(["boom"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("alibi: error: ") and fragment in err, err


def test_an_input_error_message_with_control_characters_is_printed_escaped(monkeypatch, capsys):
    monkeypatch.setattr(alibi.cli, "build_parser", _parser_raising(InputError("tile 'a\nb\x1b[31m': bad")))
    assert alibi.cli.main(["boom"]) == 2
    assert capsys.readouterr().err == "alibi: error: tile 'a\\nb\\x1b[31m': bad\n"


def test_other_exceptions_are_not_swallowed(monkeypatch):
    monkeypatch.setattr(alibi.cli, "build_parser", _parser_raising(ZeroDivisionError("a bug")))
    with pytest.raises(ZeroDivisionError):
        alibi.cli.main(["boom"])
