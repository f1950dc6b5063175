"""A Hugging Face tokenizer built offline from a GGUF file's tokenizer metadata.

Nothing is fetched from a hub: the vocabulary, merges, token types and special-token ids are all
in the GGUF (`tokenizer.ggml.*`). For a byte-level BPE (`tokenizer.ggml.model == "gpt2"`) the only
piece not stored as data is the pre-tokenizer, which llama.cpp selects by name
(`tokenizer.ggml.pre`); the regexes below are llama.cpp's (`llama-vocab.cpp`). For `smollm` it
splits every digit on its own and then applies GPT-2's regex, which is what SmolLM2's original
`tokenizer.json` does (`Digits(individual_digits=True)` then `ByteLevel`).

Needs the `tokenizers` package (a dependency of transformers; part of the `model` extra).
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


def _require_tokenizers():
    try:
        import tokenizers  # noqa: F401
    except ImportError as exc:
        raise InputError(
            "building a tokenizer needs the 'tokenizers' package; install it with "
            "`pip install 'integer-alibi[model]'` (or `pip install tokenizers`)"
        ) from exc
    return tokenizers


def tokenizer_files_from_gguf(metadata: Mapping[str, object], source: str) -> dict[str, str]:
    """Return {file name: text} for `tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json`.

    `metadata` is a GGUF file's key/value metadata; `source` names the file in error messages.
    """
    tk = _require_tokenizers()
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = metadata.get("tokenizer.ggml.model")
    pre = str(metadata.get("tokenizer.ggml.pre", "default"))
    if kind != "gpt2":
        raise InputError(f"{source}: tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2' is)")
    if pre not in _DIGIT_SPLIT | _GPT2_ONLY:
        raise InputError(
            f"{source}: pre-tokenizer {pre!r} is not known to this converter "
            f"(known: {', '.join(sorted(_DIGIT_SPLIT | _GPT2_ONLY))})"
        )
    tokens = list(metadata["tokenizer.ggml.tokens"])
    types = list(metadata.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
    vocab = {tok: i for i, tok in enumerate(tokens)}

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre in _DIGIT_SPLIT:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    specials = [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == _CONTROL]
    added = [AddedToken(tokens[i], special=False, normalized=False) for i, t in enumerate(types) if t == _USER_DEFINED]
    tok.add_special_tokens(specials)
    if added:
        tok.add_tokens(added)

    def name(key: str) -> str | None:
        idx = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[int(idx)] if idx is not None else None

    special_map = {k: v for k, v in {
        "bos_token": name("bos"), "eos_token": name("eos"), "unk_token": name("unknown"), "pad_token": name("padding"),
    }.items() if v is not None}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(metadata.get(f"{metadata.get('general.architecture')}.context_length", 2048)),
        **special_map,
    }
    if "tokenizer.chat_template" in metadata:
        config["chat_template"] = metadata["tokenizer.chat_template"]
    del tk
    return {
        "tokenizer.json": tok.to_str(pretty=True) + "\n",
        "tokenizer_config.json": json.dumps(config, indent=2, sort_keys=True) + "\n",
        "special_tokens_map.json": json.dumps(special_map, indent=2, sort_keys=True) + "\n",
    }
