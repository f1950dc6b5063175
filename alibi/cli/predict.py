"""`alibi predict --tiles DIR --out FILE`: per-layer headroom predictions from the exact emulator.

"bitwise-safe" (the prediction's name, pinned in locked pre-registrations) means exactly this: the
layer's int32 accumulator cannot overflow and every |acc| ≤ 2²⁴, so the accumulator enters fp32
exactly. It says nothing about the epilogue, so the words printed here define it every time.
"""

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
    print(f"{s['layers']} layers: {s['bitwise_safe']} predicted bitwise-safe, i.e. the accumulator enters fp32 "
          f"exactly (int32 cannot overflow and max|acc| ≤ 2^24); min headroom {s['min_headroom_bits']} bits "
          f"({s['min_headroom_layer']}), max|acc| {s['max_abs_acc']:,}")
    print("  bitwise-safe does not mean two kernels give the same bits: their epilogues (scale order, bias) can "
          "still differ, except under power-of-two weight scales; `alibi conform` measures that")
    print(f"wrote {args.out} (digest {doc['digest']['sha256']})")
    return 0
