from itertools import product

import pytest

from alibi.cli import main
from alibi.emulator import BIAS_MODES, ORDERS
from alibi.identify import identify
from alibi.kernels import get_kernel
from alibi.synthetic import synthetic_tiles


@pytest.fixture(scope="module")
def probe():
    return synthetic_tiles("epilogue-probe-bias")


@pytest.mark.parametrize("order, bias", list(product(ORDERS, BIAS_MODES)))
def test_the_probe_tells_all_nine_epilogue_models_apart(probe, order, bias):
    found = identify(get_kernel(f"emulator:{order}+{bias}"), probe)
    assert [c.model for c in found if c.matches] == [f"{order}+{bias}"]


@pytest.mark.parametrize("order, bias", list(product(("w_then_a", "a_then_w"), BIAS_MODES)))
def test_the_probe_tells_the_intermediate_rounding_models_apart_too(probe, order, bias):
    name = f"{order}+{bias}+round_between"
    found = identify(get_kernel(f"emulator:{name}"), probe)
    assert len(found) == 15
    assert [c.model for c in found if c.matches] == [name]


def test_the_probe_preset_makes_scale_orders_disagree_often():
    tile = synthetic_tiles("epilogue-probe")[0]
    found = {c.model: c for c in identify(get_kernel("emulator:w_then_a"), [tile])}
    assert found["a_then_w+fma"].n_differing > 10 and found["a_then_w+fma"].max_ulp == 1


def test_identify_cli_names_the_declared_model_of_torch_cpu(capsys):
    assert main(["identify", "torch-cpu"]) == 0
    out = capsys.readouterr().out
    assert "w_then_a+add_before_cast     MATCH" in out
