"""compressed-tensors W8A8 checkpoints: round trip, an independently built checkpoint, clear refusals."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from alibi.cli import main
from alibi.errors import InputError
from alibi.io import atomic
from alibi.model.checkpoint import read_tensors, write_checkpoint
from alibi.model.compressed_tensors import parse_w8a8, quantize_dense, read_w8a8

from .builders import (
    LLM_COMPRESSOR_W8A8,
    PROJ_SHAPES,
    TINY_LLAMA,
    hand_quantize,
    tiny_dense_tensors,
    write_dense,
    write_llm_compressor_style,
)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_w8a8_write_then_read_gives_identical_tensors(tmp_path):
    ckpt = quantize_dense(TINY_LLAMA, tiny_dense_tensors())
    with atomic.staged_dir(tmp_path / "w8a8") as stage:
        write_checkpoint(stage, ckpt.config, ckpt.tensors())
    back = read_w8a8(tmp_path / "w8a8")
    assert list(back.linears) == list(ckpt.linears)
    for name, lin in ckpt.linears.items():
        other = back.linears[name]
        assert _bits_equal(lin.weight, other.weight)
        assert _bits_equal(lin.scale, other.scale) and other.scale_dtype == torch.bfloat16
    assert set(back.dense) == set(ckpt.dense)
    for name, t in ckpt.dense.items():
        assert _bits_equal(t, back.dense[name])
    stored, written = ckpt.tensors(), read_tensors(tmp_path / "w8a8")
    assert set(stored) == set(written) and all(_bits_equal(stored[k], written[k]) for k in stored)


def test_quantizer_uses_the_stored_bf16_scale_and_the_int8_range():
    dense = tiny_dense_tensors(seed=3)
    ckpt = quantize_dense(TINY_LLAMA, dense)
    assert len(ckpt.linears) == 2 * len(PROJ_SHAPES)
    for name, lin in ckpt.linears.items():
        q_ref, s_ref = hand_quantize(dense[f"{name}.weight"])
        assert torch.equal(lin.weight, q_ref)
        assert torch.equal(lin.scale, s_ref.float().reshape(-1))
    assert "lm_head.weight" not in ckpt.dense and "model.embed_tokens.weight" in ckpt.dense


def test_reader_accepts_a_hand_built_llm_compressor_checkpoint(tmp_path):
    dense = tiny_dense_tensors(seed=1)
    stored = write_llm_compressor_style(tmp_path / "ct", dense, shards=3)
    ckpt = read_w8a8(tmp_path / "ct")
    assert ckpt.scheme.weight_strategy == "channel" and ckpt.scheme.ignore == ("lm_head",)
    assert len(ckpt.linears) == 14
    for name, lin in ckpt.linears.items():
        assert torch.equal(lin.weight, stored[f"{name}.weight"])
        assert lin.scale.dtype == torch.float32 and lin.scale.shape == (lin.N,)
        assert torch.equal(lin.scale, stored[f"{name}.weight_scale"].float().reshape(-1))
        assert lin.scale_dtype == torch.bfloat16
    assert set(ckpt.dense) == {k for k in stored if not k.endswith(("_proj.weight", "weight_scale"))}


def test_reader_accepts_zero_zero_points_and_per_tensor_scales(tmp_path):
    dense = tiny_dense_tensors(seed=2)
    qc = copy.deepcopy(LLM_COMPRESSOR_W8A8)
    qc["config_groups"]["group_0"]["weights"]["strategy"] = "tensor"
    write_llm_compressor_style(tmp_path / "ct", dense, shards=1, quantization_config=qc)
    shard = tmp_path / "ct" / "model-00001-of-00001.safetensors"
    tensors = load_file(str(shard))
    for key in [k for k in tensors if k.endswith("weight_scale")]:
        tensors[key] = tensors[key].max().reshape(1)
        tensors[key.replace("weight_scale", "weight_zero_point")] = torch.zeros(1, dtype=torch.int8)
    save_file(tensors, str(shard))
    ckpt = read_w8a8(tmp_path / "ct")
    lin = ckpt.linears["model.layers.0.mlp.up_proj"]
    assert lin.scale.shape == (lin.N,) and bool((lin.scale == lin.scale[0]).all())


@pytest.mark.parametrize(("path", "value", "needle"), [
    (("config_groups", "group_0", "weights", "strategy"), "group", "weights.strategy"),
    (("config_groups", "group_0", "weights", "num_bits"), 4, "weights.num_bits"),
    (("config_groups", "group_0", "input_activations", "dynamic"), False, "input_activations.dynamic"),
    (("config_groups", "group_0", "input_activations", "type"), "float", "input_activations.type"),
    (("config_groups", "group_0", "input_activations"), None, "input_activations"),
    (("format",), "float-quantized", "format"),
    (("format",), "pack-quantized", "format"),
    (("quant_method",), "gptq", "quant_method"),
    (("kv_cache_scheme",), {"num_bits": 8, "type": "float"}, "kv_cache_scheme"),
])
def test_an_unsupported_scheme_is_refused_naming_the_field(tmp_path, path, value, needle):
    qc = copy.deepcopy(LLM_COMPRESSOR_W8A8)
    node = qc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    write_llm_compressor_style(tmp_path / "ct", tiny_dense_tensors(), shards=1, quantization_config=qc)
    with pytest.raises(InputError, match="unsupported quantization scheme") as err:
        read_w8a8(tmp_path / "ct")
    assert needle in str(err.value)


def test_an_int8_weight_without_scale_and_a_nonzero_zero_point_are_malformed():
    dense = tiny_dense_tensors()
    cfg = dict(TINY_LLAMA, quantization_config=LLM_COMPRESSOR_W8A8)
    q, s = hand_quantize(dense["model.layers.0.mlp.up_proj.weight"])
    base = {"model.layers.0.mlp.up_proj.weight": q, "model.layers.0.mlp.up_proj.weight_scale": s}
    lonely = dict(base, **{"model.layers.0.mlp.down_proj.weight": q})
    with pytest.raises(InputError, match="int8 but has no '.weight_scale'"):
        parse_w8a8(cfg, lonely, "ckpt")
    shifted = dict(base, **{"model.layers.0.mlp.up_proj.weight_zero_point": torch.ones(q.shape[0], 1, dtype=torch.int8)})
    with pytest.raises(InputError, match="zero points"):
        parse_w8a8(cfg, shifted, "ckpt")
    with pytest.raises(InputError, match="dense checkpoint"):
        parse_w8a8(TINY_LLAMA, base, "ckpt")


def test_missing_weights_file_or_shard_is_a_clear_error(tmp_path):
    write_dense(tmp_path / "d", tiny_dense_tensors())
    (tmp_path / "d" / "model.safetensors").unlink()
    with pytest.raises(InputError, match="model.safetensors: missing"):
        read_tensors(tmp_path / "d")
    write_llm_compressor_style(tmp_path / "ct", tiny_dense_tensors(), shards=2)
    (tmp_path / "ct" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(InputError, match="model-00002-of-00002.safetensors listed in"):
        read_tensors(tmp_path / "ct")


def test_cli_exits_2_for_a_missing_model_file_and_an_unsupported_scheme(tmp_path, capsys):
    write_dense(tmp_path / "d", tiny_dense_tensors())
    (tmp_path / "d" / "model.safetensors").unlink()
    assert main(["model", "info", str(tmp_path / "d")]) == 2
    assert "model.safetensors: missing" in capsys.readouterr().err
    qc = copy.deepcopy(LLM_COMPRESSOR_W8A8)
    qc["config_groups"]["group_0"]["weights"]["strategy"] = "group"
    write_llm_compressor_style(tmp_path / "g", tiny_dense_tensors(), quantization_config=qc)
    assert main(["model", "info", str(tmp_path / "g")]) == 2
    assert "unsupported quantization scheme" in capsys.readouterr().err


def test_model_info_describes_a_w8a8_checkpoint(tmp_path, capsys):
    write_llm_compressor_style(tmp_path / "ct", tiny_dense_tensors())
    assert main(["model", "info", str(tmp_path / "ct")]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["quantized_linears"] == 14 and info["scale_dtypes"] == ["bfloat16"]
    assert info["manifest_verified"] is False


def test_a_scale_the_storage_dtype_cannot_hold_is_refused_on_write():
    ckpt = quantize_dense(TINY_LLAMA, tiny_dense_tensors())
    name, lin = next(iter(ckpt.linears.items()))
    odd = ckpt.replace_linears({name: lin.replace(scale=lin.scale * (1 + 2**-20))})
    with pytest.raises(ValueError, match="not representable in bfloat16"):
        odd.tensors()


def test_rewriting_scales_keeps_every_other_tensor_and_side_file_byte_identical(tmp_path):
    from alibi.model.compressed_tensors import write_w8a8

    write_llm_compressor_style(tmp_path / "in", tiny_dense_tensors(seed=4), shards=2)
    (tmp_path / "in" / "tokenizer.json").write_text('{"version": "1.0"}')
    ckpt = read_w8a8(tmp_path / "in")
    halved = {n: lin.replace(scale=lin.scale / 2) for n, lin in ckpt.linears.items()}  # exact in bf16
    with atomic.staged_dir(tmp_path / "out") as stage:
        write_w8a8(ckpt.replace_linears(halved), stage, copy_from=tmp_path / "in")
    before, after = read_tensors(tmp_path / "in"), read_tensors(tmp_path / "out")
    assert set(before) == set(after)
    for key in before:
        if key.endswith("weight_scale"):
            assert torch.equal(after[key].float(), before[key].float() / 2)
        else:
            assert _bits_equal(before[key], after[key]), key
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (tmp_path / "in" / "tokenizer.json").read_bytes()
