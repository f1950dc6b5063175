"""A pytest-friendly API for kernel authors.

    from alibi.testing import assert_interchangeable

    def test_my_kernel_matches_vllm_cutlass():
        assert_interchangeable(MyKernel(), "emulator:w_then_a", "qwen3-1.7b")

`kernel_a` / `kernel_b` are `Kernel` objects or registry names; `tiles` is a list of `Tile`s, a
folder of tile files, or a synthetic preset name. The assertion fails with one readable line per
fired check (and, with `strict=True`, per required check that could not be applied).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from alibi.checks import DEFAULT_ULP_THRESHOLD
from alibi.conform import REGIMES, Pair, conform
from alibi.kernels import Kernel, get_kernel
from alibi.synthetic import PRESETS, synthetic_tiles
from alibi.tile import Tile, load_tile_dir


class NotInterchangeable(AssertionError):
    """The kernels failed conformance; `report` holds the full report document."""

    def __init__(self, message: str, report: dict[str, Any]):
        super().__init__(message)
        self.report = report


def _kernel(k: Kernel | str) -> Kernel:
    kernel = get_kernel(k) if isinstance(k, str) else k
    kernel.require_available()
    return kernel


def _tiles(tiles: Iterable[Tile] | str | Path, seed: int) -> tuple[list[Tile], dict[str, Any]]:
    if isinstance(tiles, str) and tiles in PRESETS:
        return synthetic_tiles(tiles, seed=seed), {"label": f"synthetic preset {tiles}", "kind": "synthetic"}
    if isinstance(tiles, str | Path):
        return load_tile_dir(tiles), {"label": f"tiles in {tiles}", "kind": "tiles"}
    return list(tiles), {"label": "tiles given in code", "kind": "tiles"}


def assert_interchangeable(kernel_a: Kernel | str, kernel_b: Kernel | str, tiles: Iterable[Tile] | str | Path, *,
                           regimes: Iterable[str] = REGIMES, ulp_threshold: int = DEFAULT_ULP_THRESHOLD,
                           strict: bool = False, seed: int = 0) -> dict[str, Any]:
    """Run the conformance procedure and raise `NotInterchangeable` if a check fires.

    Returns the report document when the kernels pass, so a test can assert more (e.g. that
    every tile is bitwise equal: `all(u["bitwise_equal"] for u in report["tiles"])`).
    """
    pair = Pair(_kernel(kernel_a), _kernel(kernel_b), "assert_interchangeable")
    tile_list, source = _tiles(tiles, seed)
    report = conform(pair, tile_list, regimes, source=source, seed=seed, ulp_threshold=ulp_threshold)
    problems = []
    for c in report["checks"]:
        if c["fired"]:
            problems.append(f"  {c['check']} fired: {c['detail']}")
    if strict:
        problems += [f"  inconclusive: {why}" for why in report["inconclusive_because"]]
    if problems:
        head = f"{pair.a.name} and {pair.b.name} are not interchangeable on {source['label']}:"
        raise NotInterchangeable("\n".join([head, *problems]), report)
    return report
