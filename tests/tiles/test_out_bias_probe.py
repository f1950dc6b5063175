"""The output-dtype bias probe tells all nine epilogue models apart, with every output normal."""

from __future__ import annotations

from itertools import product

import pytest
import torch

from alibi.controls.identify import identify
from alibi.exact.emulator import BIAS_MODES, ORDERS, EpilogueModel
from alibi.exact.numerics import is_subnormal
from alibi.kernels.cpu import EmulatorKernel
from alibi.tiles.out_bias_probe import as_e4m3, out_bias_probe_tiles

MODELS = [EpilogueModel(o, b) for o, b in product(ORDERS, BIAS_MODES)]


@pytest.fixture(scope="module", params=[torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def probe(request):
    return request.param, out_bias_probe_tiles(request.param, seed=0)


def test_the_bias_is_in_the_output_dtype_and_every_output_is_a_finite_normal(probe):
    out_dtype, tiles = probe
    assert tiles[0].bias is None and tiles[1].bias.dtype == out_dtype
    assert all(t.out_dtype == out_dtype for t in tiles)
    for model in MODELS:
        for tile in tiles:
            out = EmulatorKernel(model).run(tile).out
            assert bool(torch.isfinite(out).all()) and int(is_subnormal(out).sum()) == 0


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_identify_names_exactly_the_model_that_produced_the_bits(probe, model):
    _, tiles = probe
    found = identify(EmulatorKernel(model), tiles)
    assert [c.model for c in found if c.matches] == [model.name]


@pytest.mark.parametrize("order", ORDERS)
def test_the_order_probe_alone_tells_the_three_scale_orders_apart(probe, order):
    _, tiles = probe
    found = identify(EmulatorKernel(EpilogueModel(order)), tiles[:1])
    assert [c.model for c in found if c.matches] == [f"{order}+fma"]


def test_small_integer_probes_convert_to_e4m3_exactly():
    tiles = out_bias_probe_tiles(torch.bfloat16, seed=0, M=16, max_abs=16)
    for tile in tiles:
        fp8 = as_e4m3(tile)
        assert torch.equal(fp8.a_q.to(torch.float32), tile.a_q.to(torch.float32))
        assert torch.equal(fp8.w_q.to(torch.float32), tile.w_q.to(torch.float32))
    with pytest.raises(ValueError, match="max_abs=16"):
        as_e4m3(out_bias_probe_tiles(torch.bfloat16, seed=0, M=16)[0])
