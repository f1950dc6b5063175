"""`alibi model prepare NAME --out DIR [--format w8a8|fp8-block ...]`: a pinned GGUF → a bf16 checkpoint and
compressed-tensors W8A8 and/or block-scaled fp8 (DeepSeek-V3 layout) ones.

`alibi model info DIR` prints what a checkpoint is (dense, W8A8 or block-scaled fp8, quantized layers, digests).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from alibi.io.progress import progress


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="prepare and inspect model checkpoints")
    ms = p.add_subparsers(dest="model_command", required=True, parser_class=type(p))
    prep = ms.add_parser("prepare", help="convert a pinned GGUF model into bf16 and quantized (W8A8, fp8-block) "
                         "checkpoints")
    prep.add_argument("name", help="pinned model to prepare, e.g. smollm2-135m (an unknown name lists them all)")
    prep.add_argument("--out", type=Path, required=True,
                      help="output folder (gets bf16/ and one folder per --format: w8a8/, fp8-block/)")
    prep.add_argument("--gguf", type=Path, help="the GGUF file itself (default: the one inside the installed package)")
    prep.add_argument("--format", dest="formats", action="append", choices=("w8a8", "fp8-block"),
                      help="quantized checkpoint to write beside bf16/ (repeatable; default w8a8): w8a8 is "
                           "compressed-tensors int8, fp8-block is e4m3 with fp32 weight_scale_inv per 128x128 block "
                           "and dynamic 1x128 activation groups (DeepSeek-V3 / Qwen3-FP8 layout)")
    prep.add_argument("--scale-dtype", default=None, choices=("bfloat16", "float16", "float32"),
                      help="dtype of the W8A8 checkpoint's stored weight scales (default bfloat16, as llm-compressor "
                           "writes them); not for fp8-block, whose scales are float32")
    prep.add_argument("--quiet", action="store_true", help="no progress lines")
    prep.set_defaults(func=prepare)
    info = ms.add_parser("info", help="describe a checkpoint folder (dense, W8A8 or fp8-block) and check its manifest")
    info.add_argument("folder", type=Path)
    info.set_defaults(func=describe)


def prepare(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    from alibi.model.prepare import prepare_model

    p = prepare_model(args.name, args.out, args.gguf, args.scale_dtype,
                      progress=progress("model prepare", quiet=args.quiet, unit="stage"),
                      formats=tuple(args.formats or ("w8a8",)))
    print(f"bf16 checkpoint: {p.bf16}  (tensors {p.bf16_digests['weights'][:16]}…)")
    if p.w8a8 is not None:
        print(f"W8A8 checkpoint: {p.w8a8}  ({p.quantized_linears} quantized Linears, tensors "
              f"{p.w8a8_digests['weights'][:16]}…)")
    if p.fp8_block is not None:
        print(f"fp8-block checkpoint: {p.fp8_block}  ({p.quantized_linears} block-scaled Linears, tensors "
              f"{p.fp8_block_digests['weights'][:16]}…)")
    print(f"tokenizer {p.bf16_digests['tokenizer'][:16]}…; every file is pinned in each folder's manifest.json")
    return 0


def describe(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    from alibi.model.checkpoint import (
        read_config,
        read_tensors,
        tokenizer_digest,
        verified_checkpoint,
    )
    from alibi.model.compressed_tensors import parse_w8a8
    from alibi.model.fp8_block_checkpoint import is_block_fp8_config, parse_block_fp8

    config = read_config(args.folder)
    checked = verified_checkpoint(args.folder)
    out = {"folder": str(args.folder), "model_type": config.get("model_type"),
           "architectures": config.get("architectures"), "tensors_sha256": checked["tensors_sha256"],
           "manifest_verified": checked["verified"], "tokenizer_sha256": tokenizer_digest(args.folder) or None}
    if is_block_fp8_config(config):
        blocks = parse_block_fp8(config, read_tensors(args.folder), str(args.folder))
        layout = blocks.scheme.layout
        out |= {"format": "fp8 block-scaled (e4m3, weight_scale_inv)", "quantized_linears": len(blocks.linears),
                "weight_block_size": [layout.block_n, layout.block_k], "activation_groups": f"1x{layout.block_k}",
                "ignore": list(blocks.scheme.ignored), "ragged_k": blocks.ragged_k(),
                "shapes_K_N": [list(s) for s in sorted({(q.K, q.N) for q in blocks.linears.values()})]}
    elif "quantization_config" in config:
        ckpt = parse_w8a8(config, read_tensors(args.folder), str(args.folder))
        shapes = sorted({(lin.K, lin.N) for lin in ckpt.linears.values()})
        out |= {"format": "compressed-tensors/int-quantized W8A8", "quantized_linears": len(ckpt.linears),
                "weight_strategy": ckpt.scheme.weight_strategy, "ignore": list(ckpt.scheme.ignore),
                "scale_dtypes": sorted({str(lin.scale_dtype).removeprefix("torch.") for lin in ckpt.linears.values()}),
                "shapes_K_N": [list(s) for s in shapes]}
    else:
        out["format"] = "dense"
    print(json.dumps(out, indent=2))
    return 0
