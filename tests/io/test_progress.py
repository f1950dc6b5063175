"""alibi.io.progress: a bar on a terminal, plain lines elsewhere, nothing when quiet."""

from __future__ import annotations

import io
import re

import pytest

from alibi.errors import InputError
from alibi.io.progress import ENV_VAR, Progress, choose_mode


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


EMU = ["--kernel-a", "emulator:w_then_a", "--kernel-b", "emulator:a_then_w", "--synthetic", "tiny"]


def _report_without_clock(folder) -> dict:
    import json

    doc = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    doc.pop("created_at")
    return doc


def test_conform_progress_goes_to_stderr_only_and_changes_no_result(tmp_path, capsys, monkeypatch):
    from alibi.cli import main

    assert main(["conform", *EMU, "--out", str(tmp_path / "lines")]) == 0
    lines = capsys.readouterr()
    units = [line for line in lines.err.splitlines() if re.match(r"\[\d+/4\] ", line)]
    assert len(units) == 4 and not re.search(r"^\[\d+/4\]", lines.out, re.MULTILINE)
    monkeypatch.setenv(ENV_VAR, "bar")
    assert main(["conform", *EMU, "--out", str(tmp_path / "bar")]) == 0
    bar = capsys.readouterr()
    assert "| 4/4 [" in bar.err and "| 4/4 [" not in bar.out  # the bar's own "done/total [elapsed" cell
    assert main(["conform", *EMU, "--out", str(tmp_path / "quiet"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    reports = [_report_without_clock(tmp_path / d) for d in ("lines", "bar", "quiet")]
    assert reports[0] == reports[1] == reports[2]


def test_alibi_run_reports_every_unit_through_the_progress_callback(tmp_path):
    import yaml

    from alibi.experiment import load_experiment, run_experiment

    exp = tmp_path / "smoke.yaml"
    exp.write_text(yaml.safe_dump({"name": "smoke", "kernels": {"a": "emulator:w_then_a", "b": "emulator:a_then_w"},
                                   "source": {"synthetic": {"preset": "tiny"}}, "out": str(tmp_path / "out")}))
    out = io.StringIO()
    result = run_experiment(load_experiment(exp), progress=Progress("run", stream=out))
    lines = out.getvalue().splitlines()
    assert len(lines) == result.computed_units == 4
    assert [line.split("]")[0] for line in lines] == ["[1/4", "[2/4", "[3/4", "[4/4"]
