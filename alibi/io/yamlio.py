"""Reading YAML that came from outside (experiment files, analysis parameters): safe, bounded, one line.

Every YAML file alibi reads goes through `load`:

- `yaml.SafeLoader` semantics (plain data only), **without aliases**. An alias (`*name`) reuses an
  anchored node; nine nested levels of nine aliases each (the "billion laughs" document, under
  1 kB) expand to 9⁹ ≈ 387 M scalars as soon as anything walks or prints the value — an error
  message quoting it is enough. No alibi file needs an alias, so the composer refuses the first one,
  before anything is expanded (merge keys `<<: *base` are aliases too).
- Nesting deeper than `alibi.io.jsonio.MAX_DEPTH` is refused (PyYAML's composer is recursive).
- PyYAML's messages span several lines (problem, context, a caret under the source line); they
  are folded into one line naming the file, line and column.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from alibi.errors import InputError, one_line
from alibi.io.jsonio import MAX_DEPTH, depth


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader whose composer refuses every alias event instead of resolving it."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"found the alias *{event.anchor}; YAML aliases are refused (write the value out)",
                event.start_mark)
        return super().compose_node(parent, index)


def _message(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    text = f"{where}{problem}" + (f" ({context})" if context else "")
    return one_line(" ".join(text.split()))[:300]


def loads(data: str | bytes, where: str) -> Any:
    """Parse one YAML document; InputError naming `where` on any problem (see the module docstring)."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
        value = yaml.load(text, Loader=_NoAliasLoader)
    except UnicodeDecodeError:
        raise InputError(f"{one_line(where)}: not UTF-8 text; save the file as UTF-8") from None
    except RecursionError:
        raise InputError(f"{one_line(where)}: YAML nested too deeply (more than {MAX_DEPTH} levels)") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{one_line(where)}: not valid YAML ({_message(exc)})") from None
    if depth(value) > MAX_DEPTH:
        raise InputError(f"{one_line(where)}: YAML nested more than {MAX_DEPTH} levels deep")
    return value


def load(path: str | Path, where: str | None = None) -> Any:
    """`loads` of a file; an unreadable file is an InputError naming it and the OS reason."""
    label = str(path) if where is None else where
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"{one_line(label)}: cannot read it ({exc.strerror or exc.__class__.__name__})") from None
    return loads(data, label)


__all__ = ["load", "loads"]
