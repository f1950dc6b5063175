"""`alibi predict-pair`: the declared models alone predict where two kernels differ."""

from __future__ import annotations

import json

from alibi.cli import main
from alibi.conform.pair_prediction import PairPrediction, predict_pair
from alibi.conform.pipeline import Pair, run_conformance, source_from_preset
from alibi.kernels.registry import get_kernel


def test_the_prediction_from_declared_models_equals_what_two_real_cpu_kernels_do():
    """torch._int_mm (w_then_a+add_before_cast) against the a_then_w+fma emulator, bias tiles, both regimes:
    per unit, the number of elements predicted to differ is the number that differ when both run."""
    source = source_from_preset("smollm2-135m-bias", seed=3, rows=8)
    predicted = predict_pair("torch-cpu", "emulator:a_then_w", source)
    report = run_conformance(Pair(get_kernel("torch-cpu"), get_kernel("emulator:a_then_w"), "test"), source,
                             invariance=False)
    assert [(u.tile, u.regime, u.n_predicted) for u in predicted.units] == \
        [(u.tile, u.regime, u.n_differing) for u in report.tiles]
    assert sum(u.n_predicted for u in predicted.units) > 0  # the pair really differs somewhere
    assert all(u.cause for u in predicted.units if u.n_predicted)


def test_predict_pair_certifies_two_kernels_declaring_one_model_and_exits_0(capsys):
    assert main(["predict-pair", "cutlass", "triton:w_then_a+fma", "--synthetic", "smollm2-135m-bias",
                 "--rows", "4"]) == 0
    assert "verdict: BITWISE" in capsys.readouterr().out


def test_predict_pair_names_the_bias_mode_for_vllms_two_int8_kernels_and_exits_1(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["predict-pair", "vllm-cutlass", "vllm-triton", "--synthetic", "smollm2-135m-bias", "--rows", "4",
                 "--out", str(out)]) == 1
    result = PairPrediction.from_json(out.read_text())
    assert result.verdict == "differs" and (result.model_a, result.model_b) == ("w_then_a+fma", "a_then_w+add_after_cast")
    assert any("bias mode" in (u.cause or "") for u in result.units)
    assert json.loads(out.read_text())["schema"] == "alibi.pair-prediction/v1"


def test_an_unknown_kernel_or_model_name_is_refused_with_one_line_and_exit_2(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["predict-pair", "w_then_b", "triton", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'w_then_b' is neither a kernel" in err
    assert not out.exists()


def test_a_model_with_an_intermediate_rounding_is_predicted_with_that_cause():
    """TorchAO's model against the same program without the cast between the scales: only the intermediate
    rounding differs, and the prediction names it."""
    source = source_from_preset("smollm2-135m-bias", seed=3, rows=8)
    result = predict_pair("a_then_w+add_before_cast+round_between", "a_then_w+add_before_cast", source)
    assert result.verdict == "differs"
    assert {u.cause for u in result.units if u.n_predicted} == {"intermediate rounding"}


def test_a_model_name_that_does_not_parse_is_refused_with_the_grammar(capsys):
    assert main(["predict-pair", "a_then_w+round_twice", "torch-cpu", "--synthetic", "tiny"]) == 2
    assert "[+round_between]" in capsys.readouterr().err
