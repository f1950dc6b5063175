"""`alibi analyze depth` prints each input's outcome in words: no Python `None` when no model was selected."""

from __future__ import annotations

from alibi.sweep.analysis import progress_line
from alibi.sweep.depth_fits import DepthData, fit_depth

KS = (512, 1024, 2048, 4096, 8192, 16384, 32768)


def test_an_input_with_no_model_selected_says_so_without_python_none():
    n = 2**19
    data = DepthData(tuple(s for s in range(3) for _ in KS), KS * 3, (0.0,) * 21, (n,) * 21, (0,) * 21)
    fits = fit_depth(data, source="t", label="INT8 x vs y")
    assert fits.selected is None
    line = progress_line("INT8 x vs y", fits)
    assert line == "INT8 x vs y: all-zero, no model selected" and "None" not in line
