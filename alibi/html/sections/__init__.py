"""Section modules: one per result type, each turning that result's JSON into part of a page.

A section module exposes `SECTION`, a `Section` saying which JSON files in a result folder it
reads and how to render one. `alibi report html DIR` renders every section whose file DIR holds,
in the order of `SECTION_MODULES`; `alibi conform` and `alibi run` render the conform section
from the report they just computed.

To add a result type (a replay's `flips.json`, a sweep's `fits.json`, a mutant matrix's
`detection.json`): write `alibi/html/sections/<name>.py` with

    SECTION = Section(key="flips", files=("flips.json",), kinds=("flip-analysis",), render=render_flips)

where `render_flips(text, where)` reads the text through the result's own `from_json` (never by
dict keys), draws its figures with `alibi.html.figures` and returns a `RenderedSection` from its
own template under `alibi/html/templates/`; then list the module below. Nothing else changes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from alibi.html.render import RenderedSection

# Section modules, in page order.
SECTION_MODULES = [
    "alibi.html.sections.conform",
    "alibi.html.sections.flips",
    "alibi.html.sections.depth",
    "alibi.html.sections.mutants",
    "alibi.html.sections.variations",
    "alibi.html.sections.matrix",
]


@dataclass(frozen=True)
class Section:
    """How one result type appears in a report.

    key: a short identifier (the page anchor); files: where the result's JSON lies in a result
    folder, relative paths tried in order (the first that exists is used); kinds: the manifest kinds
    of the commands that write it (`alibi report html` reads the file only once a manifest of one of
    these kinds vouches for it, `alibi.governance.verified`); render: (JSON text,
    a name for the file in error messages) → the rendered section, raising InputError for a
    document it cannot read.
    """

    key: str
    files: tuple[str, ...]
    kinds: tuple[str, ...]
    render: Callable[[str, str], RenderedSection]

    def find(self, folder: Path) -> Path | None:
        for rel in self.files:
            if (folder / rel).is_file():
                return folder / rel
        return None


def sections() -> list[Section]:
    return [importlib.import_module(name).SECTION for name in SECTION_MODULES]


def section(key: str) -> Section:
    for s in sections():
        if s.key == key:
            return s
    raise KeyError(key)


__all__ = ["SECTION_MODULES", "Section", "section", "sections"]
