"""`alibi model prepare`: a pinned GGUF → a dense bf16 checkpoint and a compressed-tensors W8A8 one.

Output folder:

    OUT/bf16/   config.json, model.safetensors, tokenizer files, manifest.json
    OUT/w8a8/   the same with int8 decoder Linears + weight_scale, and a quantization_config

Each `manifest.json` is an alibi manifest (kind `checkpoint`) pinning every file by sha256; its
predicate records the source, and the content digests of the weights (a tensor digest, see
`alibi.model.digests`), config and tokenizer. The whole OUT folder is staged and appears only when
complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from alibi.errors import InputError
from alibi.exact.numerics import dtype_name
from alibi.governance.manifest import (
    build_predicate,
    digest_set,
    resource,
    write_manifest,
)
from alibi.io import atomic
from alibi.io.progress import ProgressCallback
from alibi.model.checkpoint import checkpoint_digests, write_checkpoint
from alibi.model.compressed_tensors import SCALE_DTYPES, quantize_dense
from alibi.model.gguf_source import (
    dense_state_dict,
    gguf_provenance,
    llama_config,
    open_source,
)
from alibi.model.tokenizer import tokenizer_files_from_gguf

BF16_DIR, W8A8_DIR = "bf16", "w8a8"


@dataclass(frozen=True)
class Prepared:
    """Where the two checkpoints went, and their content digests (`CheckpointDigests.as_dict()`)."""

    bf16: Path
    w8a8: Path
    bf16_digests: dict
    w8a8_digests: dict
    quantized_linears: int


def _digest_params(digests) -> dict:
    return {"tensors_digest": digest_set(digests.weights), "config_digest": digest_set(digests.config),
            "tokenizer_digest": digest_set(digests.tokenizer) if digests.tokenizer else None}


# The stages `prepare_model` reports: verify the GGUF, dequantize, quantize, write both checkpoints.
PREPARE_STAGES = 4


def prepare_model(name: str, out: str | Path, gguf: str | Path | None = None,
                  scale_dtype: str = "bfloat16", progress: ProgressCallback | None = None) -> Prepared:
    """Convert the pinned model `name` (GGUF from its package, or `gguf`) into `out`/bf16 and `out`/w8a8.

    scale_dtype: the dtype the W8A8 checkpoint stores its weight scales in (`bfloat16` as
    llm-compressor writes them for a bf16 model, or `float32`). progress: called
    `(done, PREPARE_STAGES, label)` after each stage (alibi.io.progress): verified, dequantized,
    quantized, wrote; the label says what the stage did
    (the progress line or bar adds the time since the start).
    """
    if scale_dtype not in SCALE_DTYPES:
        raise InputError(f"--scale-dtype {scale_dtype!r} is not one of {', '.join(SCALE_DTYPES)}")
    atomic.refuse_overlap(out, {"--gguf": gguf}, what="the output folder")
    atomic.check_writable_dir(out)
    atomic.check_replaceable(out)  # before the conversion: OUT is replaced whole
    done = 0

    def say(stage: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, PREPARE_STAGES, stage)

    source, g = open_source(name, gguf)
    say(f"verified {source.filename} (sha256 {source.sha256[:16]}…)")
    config = llama_config(g)
    tensors = dense_state_dict(g, torch.bfloat16)
    tokenizer = tokenizer_files_from_gguf(g.metadata, str(g.path))
    provenance = gguf_provenance(source)
    say(f"dequantized {len(tensors)} tensors to bf16 and built the tokenizer")
    w8a8 = quantize_dense(config, tensors, scale_dtype=SCALE_DTYPES[scale_dtype])
    w8a8_tensors = w8a8.tensors()
    say(f"quantized {len(w8a8.linears)} Linears to W8A8")
    with atomic.staged_dir(out) as stage:
        bf16_dir, w8a8_dir = stage / BF16_DIR, stage / W8A8_DIR
        bf16_dir.mkdir()
        w8a8_dir.mkdir()
        write_checkpoint(bf16_dir, config, tensors, tokenizer)
        write_checkpoint(w8a8_dir, w8a8.config, w8a8_tensors, tokenizer)
        bf16_digests = checkpoint_digests(bf16_dir, tensors)
        w8a8_digests = checkpoint_digests(w8a8_dir, w8a8_tensors)
        gguf_input = {"name": source.filename, "digest": digest_set(source.sha256)}
        write_manifest(bf16_dir, "checkpoint", build_predicate(
            inputs={"gguf": gguf_input},
            parameters={"format": "dense", "dtype": "bfloat16", "source": provenance, **_digest_params(bf16_digests)}))
        write_manifest(w8a8_dir, "checkpoint", build_predicate(
            inputs={"gguf": gguf_input, "checkpoint": resource(BF16_DIR, bf16_dir)},
            parameters={"format": "compressed-tensors/int-quantized", "dtype": "bfloat16",
                        "scale_dtype": dtype_name(SCALE_DTYPES[scale_dtype]),
                        "quantized_linears": len(w8a8.linears), "source": provenance,
                        **_digest_params(w8a8_digests)}))
        say("wrote and pinned both checkpoints")
    out = Path(out)
    return Prepared(out / BF16_DIR, out / W8A8_DIR, bf16_digests.as_dict(), w8a8_digests.as_dict(), len(w8a8.linears))
