"""`alibi model prepare NAME --out DIR`: a pinned GGUF → bf16 and compressed-tensors W8A8 checkpoints.

`alibi model info DIR` prints what a checkpoint is (dense or W8A8, quantized layers, digests).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from alibi.io.progress import progress


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="prepare and inspect model checkpoints")
    ms = p.add_subparsers(dest="model_command", required=True, parser_class=type(p))
    prep = ms.add_parser("prepare", help="convert a pinned GGUF model into bf16 and W8A8 checkpoints")
    prep.add_argument("name", help="pinned model to prepare, e.g. smollm2-135m (an unknown name lists them all)")
    prep.add_argument("--out", type=Path, required=True, help="output folder (gets bf16/ and w8a8/)")
    prep.add_argument("--gguf", type=Path, help="the GGUF file itself (default: the one inside the installed package)")
    prep.add_argument("--scale-dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                      help="dtype of the stored weight scales (default bfloat16, as llm-compressor writes them)")
    prep.add_argument("--quiet", action="store_true", help="no progress lines")
    prep.set_defaults(func=prepare)
    info = ms.add_parser("info", help="describe a checkpoint folder (dense or W8A8) and check its manifest")
    info.add_argument("folder", type=Path)
    info.set_defaults(func=describe)


def prepare(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    from alibi.model.prepare import prepare_model

    p = prepare_model(args.name, args.out, args.gguf, args.scale_dtype,
                      progress=progress("model prepare", quiet=args.quiet, unit="stage"))
    print(f"bf16 checkpoint: {p.bf16}  (tensors {p.bf16_digests['weights'][:16]}…)")
    print(f"W8A8 checkpoint: {p.w8a8}  ({p.quantized_linears} quantized Linears, tensors {p.w8a8_digests['weights'][:16]}…)")
    print(f"tokenizer {p.w8a8_digests['tokenizer'][:16]}…; every file is pinned in each folder's manifest.json")
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

    config = read_config(args.folder)
    checked = verified_checkpoint(args.folder)
    out = {"folder": str(args.folder), "model_type": config.get("model_type"),
           "architectures": config.get("architectures"), "tensors_sha256": checked["tensors_sha256"],
           "manifest_verified": checked["verified"], "tokenizer_sha256": tokenizer_digest(args.folder) or None}
    if "quantization_config" in config:
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
