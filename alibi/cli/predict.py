"""`alibi predict --tiles DIR --out FILE`: per-layer headroom predictions from the exact emulator.

"bitwise-safe" (the prediction's name, pinned in locked pre-registrations) means exactly this: the
layer's int32 accumulator cannot overflow and every |acc| ≤ 2²⁴, so the accumulator enters fp32
exactly. It says nothing about the epilogue, so the words printed here define it every time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from alibi.conform.pair_prediction import declared_model, predict_pair
from alibi.errors import InputError
from alibi.io import atomic
from alibi.io.limits import check_seed


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="predict per layer, before any kernel runs, which tiles stay below 2^24")
    p.add_argument("--tiles", type=Path, required=True, help="folder of tiles (e.g. from `alibi capture`)")
    p.add_argument("--out", type=Path, required=True, help="prediction file to write (JSON, with its digest)")
    p.set_defaults(func=run)
    q = sub.add_parser("predict-pair", help="certify a pair from its declared epilogue models alone, running no kernel",
                       description="Where must kernels A and B differ on these tiles, if each equals its declared "
                                   "epilogue model? A and B are kernel names (their declared models) or models "
                                   "such as w_then_a+fma. Exit 0 when no element is predicted to differ, 1 otherwise.")
    q.add_argument("kernel_a", metavar="A")
    q.add_argument("kernel_b", metavar="B")
    src = q.add_mutually_exclusive_group()
    src.add_argument("--tiles", type=Path, help="folder of int8 tiles")
    src.add_argument("--synthetic", metavar="PRESET", help="a synthetic preset (default: default)")
    q.add_argument("--rows", type=int, help="override the synthetic preset's M")
    q.add_argument("--seed", type=int, default=0, help="seed for synthetic tiles (default 0)")
    q.add_argument("--scales", default="real,pow2", help="scale regimes, comma-separated (default real,pow2)")
    q.add_argument("--out", type=Path, help="also write the prediction as JSON (alibi.pair-prediction/v1)")
    q.set_defaults(func=run_pair)


def run_pair(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
    from alibi.conform.pipeline import source_from_dir, source_from_preset
    from alibi.tiles.synthetic import DEFAULT_PRESET

    check_seed(args.seed, "--seed")
    declared_model(args.kernel_a), declared_model(args.kernel_b)  # refuse a bad name before reading tiles
    if args.out is not None:
        atomic.refuse_overlap(args.out, {"--tiles": args.tiles}, what="the prediction file")
        atomic.check_writable_dir(args.out.parent)
        if args.out.is_dir():
            raise InputError(f"--out {args.out}: is a folder; name the JSON file to write")
    if args.tiles is not None:
        if args.rows is not None:
            raise InputError("--rows applies to --synthetic presets, not to --tiles")
        source = source_from_dir(args.tiles)
    else:
        source = source_from_preset(args.synthetic or DEFAULT_PRESET, seed=args.seed, rows=args.rows)
    result = predict_pair(args.kernel_a, args.kernel_b, source, [r.strip() for r in args.scales.split(",") if r.strip()])
    print(f"alibi predict-pair: {args.kernel_a} ({result.model_a}) vs {args.kernel_b} ({result.model_b}) on "
          f"{source.record['label']}, declared models only (no kernel ran)")
    if (left_out := result.source.get("left_out")) is not None:
        print(f"  left out: {len(left_out['tiles'])} tiles: {left_out['because']}")
    for regime in dict.fromkeys(u.regime for u in result.units):
        us = [u for u in result.units if u.regime == regime]
        n = sum(u.n_predicted or 0 for u in us)
        causes = sorted({u.cause for u in us if u.cause})
        print(f"  {regime:>5} scales: {sum(u.n_predicted == 0 for u in us)}/{len(us)} tiles predicted bitwise equal, "
              f"{n:,} of {sum(u.n_elements for u in us):,} elements predicted to differ"
              + (f" (cause: {', '.join(causes)})" if causes else ""))
    wraps = [u.tile for u in result.units if u.wrap_possible]
    if wraps:
        print(f"  undecided: the int32 accumulator may wrap on {len(set(wraps))} tile(s), e.g. {wraps[0]}")
    print(f"  verdict: {result.verdict.upper()} — holds for kernels that equal their declared models "
          "(the epilogue-model check of `alibi conform` establishes that)")
    if args.out is not None:
        atomic.write_text(args.out, result.to_json())
        print(f"  wrote {args.out}")
    return 0 if result.verdict == "bitwise" else 1


def run(args: argparse.Namespace) -> int:
    # deferred: keeps torch out of start-up
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
