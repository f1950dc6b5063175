"""The positive-controls section: every check against every mutant of one base kernel.

It reads `detection.json` (`alibi mutants`) through `DetectionMatrix.from_json` and draws the
detection heatmap with the matrix's own `heatmap` (the figure `alibi mutants` writes beside it),
so the page and the mutant folder show the same picture.
"""

from __future__ import annotations

from alibi.html.figures import Chart
from alibi.html.render import FigureView, RenderedSection, render_fragment
from alibi.html.sections import Section

DETECTION_FILES = ("detection.json",)


def _png_size(png: bytes) -> tuple[int, int]:
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")  # IHDR width, height


def render_text(text: str, where: str) -> RenderedSection:
    # deferred: keeps torch out of start-up
    from alibi.controls.mutant_matrix import (  # imported only when a folder holds a matrix
        DetectionMatrix,
        heatmap,
    )

    m = DetectionMatrix.from_json(text, where)
    png, _svg = heatmap(m)
    w, h = _png_size(png)
    caption = ("One row per fault × severity × scale regime (arm a the base, arm b its mutant), one column per "
               "check, plus whether the mutant changed any output bit at all (observable). Red: the check fired on "
               "some tile; grey: applicable and silent; white: inapplicable on every tile. A silent check on an "
               "unobservable row is not a miss: there was nothing to see.")
    figure = FigureView.of("Detection matrix", caption, Chart(png, w, h, f"Detection heatmap of the mutants of "
                                                                        f"{m.base.get('name')}"))
    title = f"Positive controls: mutants of {m.base.get('name')}"
    body = render_fragment("mutants.html.j2", m=m, title=title, figures=[figure])
    return RenderedSection("mutants", title, body)


SECTION = Section(key="mutants", files=DETECTION_FILES, kinds=("mutants",), render=render_text)

__all__ = ["DETECTION_FILES", "SECTION", "render_text"]
