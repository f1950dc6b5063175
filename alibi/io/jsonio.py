"""Reading JSON that came from outside: one InputError for every way it can be unusable.

`json.loads` raises `JSONDecodeError` for bad syntax, but also `RecursionError` for deeply nested
input (`[[[[…]]]]` 100,000 levels deep is a 200 kB file), `UnicodeDecodeError` for bytes that are
not UTF-8, and returns numbers such as `1e999` as `inf`. Every consumer in alibi walks the parsed
value (digest fields, flattening for the identity contract, canonical re-serialization), and a
walk of a deep value overflows the stack again. So external JSON is parsed here, once, and a
value nested deeper than `MAX_DEPTH` is refused with the reason, before any consumer sees it.

`MAX_DEPTH` (64) is far above anything alibi writes: a manifest nests about 8 levels, a conform
report about 7, a run record about 6. The depth of parsed text is measured on the text, by regular
expressions and itertools (no Python code per value: a 3 MB report holds a million values).
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

from alibi.errors import InputError, one_line

MAX_DEPTH = 64


def depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0, `[1]` is 1), computed without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            deepest = max(deepest, level)
            continue
        deepest = max(deepest, level + 1)
        stack.extend((child, level + 1) for child in children)
    return deepest


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def text_depth(text: str) -> int:
    """`depth` of the value of valid JSON text, from its brackets outside strings."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)


def _constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def loads(data: str | bytes, where: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON text or UTF-8 bytes; InputError naming `where` if it is not plain, bounded JSON.

    Refused: bytes that are not UTF-8, invalid syntax, NaN/Infinity literals (not JSON), and any
    value nested deeper than `max_depth`.
    """
    try:
        text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
        value = json.loads(text, parse_constant=_constant)
    except UnicodeDecodeError:
        raise InputError(f"{one_line(where)}: not UTF-8 text, so not JSON; restore the file") from None
    except RecursionError:
        raise InputError(f"{one_line(where)}: JSON nested too deeply to read (more than {max_depth} levels); "
                         "this is not a file alibi wrote") from None
    except ValueError as exc:  # JSONDecodeError is a ValueError, as is a NaN/Infinity literal
        raise InputError(f"{one_line(where)}: not valid JSON ({one_line(str(exc))}); restore the file") from None
    if text_depth(text) > max_depth:
        raise InputError(f"{one_line(where)}: JSON nested more than {max_depth} levels deep; "
                         "this is not a file alibi wrote")
    return value


def read(path, where: str | None = None, *, max_depth: int = MAX_DEPTH) -> Any:
    """`loads` of a file's bytes; an unreadable file is an InputError too (naming the OS reason)."""
    label = str(path) if where is None else where
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise InputError(f"{one_line(label)}: cannot read it ({exc.strerror or exc.__class__.__name__})") from None
    return loads(data, label, max_depth=max_depth)


__all__ = ["MAX_DEPTH", "depth", "loads", "read", "text_depth"]
