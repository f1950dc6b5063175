"""`alibi predict --tiles DIR --out FILE`: per-layer headroom predictions from the exact emulator."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="predict per layer, before any kernel runs, which tiles stay below 2^24")
    p.add_argument("--tiles", type=Path, required=True, help="folder of tiles (e.g. from `alibi capture`)")
    p.add_argument("--out", type=Path, required=True, help="prediction file to write (JSON, with its digest)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from alibi.model.predictions import write_predictions

    doc = write_predictions(args.tiles, args.out)
    s = doc["summary"]
    print(f"{s['layers']} layers: {s['below_2_24']} with max|acc| ≤ 2^24, {s['bitwise_safe']} predicted bitwise-safe; "
          f"min headroom {s['min_headroom_bits']} bits ({s['min_headroom_layer']}), max|acc| {s['max_abs_acc']}")
    print(f"wrote {args.out} (digest {doc['digest']['sha256']})")
    return 0
