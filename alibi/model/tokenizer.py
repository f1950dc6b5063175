"""Hugging Face tokenizer files built offline from a GGUF file's tokenizer metadata.

Nothing is fetched from a hub: the vocabulary, merges, token types and special-token ids are all
in the GGUF (`tokenizer.ggml.*`). For a byte-level BPE (`tokenizer.ggml.model == "gpt2"`) the only
piece not stored as data is the pre-tokenizer, which llama.cpp selects by name
(`tokenizer.ggml.pre`); the regexes are llama.cpp's (`llama-vocab.cpp`). For `smollm` it splits
every digit on its own and then applies GPT-2's regex, which is what SmolLM2's original
`tokenizer.json` does (`Digits(individual_digits=True)` then `ByteLevel`).

The `tokenizer.json` document is written here field by field (the `tokenizers` serialization
format 1.0, merges as pairs, read by tokenizers ≥ 0.20) rather than by `tokenizers` itself, so its
bytes — and therefore the tokenizer digest that prompt sets and captures pin — do not depend on
which `tokenizers` version prepared the model, and preparing needs no tokenizer package at all.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from alibi.errors import InputError

# llama.cpp pre-tokenizer names that are GPT-2's byte-level regex, with or without a digit split.
_DIGIT_SPLIT = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
_GPT2_ONLY = {"gpt2", "gpt-2", "mpt", "olmo", "jais", "default"}
_CONTROL = 3  # llama.cpp token type LLAMA_TOKEN_TYPE_CONTROL
_USER_DEFINED = 4


def _byte_level(add_prefix_space: bool, trim_offsets: bool) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": trim_offsets, "use_regex": True}


def tokenizer_json(metadata: Mapping[str, object], source: str) -> dict:
    """The `tokenizer.json` document for the byte-level BPE described by GGUF `metadata`."""
    kind = metadata.get("tokenizer.ggml.model")
    pre = str(metadata.get("tokenizer.ggml.pre", "default"))
    if kind != "gpt2":
        raise InputError(f"{source}: tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2' is)")
    if pre not in _DIGIT_SPLIT | _GPT2_ONLY:
        raise InputError(f"{source}: pre-tokenizer {pre!r} is not known to this converter "
                         f"(known: {', '.join(sorted(_DIGIT_SPLIT | _GPT2_ONLY))})")
    if "tokenizer.ggml.tokens" not in metadata or "tokenizer.ggml.merges" not in metadata:
        raise InputError(f"{source}: has no tokenizer.ggml.tokens/merges; the GGUF carries no tokenizer")
    tokens = [str(t) for t in metadata["tokenizer.ggml.tokens"]]
    types = list(metadata.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    added = [{"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": t == _CONTROL}
             for i, t in enumerate(types) if t in (_CONTROL, _USER_DEFINED)]
    byte_level = _byte_level(add_prefix_space=False, trim_offsets=True)
    pre_tokenizer = ({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level]}
                     if pre in _DIGIT_SPLIT else byte_level)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": _byte_level(add_prefix_space=True, trim_offsets=False),
        "decoder": _byte_level(add_prefix_space=True, trim_offsets=True),
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": {tok: i for i, tok in enumerate(tokens)},
            "merges": [m.split(" ", 1) for m in metadata["tokenizer.ggml.merges"]],
        },
    }


def tokenizer_files_from_gguf(metadata: Mapping[str, object], source: str) -> dict[str, str]:
    """{file name: text} of `tokenizer.json`, `tokenizer_config.json` and `special_tokens_map.json`.

    `metadata` is a GGUF file's key/value metadata; `source` names the file in error messages.
    """
    document = tokenizer_json(metadata, source)
    tokens = metadata["tokenizer.ggml.tokens"]

    def name(key: str) -> str | None:
        idx = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return str(tokens[int(idx)]) if idx is not None else None

    special_map = {k: v for k, v in {"bos_token": name("bos"), "eos_token": name("eos"), "unk_token": name("unknown"),
                                     "pad_token": name("padding")}.items() if v is not None}
    arch = metadata.get("general.architecture")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(metadata.get(f"{arch}.context_length", 2048)),
        **special_map,
    }
    if "tokenizer.chat_template" in metadata:
        config["chat_template"] = metadata["tokenizer.chat_template"]
    return {
        "tokenizer.json": json.dumps(document, ensure_ascii=False, indent=1) + "\n",
        "tokenizer_config.json": json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
        "special_tokens_map.json": json.dumps(special_map, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
    }
