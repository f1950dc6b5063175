"""alibi.html.figures: PNGs of the declared size, names drawn as text, ulp bins that cover every distance."""

from __future__ import annotations

import io
import struct

import matplotlib.image

from alibi.html.figures import (
    UlpCounts,
    common_prefix,
    differing_chart,
    headroom_chart,
    max_ulp_chart,
    tick_label,
    ulp_bins,
    ulp_histogram_chart,
)


def _png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", png[16:24])  # IHDR width, height


def test_every_chart_is_a_png_of_the_size_it_declares():
    names = [f"model.layers.{i}.mlp.up_proj" for i in range(50)]
    charts = [headroom_chart(names, [5.0 + i % 3 for i in range(50)]),
              differing_chart(names, {"real": [i % 4 for i in range(50)], "pow2": [0] * 50}),
              ulp_histogram_chart([UlpCounts("real", {1: 30, 2: 1}, {0: 2, 9000: 1}), UlpCounts("pow2", {}, {})]),
              max_ulp_chart({"real": {1: 12}, "pow2": {}})]
    for chart in charts:
        assert _png_size(chart.png) == (chart.width, chart.height)
        pixels = matplotlib.image.imread(io.BytesIO(chart.png))
        assert pixels.shape[:2] == (chart.height, chart.width) and float(pixels[..., :3].std()) > 0.01


def test_a_tile_name_with_dollar_signs_and_tex_is_drawn_not_parsed():
    # With mathtext on, an unbalanced "$\frac{" raises ValueError while drawing.
    chart = headroom_chart(["a$\\frac{b", "$x$"], [3.0, None])
    assert chart.width > 0


def test_headroom_below_zero_is_drawn_in_the_fired_colour():
    fired = headroom_chart(["x", "y"], [-0.5, 4.0])
    ok = headroom_chart(["x", "y"], [0.5, 4.0])
    red = (0xD6 / 255, 0x27 / 255, 0x28 / 255)

    def has_red(png: bytes) -> bool:
        px = matplotlib.image.imread(io.BytesIO(png))[..., :3]
        return bool((abs(px - red).max(axis=-1) < 0.02).any())

    assert has_red(fired.png) and not has_red(ok.png)


def test_tick_labels_are_one_printable_line_keeping_the_end_of_long_names():
    assert tick_label("a\nb\x00c") == "a⏎b⏎c"
    long = "model.layers.29.self_attn.very_long_projection_name"
    label = tick_label(long)
    assert len(label) == 34 and label.startswith("…") and long.endswith(label[1:])


def test_the_common_prefix_ends_at_a_dot_and_leaves_every_name_nonempty():
    assert common_prefix(["model.layers.0.q", "model.layers.1.k"]) == "model.layers."
    assert common_prefix(["model.a", "model.a.b"]) == "model."  # not "model.a": it does not end at a dot
    assert common_prefix(["model.", "model.x"]) == ""  # stripping "model." would leave an empty name
    assert common_prefix(["solo"]) == ""


def test_ulp_bins_cover_every_distance_exactly_once():
    distances = {0: 3, 1: 100, 2: 4, 5: 1, 16: 2, 15000: 1}
    bins = ulp_bins(distances)
    assert [b[0] for b in bins][:4] == ["0", "1", "2", "3"]
    for d in distances:
        assert sum(lo <= d <= hi for _, lo, hi in bins) == 1
    assert bins[-1][1] <= 15000 <= bins[-1][2]
    assert ulp_bins({1: 5})[0] == ("1", 1, 1)  # no empty 0 bin when no element sits at distance 0
