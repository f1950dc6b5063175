"""alibi.progress: a bar on a terminal, plain lines elsewhere, nothing when quiet."""

from __future__ import annotations

import io
import re

import pytest

from alibi.errors import InputError
from alibi.progress import ENV_VAR, Progress, choose_mode


class Terminal(io.StringIO):
    """A stream that says it is a terminal, as stderr does in an interactive shell."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _no_forced_mode(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv("TERM", "xterm")


def test_a_stream_that_is_not_a_terminal_gets_one_plain_line_per_unit():
    out = io.StringIO()
    p = Progress("conform", stream=out)
    for done in (1, 2, 3):
        p(done, 3, f"tile{done} [real]")
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert all(re.fullmatch(rf"\[{i}/3\] tile{i} \[real\] \(\d+\.\d s\)", line) for i, line in enumerate(lines, 1))
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_a_terminal_gets_a_bar_with_the_count_the_rate_and_the_label():
    out = Terminal()
    p = Progress("conform", stream=out, unit="unit")
    p(1, 4, "layers.0.q_proj [real]")
    p(4, 4, "layers.3.down_proj [pow2]")
    text = out.getvalue()
    assert p.mode == "bar" and "\r" in text
    final = text.split("\r")[-1]
    assert "conform" in final and "4/4" in final and "100%" in final
    assert re.search(r"[\d.?]+ ?(unit/s|s/unit)", final)
    assert "layers.3.down_proj [pow2]" in final
    assert text.endswith("\n")  # the bar closed itself when done reached total


def test_quiet_prints_nothing_in_any_stream():
    for stream in (io.StringIO(), Terminal()):
        p = Progress("conform", stream=stream, quiet=True)
        p(1, 2, "x")
        p.note("a note")
        p(2, 2, "y")
        assert stream.getvalue() == ""


def test_a_label_with_a_newline_stays_on_one_progress_line():
    out = io.StringIO()
    Progress(stream=out)(1, 1, "line one\nline two\r<b>")
    assert out.getvalue().count("\n") == 1 and "line one line two <b>" in out.getvalue()


def test_alibi_progress_overrides_the_terminal_test(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "lines")
    assert choose_mode(Terminal()) == "lines"
    monkeypatch.setenv(ENV_VAR, "bar")
    assert choose_mode(io.StringIO()) == "bar"
    assert choose_mode(io.StringIO(), quiet=True) == "off"  # --quiet wins over the environment
    monkeypatch.setenv(ENV_VAR, "fancy")
    with pytest.raises(InputError, match=f"{ENV_VAR}='fancy' is not a progress mode"):
        choose_mode(io.StringIO())


def test_a_dumb_terminal_gets_plain_lines(monkeypatch):
    monkeypatch.setenv("TERM", "dumb")
    assert choose_mode(Terminal()) == "lines"


def test_a_note_is_printed_above_a_live_bar_not_into_it():
    out = Terminal()
    p = Progress("run", stream=out)
    p(1, 3, "first")
    p.note("resuming: 1 unit done earlier")
    p(3, 3, "last")
    assert "resuming: 1 unit done earlier\n" in out.getvalue()
