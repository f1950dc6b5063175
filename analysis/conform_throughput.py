"""Conformance throughput of the pipeline as it stood before issue 12 (the "before" row of its table).

    python analysis/conform_throughput.py --kernel-a cutlass --kernel-b triton --preset qwen3-1.7b \
        --rows 512 --repeats 3 --out before.json            # or --tiles CAPTURE_DIR

Times `alibi.conform.conform` in one process: both regimes (real, pow2) and every check, as
`alibi conform` runs them, after one warm-up call (kernel builds, Triton compilation and CUDA
context creation stay out of the timing). Reports units, output elements (M·N summed over units)
and wall seconds per repeat, and the median throughput in output elements per second. Tile
generation is outside the timed region; report writing is not part of `conform()`.

After issue 12 the same numbers, split into kernels, exact reference, checks and I/O, come from
`alibi bench conform`; this script stays only so that the "before" row can be re-measured from
the commit that had the old pipeline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from alibi.conform import Pair, conform, environment
from alibi.kernels import get_kernel
from alibi.synthetic import synthetic_tiles
from alibi.tile import load_tile_dir


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernel-a", required=True)
    p.add_argument("--kernel-b", required=True)
    p.add_argument("--preset", default="qwen3-1.7b")
    p.add_argument("--tiles", help="a folder of tile files instead of the preset (e.g. a SmolLM2 capture)")
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    pair = Pair(get_kernel(args.kernel_a), get_kernel(args.kernel_b), "throughput")
    pair.a.require_available()
    pair.b.require_available()
    if args.tiles:
        tiles, source = load_tile_dir(args.tiles), {"label": f"tiles in {args.tiles}", "kind": "tiles"}
    else:
        tiles = synthetic_tiles(args.preset, seed=0, M=args.rows)
        source = {"label": f"synthetic preset {args.preset}", "kind": "synthetic"}
    conform(pair, tiles[:1], ("real", "pow2"), source=source, seed=0)  # warm-up: builds, compilation
    seconds, report = [], None
    for _ in range(args.repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        report = conform(pair, tiles, ("real", "pow2"), source=source, seed=0)
        seconds.append(time.perf_counter() - t0)
    units = report["tiles"]
    elements = sum(u["n_elements"] for u in units)
    med = statistics.median(seconds)
    result = {"what": "alibi.conform.conform wall time, both regimes, every check", "kernel_a": args.kernel_a,
              "kernel_b": args.kernel_b, "source": source["label"], "rows": tiles[0].M, "units": len(units),
              "output_elements": elements, "seconds": seconds, "median_s": med,
              "elements_per_s": elements / med, "verdict": report["verdict"],
              "n_differing": [u["n_differing"] for u in units], "environment": environment()}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"{args.kernel_a} vs {args.kernel_b} on {source['label']} M={tiles[0].M}: {len(units)} units, "
          f"{elements:,} elements, median {med:.3f} s over {args.repeats} → {elements / med / 1e6:.1f} M elements/s "
          f"(verdict {report['verdict']})")


if __name__ == "__main__":
    main()
