"""Progress on long work: a bar on a terminal, plain lines elsewhere, nothing under `--quiet`.

Long work (conformance over many units, captures, replays, sweeps, mutant matrices) reports
progress through one callback protocol, `(done, total, label)`: after each unit, how many of how
many are done and a short label for the unit just finished. `Progress` implements it three ways:

- **bar** — when the stream is a terminal: a tqdm bar with the count, the rate (units/s, or
  s/unit when units are slow), elapsed and remaining time, and the last label;
- **lines** — when the stream is not a terminal (a CI log, a pipe, a file): one plain line per
  unit, `[done/total] label (elapsed s)`, which a log keeps readable where a redrawn bar would
  leave control characters;
- **off** — under `--quiet`: nothing at all.

Progress only ever goes to the stream it was given (stderr by default), never to stdout or into a
result file: machine-readable output stays byte-identical whatever the mode. `ALIBI_PROGRESS`
(`bar`, `lines` or `off`) overrides the choice, e.g. `ALIBI_PROGRESS=lines` for a terminal
recorder. The bar closes itself when `done` reaches `total`, so a caller that only passes the
callback on does not need to manage it; `close()` (or a `with` block) ends it early.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Self, TextIO

from alibi.errors import InputError

ProgressCallback = Callable[[int, int, str], None]
MODES = ("bar", "lines", "off")
ENV_VAR = "ALIBI_PROGRESS"
# A label longer than this is cut in the bar (a terminal line holds the count, rate and times too).
BAR_LABEL_CHARS = 48


def choose_mode(stream: TextIO, quiet: bool = False) -> str:
    """`off` when quiet; else `ALIBI_PROGRESS` if set; else `bar` on a terminal, `lines` otherwise."""
    if quiet:
        return "off"
    forced = os.environ.get(ENV_VAR, "").strip().lower()
    if forced:
        if forced not in MODES:
            raise InputError(f"{ENV_VAR}={forced!r} is not a progress mode; use one of {', '.join(MODES)} or unset it")
        return forced
    isatty = getattr(stream, "isatty", None)
    interactive = bool(isatty and isatty()) and os.environ.get("TERM", "") != "dumb" and _has_width(stream)
    return "bar" if interactive else "lines"


def _has_width(stream: TextIO) -> bool:
    """A terminal that reports zero columns (a pty nobody sized) would show an empty bar: use lines there."""
    try:
        return os.get_terminal_size(stream.fileno()).columns > 0
    except (AttributeError, OSError, ValueError):  # not a real file descriptor (a test double): trust isatty
        return True


def _one_line(label: str) -> str:
    """Labels can hold untrusted text (tile names): keep each progress report on one line."""
    return " ".join(label.split())


class Progress:
    """A `(done, total, label)` progress callback (see the module docstring for the three modes).

    what: a short description shown before the bar (e.g. "conform"); unit: the name of one unit of
    work, used in the rate; stream: where progress goes (default stderr); quiet: show nothing;
    mode: force `bar`, `lines` or `off` instead of choosing from the stream and `ALIBI_PROGRESS`.
    """

    def __init__(self, what: str = "", *, unit: str = "unit", stream: TextIO | None = None, quiet: bool = False,
                 mode: str | None = None) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.mode = mode if mode is not None else choose_mode(self.stream, quiet)
        if self.mode not in MODES:
            raise ValueError(f"progress mode {self.mode!r}; expected one of {MODES}")
        self.what, self.unit = what, unit
        self._start = time.monotonic()
        self._bar = None

    def __call__(self, done: int, total: int, label: str = "") -> None:
        if self.mode == "off":
            return
        label = _one_line(label)
        if self.mode == "lines":
            print(f"[{done}/{total}] {label} ({time.monotonic() - self._start:.1f} s)", file=self.stream, flush=True)
            return
        bar = self._bar_for(total)
        if label:
            bar.set_postfix_str(label[:BAR_LABEL_CHARS], refresh=False)
        bar.update(max(0, done - bar.n))
        if done >= total:
            self.close()

    def note(self, message: str) -> None:
        """A line that is not a count (a phase starting, a warning): printed above a live bar."""
        if self.mode == "off":
            return
        if self._bar is not None:
            self._bar.write(message, file=self.stream)
        else:
            print(message, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _bar_for(self, total: int):
        if self._bar is None:
            # deferred: keeps tqdm out of start-up
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=self.what or None, unit=self.unit, file=self.stream,
                             dynamic_ncols=True, leave=True, smoothing=0.3, mininterval=0.2)
        elif self._bar.total != total:
            self._bar.total = total
        return self._bar


def progress(what: str = "", *, quiet: bool = False, unit: str = "unit", stream: TextIO | None = None) -> Progress:
    """The progress callback for a command: `Progress(what, quiet=args.quiet)` in one call."""
    return Progress(what, unit=unit, stream=stream, quiet=quiet)


__all__ = ["ENV_VAR", "MODES", "Progress", "ProgressCallback", "choose_mode", "progress"]
