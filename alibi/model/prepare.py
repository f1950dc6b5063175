"""`alibi model prepare`: a pinned GGUF → a dense bf16 checkpoint and quantized ones (W8A8, block-scaled fp8).

Output folder:

    OUT/bf16/       config.json, model.safetensors, tokenizer files, manifest.json
    OUT/w8a8/       the same with int8 decoder Linears + weight_scale, and a quantization_config
                    (`--format w8a8`, the default)
    OUT/fp8-block/  the same with e4m3 decoder Linears + fp32 weight_scale_inv per 128×128 block, and
                    DeepSeek-V3's quantization_config (`--format fp8-block`; alibi.model.fp8_block_checkpoint)

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
from alibi.model.compressed_tensors import SCALE_DTYPES, W8A8Checkpoint, quantize_dense
from alibi.model.fp8_block_checkpoint import FORMAT_NAME as FP8_BLOCK_DIR
from alibi.model.fp8_block_checkpoint import BlockFp8Checkpoint, quantize_dense_block_fp8
from alibi.model.gguf_source import (
    dense_state_dict,
    gguf_provenance,
    llama_config,
    open_source,
)
from alibi.model.tokenizer import tokenizer_files_from_gguf

BF16_DIR, W8A8_DIR = "bf16", "w8a8"
FORMATS = (W8A8_DIR, FP8_BLOCK_DIR)  # the quantized checkpoints `--format` chooses among; each gets its own folder
FORMAT_LABELS = {W8A8_DIR: "W8A8", FP8_BLOCK_DIR: "block-scaled fp8"}


@dataclass(frozen=True)
class Prepared:
    """Where the checkpoints went, and their content digests (`CheckpointDigests.as_dict()`); a format not asked
    for has None (`w8a8` / `w8a8_digests`, `fp8_block` / `fp8_block_digests`)."""

    bf16: Path
    w8a8: Path | None
    bf16_digests: dict
    w8a8_digests: dict | None
    quantized_linears: int
    fp8_block: Path | None = None
    fp8_block_digests: dict | None = None


def _digest_params(digests) -> dict:
    return {"tensors_digest": digest_set(digests.weights), "config_digest": digest_set(digests.config),
            "tokenizer_digest": digest_set(digests.tokenizer) if digests.tokenizer else None}


# The stages `prepare_model` reports: verify the GGUF, dequantize, quantize, write both checkpoints.
PREPARE_STAGES = 4


def check_formats(formats: tuple[str, ...], scale_dtype: str | None) -> tuple[str, ...]:
    """The quantized formats to write, in `FORMATS` order without repeats; InputError for an unknown one, none, or
    a `scale_dtype` given without the W8A8 checkpoint it applies to."""
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise InputError(f"--format {unknown[0] if unknown else '(none)'!r} is not one of {', '.join(FORMATS)}")
    if scale_dtype is not None and W8A8_DIR not in formats:
        raise InputError(f"--scale-dtype sets the W8A8 checkpoint's weight_scale dtype, but --format asks only for "
                         f"{', '.join(formats)}, whose weight_scale_inv is float32 as in DeepSeek-V3; "
                         "drop --scale-dtype or add --format w8a8")
    if scale_dtype is not None and scale_dtype not in SCALE_DTYPES:
        raise InputError(f"--scale-dtype {scale_dtype!r} is not one of {', '.join(SCALE_DTYPES)}")
    return tuple(f for f in FORMATS if f in formats)


def prepare_model(name: str, out: str | Path, gguf: str | Path | None = None,
                  scale_dtype: str | None = None, progress: ProgressCallback | None = None,
                  formats: tuple[str, ...] = (W8A8_DIR,)) -> Prepared:
    """Convert the pinned model `name` (GGUF from its package, or `gguf`) into `out`/bf16 and one folder per
    quantized format (`out`/w8a8, `out`/fp8-block).

    scale_dtype: the dtype the W8A8 checkpoint stores its weight scales in (`bfloat16`, the default, as
    llm-compressor writes them for a bf16 model, or `float32`); refused without the W8A8 format. formats: a
    subset of `FORMATS`. progress: called `(done, PREPARE_STAGES, label)` after each stage (alibi.io.progress):
    verified, dequantized, quantized, wrote; the label says what the stage did
    (the progress line or bar adds the time since the start).
    """
    formats = check_formats(tuple(formats), scale_dtype)
    scale_dtype = scale_dtype or "bfloat16"
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
    w8a8 = quantize_dense(config, tensors, scale_dtype=SCALE_DTYPES[scale_dtype]) if W8A8_DIR in formats else None
    blocks = quantize_dense_block_fp8(config, tensors) if FP8_BLOCK_DIR in formats else None
    quantized = {W8A8_DIR: w8a8, FP8_BLOCK_DIR: blocks}
    linears = len(next(c for c in quantized.values() if c is not None).linears)
    say(f"quantized {linears} Linears to {' and '.join(FORMAT_LABELS[f] for f in formats)}")
    digests: dict[str, dict] = {}
    with atomic.staged_dir(out) as stage:
        bf16_dir = stage / BF16_DIR
        bf16_dir.mkdir()
        write_checkpoint(bf16_dir, config, tensors, tokenizer)
        bf16_digests = checkpoint_digests(bf16_dir, tensors)
        gguf_input = {"name": source.filename, "digest": digest_set(source.sha256)}
        write_manifest(bf16_dir, "checkpoint", build_predicate(
            inputs={"gguf": gguf_input},
            parameters={"format": "dense", "dtype": "bfloat16", "source": provenance, **_digest_params(bf16_digests)}))
        for fmt in formats:
            ckpt = quantized[fmt]
            folder, stored = stage / fmt, ckpt.tensors()
            folder.mkdir()
            write_checkpoint(folder, ckpt.config, stored, tokenizer)
            ckpt_digests = checkpoint_digests(folder, stored)
            digests[fmt] = ckpt_digests.as_dict()
            write_manifest(folder, "checkpoint", build_predicate(
                inputs={"gguf": gguf_input, "checkpoint": resource(BF16_DIR, bf16_dir)},
                parameters={**_format_params(fmt, ckpt, scale_dtype), "quantized_linears": len(ckpt.linears),
                            "source": provenance, **_digest_params(ckpt_digests)}))
        say("wrote and pinned " + ("both checkpoints" if len(formats) == 1 else f"{len(formats) + 1} checkpoints"))
    out = Path(out)
    return Prepared(out / BF16_DIR, out / W8A8_DIR if w8a8 else None, bf16_digests.as_dict(), digests.get(W8A8_DIR),
                    linears, out / FP8_BLOCK_DIR if blocks else None, digests.get(FP8_BLOCK_DIR))


def _format_params(fmt: str, ckpt: W8A8Checkpoint | BlockFp8Checkpoint, scale_dtype: str) -> dict:
    """What a quantized checkpoint's manifest records about its format."""
    if fmt == W8A8_DIR:
        return {"format": "compressed-tensors/int-quantized", "dtype": "bfloat16",
                "scale_dtype": dtype_name(SCALE_DTYPES[scale_dtype])}
    layout = ckpt.scheme.layout
    return {"format": "fp8/block", "dtype": "bfloat16", "scale_dtype": "float32",
            "weight_block_size": [layout.block_n, layout.block_k], "activation_groups": f"1x{layout.block_k}",
            # K not a multiple of block_k: kept ragged (vLLM's CUDA group quantiser refuses such a K)
            "ragged_k": ckpt.ragged_k()}
