"""The ways a request can fail other than a check firing, each with its own exit code.

A check that *fires* is not an error: it is a result (exit 1). These exceptions are for input the
toolkit refuses (exit 2), for kernels that cannot run on this machine (exit 3), and for a kernel that
raised while it ran or a shard of a sharded run that failed otherwise (exit 4). Messages name the
offending input and say what to do; the CLI prints them on one line. CI can tell the outcomes apart:
0 pass, 1 a check fired, 2 bad input, 3 kernel unavailable, 4 a kernel raised (or a worker died).
"""

import errno
import reprlib


class InputError(ValueError):
    """Bad input or usage: a malformed tile, an unknown name, an unwritable path (exit code 2)."""

    exit_code = 2


class KernelUnavailable(RuntimeError):
    """A requested kernel cannot run here: no CUDA, no nvcc, a missing package (exit code 3)."""

    exit_code = 3


class WorkerFailed(RuntimeError):
    """A shard of a run failed for a reason that is neither bad input (exit 2) nor an unavailable kernel
    (exit 3): a kernel raised inside a worker, or a worker process died (exit code 4; `alibi.conform.shard`)."""

    exit_code = 4


class KernelRaised(WorkerFailed):
    """A kernel under test raised while it ran (a plugin's bug, a device fault): not a finding about its bits
    but a failure to produce them (exit code 4, like a failed worker)."""


class DiskFull(InputError):
    """The file system ran out of space (or quota) while alibi wrote an output (exit code 2, like bad input:
    the fix is the user's, free space or another output location). Raised by `alibi.io.atomic` once the
    partial output is removed, naming the path it was writing."""


# How a full disk shows through the libraries that write for alibi: an OSError's errno, or only the text of
# a wrapped one (safetensors: "No space left on device (os error 28)"; numpy, tokenizers …).
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_FULL_TEXTS = ("no space left on device", "disk quota exceeded", "os error 28)", "os error 122)")


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it was raised from or during, says the file system is full (ENOSPC,
    EDQUOT), by its errno or, for a library's wrapped error, by its message."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen and len(seen) < 16:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
            return True
        text = str(exc)[:2000].lower()
        if any(t in text for t in _FULL_TEXTS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def one_line(text: str) -> str:
    """`text` with every character that could break a one-line message escaped.

    Control characters (C0, DEL, C1, and the Unicode line and paragraph separators) become
    `\\n`, `\\t`, `\\x1b`, `\\u2028`…; a lone surrogate — how Python carries a byte of a file name
    that is not UTF-8 — becomes `\\xNN`, the byte itself, so the name can be found and printing
    it cannot fail. Everything else (accents, CJK, symbols) is kept as is.
    """
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F or 0x80 <= code < 0xA0:
            out.append(f"\\x{code:02x}")
        elif code in (0x2028, 0x2029):
            out.append(f"\\u{code:04x}")
        elif 0xDC80 <= code <= 0xDCFF:  # surrogateescape'd byte of a non-UTF-8 name
            out.append(f"\\x{code - 0xDC00:02x}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def shown(value: object, limit: int = 80) -> str:
    """`repr(value)` on one line and at most `limit` characters, for quoting input in a message.

    A value from the input can be arbitrarily long (or expand, like a YAML alias bomb); an error
    message quotes only its beginning.
    """
    text = one_line(_BOUNDED.repr(value))  # reprlib: never renders more than a few items of a container
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _bounded_repr() -> reprlib.Repr:
    r = reprlib.Repr()
    r.maxlevel, r.maxdict, r.maxlist, r.maxtuple, r.maxset = 3, 6, 6, 6, 6
    r.maxstring = r.maxother = r.maxlong = 120
    return r


_BOUNDED = _bounded_repr()
