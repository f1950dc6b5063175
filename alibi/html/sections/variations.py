"""The execution-variations section: one row per variation of `alibi variations`, with the first
diverging module of each that fails. It reads `variations.json` through `VariationsReport.from_json`."""

from __future__ import annotations

from alibi.html.render import RenderedSection, render_fragment
from alibi.html.sections import Section

VARIATION_FILES = ("variations.json",)


def render_text(text: str, where: str) -> RenderedSection:
    # deferred: keeps torch out of start-up
    from alibi.tokens.variations import VariationsReport

    r = VariationsReport.from_json(text, where)
    title = f"Execution variations: {r.kernel or 'dense model'} on {r.device}"
    return RenderedSection("variations", title, render_fragment("variations.html.j2", r=r, title=title))


SECTION = Section(key="variations", files=VARIATION_FILES, kinds=("replay",), render=render_text)

__all__ = ["SECTION", "VARIATION_FILES", "render_text"]
