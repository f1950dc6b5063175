"""The pairs and tiles of test_results_unchanged.py's second test: where batching units could go wrong.

Tiles of repeated and unique shapes, so that units are judged in batches of several and of one: two
layers of the biased SmolLM2 block at M = 16 in bf16 and in fp16 (bias in the output dtype), the q and down
projections at M = 1 (no sub-batches), and two exposing tiles (partial sums beyond 2²⁴, subnormal outputs). Pairs, all on the CPU: torch-cpu against torchao-int8 (intermediate rounding, 13 % of the
elements differ, difference lists truncated), bitsandbytes against the a_then_w emulator on 17-bit scales
(statistics), and the emulator against the truncating-cast mutant under the Triton interpreter (checks that fire,
with their first mismatches). `results(pair)` is the part of each report that must not depend on how the units
were scheduled. Run as a script it prints every pair's results as JSON (how the expected file was recorded).
"""

from __future__ import annotations

import json
import sys

import torch

from alibi.conform.pipeline import choose_pair, run_conformance, source_from_tiles
from alibi.kernels.bnb import with_exact_statistics
from alibi.tiles.exposing import exposing_tile
from alibi.tiles.synthetic import synthetic_tiles

PAIRS = (("torch-cpu", "torchao-int8"), ("bnb-int8", "emulator:a_then_w"), ("emulator:a_then_w", "mutant:truncate-cast:triton"))


def tiles(pair: tuple[str, str]) -> list:
    block = []
    for layer_seed in (1, 2):
        block += [t.replace(name=f"s{layer_seed}-{t.name}") for t in synthetic_tiles("smollm2-135m-bias", seed=layer_seed, M=16)]
    if "mutant:truncate-cast:triton" in pair:  # the interpreter is slow: one layer, two shapes
        block = [t for t in block if t.name.startswith("s1-") and t.meta["kind"] in ("q_proj", "k_proj")]
    fp16 = [t.replace(name=f"{t.name}-fp16", out_dtype=torch.float16, bias=t.bias.to(torch.float16)) for t in block]
    m1 = [t.replace(name=f"m1-{t.name}") for t in synthetic_tiles("smollm2-135m-bias", seed=7, M=1)
          if t.meta["kind"] in ("q_proj", "down_proj")]
    # the exposing tiles beside the interpreter's slowness and bitsandbytes' CPU accumulator, which rounds partial
    # sums beyond 2^24 without AVX-512 (CPU-dependent by design)
    exposing = [] if set(pair) & {"mutant:truncate-cast:triton", "bnb-int8"} else [
        exposing_tile(n) for n in ("fp32-partials", "subnormal-outputs")]
    out = block + fp16 + m1 + exposing
    return [with_exact_statistics(t) for t in out] if "bnb-int8" in pair else out


def results(pair: tuple[str, str]) -> dict:
    report = json.loads(run_conformance(choose_pair(*pair), source_from_tiles(tiles(pair), "batched golden"),
                                        created_at=None).to_json())
    return {k: report[k] for k in ("verdict", "equivalence", "inconclusive_because", "checks", "tiles")}


if __name__ == "__main__":
    json.dump({" vs ".join(p): results(p) for p in PAIRS}, sys.stdout, indent=1, sort_keys=True)
