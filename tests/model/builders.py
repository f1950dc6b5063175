"""Small hand-built models, checkpoints and tokenizers for the model tests (no downloads).

Everything here is written with json + safetensors directly, independently of alibi's writer, so
reader tests check alibi against the on-disk layout rather than against itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "tie_word_embeddings": True,
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
    "dtype": "bfloat16",
}

PROJ_SHAPES = {  # name -> (N, K) for TINY_LLAMA
    "self_attn.q_proj": (64, 64), "self_attn.k_proj": (32, 64), "self_attn.v_proj": (32, 64),
    "self_attn.o_proj": (64, 64), "mlp.gate_proj": (128, 64), "mlp.up_proj": (128, 64),
    "mlp.down_proj": (64, 128),
}


def tiny_dense_tensors(seed: int = 0, config: dict = TINY_LLAMA) -> dict[str, torch.Tensor]:
    """Random bf16 weights with the tensor names of a Hugging Face Llama checkpoint."""
    g = torch.Generator().manual_seed(seed)
    hidden, vocab = config["hidden_size"], config["vocab_size"]

    def rnd(*shape, std=0.08):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)

    t = {"model.embed_tokens.weight": rnd(vocab, hidden, std=0.5),
         "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        t[f"{p}.input_layernorm.weight"] = (1 + rnd(hidden, std=0.05)).to(torch.bfloat16)
        t[f"{p}.post_attention_layernorm.weight"] = (1 + rnd(hidden, std=0.05)).to(torch.bfloat16)
        for proj, (n, k) in PROJ_SHAPES.items():
            t[f"{p}.{proj}.weight"] = rnd(n, k)
    return t


def write_dense(folder: Path, tensors: dict[str, torch.Tensor], config: dict = TINY_LLAMA) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


LLM_COMPRESSOR_W8A8 = {
    # The shape of quantization_config that llm-compressor's W8A8 preset writes (e.g. RedHatAI
    # Qwen3-8B-quantized.w8a8), including fields alibi does not use.
    "config_groups": {
        "group_0": {
            "input_activations": {"actorder": None, "block_structure": None, "dynamic": True, "group_size": None,
                                  "num_bits": 8, "observer": None, "observer_kwargs": {}, "strategy": "token",
                                  "symmetric": True, "type": "int"},
            "output_activations": None,
            "targets": ["Linear"],
            "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": None,
                        "num_bits": 8, "observer": "minmax", "observer_kwargs": {}, "strategy": "channel",
                        "symmetric": True, "type": "int"},
        }
    },
    "format": "int-quantized",
    "global_compression_ratio": 1.2,
    "ignore": ["lm_head"],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
    "version": "0.9.4",
}


def hand_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """absmax/127.5 in bf16, then round(w / scale) — written out here independently of alibi.exact.quant."""
    scale = (w.float().abs().amax(dim=1, keepdim=True) / 127.5).to(torch.bfloat16)
    q = torch.clamp(torch.round(w.float() / scale.float()), -128, 127).to(torch.int8)
    return q, scale


def write_llm_compressor_style(folder: Path, tensors: dict[str, torch.Tensor], *, shards: int = 2,
                               quantization_config: dict | None = None, config: dict = TINY_LLAMA) -> dict:
    """A W8A8 checkpoint laid out as llm-compressor saves one: sharded with an index, [N,1] bf16 scales."""
    folder.mkdir(parents=True, exist_ok=True)
    stored: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if name.endswith("_proj.weight"):
            q, s = hand_quantize(t)
            stored[name] = q
            stored[name.removesuffix(".weight") + ".weight_scale"] = s
        else:
            stored[name] = t
    cfg = dict(config, quantization_config=quantization_config or LLM_COMPRESSOR_W8A8)
    (folder / "config.json").write_text(json.dumps(cfg))
    names = sorted(stored)
    weight_map = {}
    for i in range(shards):
        part = {n: stored[n] for n in names[i::shards]}
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, str(folder / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return stored


def write_tiny_tokenizer(folder: Path, corpus: str, vocab_size: int = 300) -> Path:
    """A byte-level BPE trained on `corpus` (needs `tokenizers`), saved as folder/tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([corpus], trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


TINY_QWEN3 = {
    **{k: v for k, v in TINY_LLAMA.items() if k not in ("architectures", "model_type")},
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "tie_word_embeddings": False,
    "attention_bias": False,
}


def tiny_qwen3_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """TINY_LLAMA's tensors plus Qwen3's per-head q/k RMSNorms and an untied lm_head."""
    t = tiny_dense_tensors(seed, TINY_QWEN3)
    g = torch.Generator().manual_seed(seed + 100)
    for i in range(TINY_QWEN3["num_hidden_layers"]):
        for norm in ("q_norm", "k_norm"):
            t[f"model.layers.{i}.self_attn.{norm}.weight"] = (1 + 0.05 * torch.randn(16, generator=g)).to(torch.bfloat16)
    t["lm_head.weight"] = (0.5 * torch.randn(TINY_QWEN3["vocab_size"], TINY_QWEN3["hidden_size"], generator=g)).to(torch.bfloat16)
    return t
