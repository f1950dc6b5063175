"""Which known epilogue model does a black-box kernel implement?

Runs the kernel once per tile and compares its bits with every epilogue model the emulator knows
(3 scale orders × 3 bias modes, and the two orders with a first product also with an intermediate
rounding to the output dtype between the scales: 15 models; without a bias the bias modes coincide,
so only the 5 orders are told apart), plus the kernel's own declared model when it lies outside that
family (bitsandbytes' statistics-based dequantization). A model *matches* when it reproduces every output bit of every tile. Use tiles
with real (non-power-of-two) scales: under pow2 weight scales all orders agree by design.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from alibi.errors import InputError
from alibi.exact.emulator import (
    BIAS_MODES,
    ORDERS,
    EpilogueModel,
    apply_epilogue,
    exact_accumulator,
)
from alibi.exact.numerics import bitwise_differ_mask, max_ulp_distance
from alibi.kernels.base import Kernel
from alibi.tiles.out_bias_probe import out_bias_probe_tiles
from alibi.tiles.synthetic import synthetic_tiles
from alibi.tiles.tile import Tile

DEFAULT_PRESET = "epilogue-probe-bias"


@dataclass(frozen=True)
class Candidate:
    """How well one epilogue model explains the kernel: differing elements over all tiles."""

    model: str
    n_differing: int
    max_ulp: int | None
    matches: bool


def known_models(with_bias: bool = True) -> list[EpilogueModel]:
    """Every epilogue model identify tells apart (bias modes only `fma` when no tile has a bias)."""
    return [EpilogueModel(o, b, r) for r, o, b in product((False, True), ORDERS, BIAS_MODES if with_bias else ("fma",))
            if not (r and o == "product_first")]


def probe_tiles(kernel: Kernel, seed: int = 0) -> tuple[list[Tile], str]:
    """The tiles `alibi identify` runs by default for `kernel`, and a line saying which they are.

    `DEFAULT_PRESET` (an fp32 bias that tells the bias modes apart best) for a kernel that takes any
    bias; for one that takes its bias only in the output dtype (`Kernel.bias_in_output_dtype`), the
    order probe and the output-dtype bias probe of `alibi.tiles.out_bias_probe`, which tell the same models
    apart with a bias that kernel accepts.
    """
    if kernel.bias_in_output_dtype:
        return (out_bias_probe_tiles(seed=seed),
                f"tiles: the output-dtype bias probe (order probe + bias probe, bf16), not {DEFAULT_PRESET}: "
                f"{kernel.name} takes its bias only in the output dtype")
    return synthetic_tiles(DEFAULT_PRESET, seed=seed), f"tiles: synthetic preset {DEFAULT_PRESET}"


def declared_candidate(kernel: Kernel, tiles: list[Tile]) -> str | None:
    """The name under which `identify` lists the kernel's declared model on `tiles` (without a bias, the family's
    `fma` member stands for every bias mode), or None when it declares none."""
    own = kernel.epilogue
    if own is None:
        return None
    if not any(t.bias is not None for t in tiles) and own.statistics is None:
        own = EpilogueModel(own.order, "fma", own.round_between)
    return own.name


def declared_matches(kernel: Kernel, tiles: list[Tile], found: list[Candidate]) -> bool | None:
    """Whether the kernel's declared model is among the candidates that match every output bit (None when it
    declares none)."""
    name = declared_candidate(kernel, tiles)
    return None if name is None else any(c.matches and c.model == name for c in found)


def identify(kernel: Kernel, tiles: list[Tile]) -> list[Candidate]:
    """Candidates sorted best first (exact matches first, then fewest differing elements)."""
    if any(t.fmt != "int8" for t in tiles):
        raise InputError("identify works on int8 tiles (an fp8 accumulator has no exact reference)")
    with_bias = any(t.bias is not None for t in tiles)
    models = known_models(with_bias)
    own = kernel.epilogue
    if own is not None and not with_bias and own.statistics is None:
        # Without a bias every bias mode is the same program: the family's `fma` member stands for it.
        own = EpilogueModel(own.order, "fma", own.round_between)
    if own is not None and own not in models:  # a model outside the family (statistics)
        models.append(own)
    totals = {m.name: [0, None] for m in models}
    for tile in tiles:
        out = kernel.run(tile).out
        acc = exact_accumulator(tile.a_q, tile.w_q)
        for m in models:
            expected = apply_epilogue(m, acc, tile.s_a, tile.s_w, tile.bias, tile.out_dtype)
            totals[m.name][0] += int(bitwise_differ_mask(out, expected).sum())
            ulp = max_ulp_distance(out, expected)
            if ulp is not None:
                totals[m.name][1] = max(ulp, totals[m.name][1] or 0)
    found = [Candidate(name, n, ulp, n == 0) for name, (n, ulp) in totals.items()]
    return sorted(found, key=lambda c: (not c.matches, c.n_differing, c.model))
