"""A figure's legend lies inside the figure: on a narrow figure (a report of a few tiles) the legend of
`differing_chart` was cut at the right edge ("pow2 scales: 0 elements in 0 tile(s"), issue 25."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from alibi.html import figures


def _right_edge_is_blank(chart: figures.Chart, columns: int = 3) -> bool:
    img = Image.open(io.BytesIO(chart.png)).convert("L")
    w, h = img.size
    band = img.crop((w - columns, 0, w, h // 3))  # the title and legend band, at the right edge
    return band.getextrema()[0] >= 250


@pytest.mark.parametrize("n_tiles", [1, 2, 4])
def test_the_legend_of_a_narrow_differing_chart_lies_inside_the_figure(n_tiles):
    names = [f"model.layers.{i}.self_attn.q_proj" for i in range(n_tiles)]
    chart = figures.differing_chart(names, {"real": [123_456] * n_tiles, "pow2": [0] * n_tiles})
    assert _right_edge_is_blank(chart)


def test_the_legend_of_a_narrow_headroom_chart_lies_inside_the_figure():
    chart = figures.headroom_chart(["a.very.long.tile.name.of.a.layer", "b"], [-1.25, None])
    assert _right_edge_is_blank(chart)
