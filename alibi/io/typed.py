"""Result dataclasses ⇄ JSON: the one serializer every result document of the toolkit goes through.

A result is a frozen dataclass whose fields are ints, floats, strings, booleans, string enums, `X | None` (or a
union such as `float | str`), tuples, dicts of plain JSON values (`dict[str, Any]`, `Mapping[str, int]`, …) and
other such dataclasses. Two functions convert, driven by the type hints alone:

- `to_plain(obj)` gives plain JSON values: an object per dataclass with its keys in field order, lists for
  tuples, an enum's string for the enum. A float must be finite: a result holding NaN or infinity is a bug in
  its producer and fails here, instead of writing a file no strict reader accepts.
- `from_plain(hint, value, where)` rebuilds the value and refuses, with an `InputError` naming the field path
  (`report.json.tiles[3].n_differing: expected an integer, got '3'`), anything that does not fit: a string
  where an int belongs, a bool passed as a number, an unknown enum string, a missing or unknown field. An int
  where a float belongs is kept as the int (JSON does not tell `1` from `1.0` apart from its spelling), so a
  document read and written again keeps its bytes.

`TypedResult` is the base of a top-level document: a dataclass with a `schema` field naming its version. It
gives `to_dict` / `to_json` and `from_dict` / `from_json` (parsed by the bounded reader `alibi.io.jsonio`);
`from_dict` refuses a document of another schema. Class constants say how the document is written (`JSON_INDENT`,
`JSON_SORT_KEYS`), which older schema versions it also reads (`READS`), what to do about a document it refuses
(`REMEDY`, appended to every error) and the file it is usually read from (`FILE`, named in errors).

A document whose layout is not its fields one to one says so in two hooks, each the inverse of the other,
which any dataclass (nested ones too) may define:

- `_layout_out(self, doc) -> doc`: the plain fields → the document as stored (a derived value written for
  readers, a list stored as an object keyed by name, a field left out when it is None);
- `_layout_in(cls, doc, where) -> doc`: the stored document → plain fields (the derived values checked and
  dropped, an older schema version upgraded).

Imports nothing from alibi but `alibi.errors` and `alibi.io.jsonio`: every folder above may use it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

from alibi.errors import InputError, one_line, shown
from alibi.io import jsonio

NoneType = type(None)
_SCALARS = frozenset({str, int, bool, NoneType})
_JSON = frozenset({dict, list, str, int, float, bool, NoneType})


def to_plain(obj: Any) -> Any:
    """Plain JSON values for a result (recursively): see the module docstring."""
    kind = type(obj)
    if kind in _SCALARS:
        return obj
    if kind is float:
        if not math.isfinite(obj):
            raise ValueError(f"non-finite float {obj!r} in a result: the producer must give a status instead")
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        doc = {name: to_plain(getattr(obj, name)) for name in _field_names(kind)}
        hook = getattr(obj, "_layout_out", None)
        return hook(doc) if hook is not None else doc
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, Mapping):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return [to_plain(v) for v in obj]
    if kind.__module__ == "numpy":  # a numpy scalar (np.bool_, np.float64, …) becomes the Python value
        return to_plain(obj.item())
    for plain in (bool, int, float, str):  # a subclass of a JSON type (bool before int: it is one)
        if isinstance(obj, plain):
            return to_plain(plain(obj))
    raise TypeError(f"cannot serialize {kind.__name__} in a result")


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def from_plain(hint: Any, value: Any, where: str) -> Any:
    """Rebuild a value of type `hint` from plain JSON `value`; InputError naming `where` on a mismatch."""
    return _reader(hint)(value, where)


def _fail(where: str, expected: str, value: Any) -> InputError:
    return InputError(f"{one_line(where)}: expected {expected}, got {shown(value, 60)}")


def _expected(hint: Any) -> str:
    """A type hint in words, for an error message."""
    words = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string", NoneType: "null"}
    if hint in words:
        return words[hint]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in hint)
    if dataclasses.is_dataclass(hint):
        return f"an object ({hint.__name__})"
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_expected(a) for a in typing.get_args(hint))
    if origin is tuple:
        return "a list"
    return "an object"


# A reader is built once per type hint: `(value, where) -> value as the hint`. The types it takes unchanged
# (`_unchanged`) are passed by the object readers without a call: reading a report of 420 units is a few hundred
# thousand values, and the HTML page's work budget counts every line run (tests/html/test_cli_report.py).
Reader = typing.Callable[[Any, str], Any]


@functools.cache
def _unchanged(hint: Any) -> frozenset[type]:
    """The JSON types a value of `hint` may have to be taken as it is (an int for a float: it keeps its spelling)."""
    if hint is Any:
        return _JSON
    if hint in (int, bool, str):
        return frozenset({hint})
    if hint is float:
        return frozenset({int})  # a float is checked for finiteness by its reader
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return frozenset().union(*(_unchanged(a) if a is not NoneType else {NoneType} for a in typing.get_args(hint)))
    if (origin in (dict, Mapping) or hint in (dict, Mapping)) and typing.get_args(hint)[1:] in ((), (Any,)):
        return frozenset({dict})
    return frozenset()


@functools.cache
def _reader(hint: Any) -> Reader:
    if hint is Any:
        return lambda value, where: value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return _union_reader(hint)
    if origin is tuple:
        return _tuple_reader(hint)
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        return _mapping_reader(hint)
    if dataclasses.is_dataclass(hint):
        return _dataclass_reader(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_reader(hint)
    if hint in (bool, int, str):
        expected = _expected(hint)

        def read_scalar(value: Any, where: str) -> Any:
            if type(value) is hint:  # `type(True) is bool`: a JSON true is not a count
                return value
            raise _fail(where, expected, value)
        return read_scalar
    if hint is float:
        def read_float(value: Any, where: str) -> Any:
            if type(value) is int or (type(value) is float and math.isfinite(value)):
                return value  # an int stays an int: written again it keeps its spelling
            raise _fail(where, "a finite number", value)
        return read_float
    raise TypeError(f"no JSON conversion for {hint!r}")  # a field type this reader does not know: a bug


def _union_reader(hint: Any) -> Reader:
    options = [a for a in typing.get_args(hint) if a is not NoneType]
    nullable = len(options) < len(typing.get_args(hint))
    readers = [_reader(a) for a in options]
    expected = _expected(hint)
    if nullable and len(readers) == 1:
        inner = readers[0]
        return lambda value, where: None if value is None else inner(value, where)

    def read_union(value: Any, where: str) -> Any:
        if value is None and nullable:
            return None
        for read in readers:  # the first that fits: `float | str` keeps 1.5 a number and "inf" a string
            try:
                return read(value, where)
            except InputError:
                continue
        raise _fail(where, expected, value)
    return read_union


def _tuple_reader(hint: Any) -> Reader:
    args = typing.get_args(hint)
    if len(args) == 2 and args[1] is Ellipsis:
        keep, item = _unchanged(args[0]), _reader(args[0])

        def read_list(value: Any, where: str) -> tuple:
            if type(value) is not list:
                raise _fail(where, "a list", value)
            return tuple([v if type(v) in keep else item(v, f"{where}[{i}]") for i, v in enumerate(value)])
        return read_list
    readers = [_reader(a) for a in args]

    def read_fixed(value: Any, where: str) -> tuple:
        if type(value) is not list or len(value) != len(readers):
            raise _fail(where, f"a list of {len(readers)} items", value)
        return tuple(read(v, f"{where}[{i}]") for i, (read, v) in enumerate(zip(readers, value)))
    return read_fixed


def _mapping_reader(hint: Any) -> Reader:
    args = typing.get_args(hint)
    item = None if args[1:] in ((), (Any,)) else _reader(args[1])

    def read_mapping(value: Any, where: str) -> dict:
        if type(value) is not dict:
            raise _fail(where, "an object", value)
        return value if item is None else {k: item(v, f"{where}.{k}") for k, v in value.items()}
    return read_mapping


def _enum_reader(hint: type[enum.Enum]) -> Reader:
    def read_enum(value: Any, where: str) -> enum.Enum:
        try:
            return hint(value)
        except ValueError:
            raise _fail(where, _expected(hint), value) from None
    return read_enum


def _dataclass_reader(cls: type) -> Reader:
    """Reads an object into `cls`: the schema checked (a `TypedResult`), the `_layout_in` hook applied, unknown
    and missing fields refused, each field read by its hint's reader (built on first use, so that a type may
    refer to itself)."""
    fields = dataclasses.fields(cls)
    names = frozenset(f.name for f in fields)
    required = frozenset(f.name for f in fields
                         if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    hook = getattr(cls, "_layout_in", None)
    check_schema = cls.check_schema if issubclass(cls, TypedResult) else None
    plan: list[tuple[str, frozenset[type], Reader]] = []

    def read_object(value: Any, where: str) -> Any:
        if type(value) is not dict:
            raise _fail(where, f"an object ({cls.__name__})", value)
        if check_schema is not None:  # a document inside a document names its own schema
            check_schema(value, where)
        if hook is not None:
            value = hook(dict(value), where)
        if not plan:
            hints = typing.get_type_hints(cls)
            plan.extend((f.name, _unchanged(hints[f.name]), _reader(hints[f.name])) for f in fields)
        keys = value.keys()
        if not keys <= names:
            unknown = ", ".join(one_line(str(k)) for k in sorted(keys - names))
            raise InputError(f"{one_line(where)}: unknown field(s) {unknown} of {cls.__name__}")
        if not required <= keys:
            missing = next(f.name for f in fields if f.name in required and f.name not in keys)
            raise InputError(f"{one_line(where)}: missing field {missing!r} of {cls.__name__}")
        # one line, so that tracing counts one line per field (the page's work budget)
        return cls(**{n: v if type(v := value[n]) in ok else rd(v, f"{where}.{n}") for n, ok, rd in plan if n in value})
    return read_object


class TypedResult:
    """Base of a top-level result document: a frozen dataclass with a `schema: str` field (see the module docstring).

    SCHEMA: the version this toolkit writes; READS: older versions `from_dict` also reads (its `_layout_in`
    upgrades them; the object keeps the schema it was read from); JSON_INDENT, JSON_SORT_KEYS: how `to_json`
    spells the document; REMEDY: what to do about a document that is refused (appended to the error); FILE: the
    document's usual file name, which errors name when the caller does not say where the text came from.
    """

    SCHEMA: ClassVar[str] = ""
    READS: ClassVar[tuple[str, ...]] = ()
    JSON_INDENT: ClassVar[int] = 1
    JSON_SORT_KEYS: ClassVar[bool] = False
    REMEDY: ClassVar[str] = "re-run the command that wrote it"
    FILE: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=self.JSON_INDENT, sort_keys=self.JSON_SORT_KEYS,
                          allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, doc: Any, where: str = "") -> typing.Self:
        """The document as this type; InputError naming `where`, the field and the remedy for anything else."""
        where = where or cls.FILE or cls.__name__
        try:
            return from_plain(cls, doc, where)
        except InputError as exc:
            raise InputError(f"{exc}; {cls.REMEDY}") from None

    @classmethod
    def check_schema(cls, doc: Any, where: str) -> None:
        """InputError unless `doc` is an object whose `schema` is one this type reads."""
        schemas = (cls.SCHEMA, *cls.READS)
        found = doc.get("schema") if isinstance(doc, dict) else None
        if found not in schemas:
            raise InputError(f"{one_line(where)}: schema is {shown(found, 60)}, expected "
                             f"{' or '.join(map(repr, schemas))}")

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "") -> typing.Self:
        where = where or cls.FILE or cls.__name__
        return cls.from_dict(jsonio.loads(text, where), where)


__all__ = ["TypedResult", "from_plain", "to_plain"]
