"""Frozen result dataclasses ⇄ JSON, with the types checked on the way back in.

The sweep and fit results are nested frozen dataclasses of ints, floats, strings, booleans,
`X | None`, tuples and other such dataclasses. `to_plain` turns one into plain JSON values (field
order kept, tuples as lists); `from_plain` rebuilds it from the class's type hints and refuses,
with an `InputError` naming the field path, anything that does not fit (a string where an int
belongs, a bool passed as an int, a missing or unknown field). JSON is written with
`allow_nan=False`: a result holding NaN or infinity is a bug in the producer and fails loudly
instead of writing a file no strict reader accepts.

`TypedResult` adds `to_json` / `from_json` to a top-level result whose `schema` field names its
version; `from_json` refuses a document of another schema.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from typing import Any, TypeVar

import numpy as np

from alibi.errors import InputError

T = TypeVar("T")


def to_plain(obj: Any) -> Any:
    """Plain JSON values for a result dataclass (recursively); floats must be finite."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (tuple, list)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, np.generic):  # numpy scalars (np.bool_, np.float64, ...) become Python values
        obj = obj.item()
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise ValueError(f"non-finite float {obj!r} in a result: the producer must give a status instead")
        return obj
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    raise TypeError(f"cannot serialize {type(obj).__name__} in a result")


def _fail(where: str, expected: str, value: Any) -> InputError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return InputError(f"{where}: expected {expected}, got {shown}")


def from_plain(cls: type[T], value: Any, where: str) -> T:
    """Rebuild `cls` (a type hint) from plain JSON `value`; InputError naming `where` on a mismatch."""
    origin = typing.get_origin(cls)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(cls)
        if value is None and type(None) in options:
            return None  # type: ignore[return-value]
        inner = [o for o in options if o is not type(None)]
        if len(inner) == 1:
            return from_plain(inner[0], value, where)
        raise TypeError(f"unsupported union {cls}")
    if origin is tuple:
        args = typing.get_args(cls)
        if not isinstance(value, list):
            raise _fail(where, "a list", value)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_plain(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))  # type: ignore[return-value]
        if len(value) != len(args):
            raise _fail(where, f"a list of {len(args)} items", value)
        return tuple(from_plain(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))  # type: ignore[return-value]
    if dataclasses.is_dataclass(cls):
        if not isinstance(value, dict):
            raise _fail(where, f"an object ({cls.__name__})", value)
        hints = typing.get_type_hints(cls)
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise InputError(f"{where}: unknown field(s) {', '.join(unknown)} for {cls.__name__}")
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name not in value:
                if f.default is not dataclasses.MISSING:
                    continue
                raise InputError(f"{where}: missing field {f.name!r} of {cls.__name__}")
            kwargs[f.name] = from_plain(hints[f.name], value[f.name], f"{where}.{f.name}")
        return cls(**kwargs)
    if cls is bool:
        if not isinstance(value, bool):
            raise _fail(where, "true or false", value)
        return value  # type: ignore[return-value]
    if cls is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(where, "an integer", value)
        return value  # type: ignore[return-value]
    if cls is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _fail(where, "a finite number", value)
        return float(value)  # type: ignore[return-value]
    if cls is str:
        if not isinstance(value, str):
            raise _fail(where, "a string", value)
        return value  # type: ignore[return-value]
    raise TypeError(f"unsupported type {cls!r} at {where}")


class TypedResult:
    """Mixin for a top-level frozen result dataclass with a `schema: str` field and a `SCHEMA` constant."""

    SCHEMA: typing.ClassVar[str] = ""

    def to_json(self) -> str:
        return json.dumps(to_plain(self), indent=1, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> typing.Self:
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, RecursionError, UnicodeError) as exc:
            raise InputError(f"{where}: not valid JSON ({str(exc).splitlines()[0]}); "
                             "the file is empty, truncated or of another kind") from None
        schema = cls.SCHEMA  # type: ignore[attr-defined]
        if not isinstance(doc, dict) or doc.get("schema") != schema:
            found = doc.get("schema") if isinstance(doc, dict) else None
            raise InputError(f"{where}: schema is {found!r}, expected {schema!r}")
        return from_plain(cls, doc, where)
