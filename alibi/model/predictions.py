"""The per-layer prediction list of a capture: computed from the tiles alone, pinned by a digest.

For every tile the exact emulator (`alibi.exact.emulator.predict_tile`) gives max|acc|, the headroom
below 2²⁴ and whether the layer is predicted bitwise-safe — which means that its accumulator
enters fp32 exactly (int32 cannot overflow and every |acc| ≤ 2²⁴), not that two kernels give
the same bits: their epilogues may still round differently unless the weight scales are powers
of two (`summary.bitwise_safe` counts such layers). The list is a pure function of the
tile files — no clock, no machine — so its `digest` (sha256 of the canonical JSON of everything
but the digest itself) is the same wherever it is recomputed, and can be pinned in a
pre-registration before any kernel is compared on the capture.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from alibi.errors import InputError, one_line
from alibi.exact.emulator import FP32_EXACT_LIMIT, predict_tile
from alibi.governance.manifest import (
    MANIFEST_NAME,
    digest_tree,
    read_manifest,
    sha256_file,
)
from alibi.io import atomic
from alibi.model.digests import json_sha256
from alibi.tiles.tile import load_tile

FORMAT = "alibi-predictions/v1"


def _tile_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise InputError(f"{folder}: not a folder of tiles; pass the output folder of `alibi capture`")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise InputError(f"{folder}: holds no *.safetensors tiles")
    return files


def predict_folder(folder: str | Path) -> dict:
    """The prediction document for the tiles in `folder` (see module docstring), with its digest."""
    folder = Path(folder)
    layers = []
    for path in _tile_files(folder):
        tile = load_tile(path)
        p = predict_tile(tile)
        layers.append({
            "name": tile.name,
            "file": path.name,
            "tile_sha256": sha256_file(path),
            "M": tile.M, "K": tile.K, "N": tile.N,
            "max_abs_acc": p.max_abs_acc,
            "headroom_bits": None if math.isinf(p.headroom_bits) else round(p.headroom_bits, 6),
            "product_bound": p.product_bound,
            "k_limit": p.k_limit,
            "int32_safe": p.int32_safe,
            "fp32_lossless": p.fp32_lossless,
            "prediction": p.prediction,
        })
    finite = [x for x in layers if x["headroom_bits"] is not None]
    worst = min(finite, key=lambda x: x["headroom_bits"]) if finite else None
    source = None
    if (folder / MANIFEST_NAME).is_file():
        m = read_manifest(folder)
        source = {"kind": m.kind, "inputs": m.predicate.get("inputs"), "parameters": m.predicate.get("parameters")}
    doc = {
        "format": FORMAT,
        "tiles": {"count": len(layers), "folder_digest": {"sha256": digest_tree(folder)}},
        "capture": source,
        "limit": {"fp32_exact": FP32_EXACT_LIMIT},
        "summary": {
            "layers": len(layers),
            "below_2_24": sum(x["fp32_lossless"] for x in layers),
            "int32_safe": sum(x["int32_safe"] for x in layers),
            "bitwise_safe": sum(x["prediction"] == "bitwise-safe" for x in layers),
            "min_headroom_bits": None if worst is None else worst["headroom_bits"],
            "min_headroom_layer": None if worst is None else worst["name"],
            "max_abs_acc": max(x["max_abs_acc"] for x in layers),
        },
        "layers": layers,
    }
    doc["digest"] = {"sha256": json_sha256(doc)}
    return doc


def write_predictions(folder: str | Path, out: str | Path) -> dict:
    """Compute the predictions for `folder` and write them as JSON to `out` atomically (refused
    before any work when `out` lies inside the tiles folder or is a folder)."""
    atomic.refuse_overlap(out, {"--tiles": folder}, what="the prediction file")
    if Path(out).is_dir():
        raise InputError(f"{one_line(str(out))}: is a folder; --out names the prediction file to write")
    doc = predict_folder(folder)
    atomic.write_text(out, json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return doc


def verify_predictions(path: str | Path) -> dict:
    """Read a prediction file and check its digest (InputError if edited or malformed)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        recorded = doc.pop("digest")["sha256"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: not a prediction file ({exc}); write one with `alibi predict`") from exc
    if json_sha256(doc) != recorded:
        raise InputError(f"{path}: its content does not match its digest; it was edited after `alibi predict` wrote it")
    doc["digest"] = {"sha256": recorded}
    return doc
