"""The conformance-matrix section: every pair of a kernel set (`alibi matrix`'s `matrix.json`).

It reads the matrix through `Matrix.from_json` and draws the grid with the matrix's own `heatmap`, one square
per pair coloured by its status (bitwise, explained by the declared models, unexplained, not judged) and
labelled with its number of differing output elements.
"""

from __future__ import annotations

from alibi.conform.matrix import STATUSES, Matrix, heatmap
from alibi.html.figures import Chart
from alibi.html.render import FigureView, RenderedSection, render_fragment
from alibi.html.sections import Section

MATRIX_JSON = ("matrix.json",)


def _png_size(png: bytes) -> tuple[int, int]:
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")  # IHDR width, height


def render_text(text: str, where: str) -> RenderedSection:
    m = Matrix.from_json(text, where)
    png = heatmap(m)
    w, h = _png_size(png)
    caption = ("One square per pair of kernels (symmetric). Green: bitwise equal on every tile and regime; blue: "
               "the outputs differ, but exactly where the two declared epilogue models predict; red: a difference "
               "the models do not predict, or an arm that departs from its declared model; grey: no exact "
               "prediction exists (fp8 accumulation order, or an arm without a declared model). The number is the "
               "count of differing output elements over all tiles and regimes.")
    figure = FigureView.of("Pairs", caption, Chart(png, w, h, f"Conformance matrix of {len(m.kernels)} kernels"))
    counts = {s: sum(1 for c in m.cells if c.status == s) for s in STATUSES}
    fired = [k.name for k in m.kernels if k.fired]
    title = f"Conformance matrix: {len(m.kernels)} kernels, {len(m.cells)} pairs"
    body = render_fragment("matrix.html.j2", m=m, title=title, figures=[figure], counts=counts, fired_kernels=fired)
    return RenderedSection("matrix", title, body)


SECTION = Section(key="matrix", files=MATRIX_JSON, kinds=("matrix",), render=render_text)

__all__ = ["MATRIX_JSON", "SECTION", "render_text"]
