from itertools import product

import pytest

from alibi.cli import main
from alibi.controls.identify import identify
from alibi.exact.emulator import BIAS_MODES, ORDERS
from alibi.kernels.registry import get_kernel
from alibi.tiles.synthetic import synthetic_tiles


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


class _OutputDtypeBiasOnly:
    """An emulator kernel that, like vLLM's, takes its bias only in the output dtype (a bias of another dtype
    is refused, as `alibi.kernels.vllm.bias_in_output_dtype` refuses one that does not convert exactly)."""

    @staticmethod
    def make(model: str):
        from alibi.exact.emulator import EpilogueModel
        from alibi.kernels.cpu import EmulatorKernel

        class OutputDtypeBias(EmulatorKernel):
            bias_in_output_dtype = True

            def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=None):
                if bias is not None and bias.dtype != out_dtype:
                    raise ValueError(f"bias must be {out_dtype}, got {bias.dtype}")
                return super().scaled_mm(a_q, s_a, w_q, s_w, bias, out_dtype)

        order, bias = model.split("+")
        return OutputDtypeBias(EpilogueModel(order, bias))


@pytest.mark.parametrize("model", ["w_then_a+fma", "a_then_w+add_after_cast", "product_first+add_before_cast"])
def test_identify_probes_a_kernel_taking_its_bias_in_the_output_dtype_with_tiles_it_accepts_and_names_its_model(model):
    from alibi.controls.identify import DEFAULT_PRESET, probe_tiles

    kernel = _OutputDtypeBiasOnly.make(model)
    with pytest.raises(Exception, match="bias must be"):
        kernel.run(synthetic_tiles(DEFAULT_PRESET)[0])  # the default preset's fp32 bias is refused
    tiles, which = probe_tiles(kernel)
    assert "output-dtype bias probe" in which and all(t.bias is None or t.bias.dtype == t.out_dtype for t in tiles)
    assert [c.model for c in identify(kernel, tiles) if c.matches] == [model]


def test_identify_keeps_the_fp32_bias_preset_for_a_kernel_that_takes_any_bias():
    from alibi.controls.identify import DEFAULT_PRESET, probe_tiles

    tiles, which = probe_tiles(get_kernel("torch-cpu"))
    assert which.endswith(DEFAULT_PRESET) and tiles[0].bias.dtype.is_floating_point and tiles[0].bias.dtype.itemsize == 4


def _register_liar(name: str, declared: str, actual: str) -> None:
    from alibi.exact.emulator import EpilogueModel
    from alibi.kernels.cpu import EmulatorKernel
    from alibi.kernels.registry import register

    def make():
        kernel = EmulatorKernel(EpilogueModel.parse(actual))  # computes `actual` ...
        kernel.name, kernel.epilogue = name, EpilogueModel.parse(declared)  # ... and declares `declared`
        kernel.actual = EpilogueModel.parse(actual)
        kernel.scaled_mm = lambda a_q, s_a, w_q, s_w, bias=None, out_dtype=None: EmulatorKernel(
            kernel.actual).scaled_mm(a_q, s_a, w_q, s_w, bias, out_dtype)
        return kernel
    register(name, make)


def test_identify_exits_1_naming_the_match_when_the_declared_model_is_not_among_the_matches(capsys):
    _register_liar("liar-bias-mode", "a_then_w+add_before_cast", "a_then_w+add_after_cast")
    assert main(["identify", "liar-bias-mode"]) == 1
    captured = capsys.readouterr()
    assert "a_then_w+add_after_cast      MATCH" in captured.out
    lines = [ln for ln in captured.err.splitlines() if ln.startswith("alibi identify:")]
    assert len(lines) == 1 and "declares a_then_w+add_before_cast" in lines[0] and "a_then_w+add_after_cast" in lines[0]
    # an honest kernel still exits 0, also where its declared bias mode cannot be told apart (no bias: `fma` stands
    # for every mode)
    _register_liar("honest", "a_then_w+add_before_cast", "a_then_w+add_before_cast")
    assert main(["identify", "honest"]) == 0
    assert main(["identify", "honest", "--synthetic", "epilogue-probe"]) == 0
