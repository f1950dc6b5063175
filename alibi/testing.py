"""A pytest-friendly API for kernel authors.

    from alibi.testing import assert_interchangeable

    def test_my_kernel_matches_vllm_cutlass():
        assert_interchangeable(MyKernel(), "emulator:w_then_a", "qwen3-1.7b")

`kernel_a` / `kernel_b` are `Kernel` objects or registry names; `tiles` is a list of `Tile`s, a
folder of tile files, or a synthetic preset name (default: `default`, which exercises every attribute of a
declared epilogue). The assertion fails with one readable line per
fired check (and, with `strict=True`, per required check that could not be applied).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path

from alibi.conform.checks import DEFAULT_ULP_THRESHOLD
from alibi.conform.pipeline import REGIMES, Pair, TileSource, run_conformance, source_from_dir, source_from_preset, source_from_tiles
from alibi.conform.results import Report
from alibi.errors import InputError, one_line
from alibi.kernels.base import Kernel
from alibi.kernels.registry import get_kernel
from alibi.tiles.synthetic import DEFAULT_PRESET, PRESETS
from alibi.tiles.tile import Tile


class NotInterchangeable(AssertionError):
    """The kernels failed conformance; `report` holds the full report (`alibi.conform.results.Report`)."""

    def __init__(self, message: str, report: Report):
        super().__init__(message)
        self.report = report


def _kernel(k: Kernel | str) -> Kernel:
    kernel = get_kernel(k) if isinstance(k, str) else k
    kernel.require_available()
    return kernel


def _source(tiles: Iterable[Tile] | str | Path, seed: int) -> TileSource:
    if isinstance(tiles, str) and tiles in PRESETS:
        return source_from_preset(tiles, seed=seed)
    if isinstance(tiles, str | Path):
        if not Path(tiles).is_dir():  # neither a preset nor a folder: name both kinds of answer

            close = difflib.get_close_matches(str(tiles), list(PRESETS), n=1)
            raise InputError(f"tiles {one_line(str(tiles))!r}: neither a synthetic preset nor a folder of tiles"
                             + (f" (did you mean {close[0]!r}?)" if close else "") + f"; give one of the presets "
                             f"{', '.join(PRESETS)}, a folder of tile files, or Tile objects")
        return source_from_dir(tiles)
    return source_from_tiles(tiles)


def assert_interchangeable(kernel_a: Kernel | str, kernel_b: Kernel | str,
                           tiles: Iterable[Tile] | str | Path = DEFAULT_PRESET, *,
                           regimes: Iterable[str] = REGIMES, ulp_threshold: int = DEFAULT_ULP_THRESHOLD,
                           strict: bool = False, seed: int = 0) -> Report:
    """Run the conformance procedure and raise `NotInterchangeable` if a check fires.

    Returns the report when the kernels pass, so a test can assert more (e.g. that every tile is
    bitwise equal: `report.equivalence == "bitwise"`, or `all(u.explained for u in report.tiles)`).
    tiles: by default the `default` preset, whose declaration probes exercise every attribute of a declared
    epilogue (bias in fp32 and in the output dtype, bfloat16 and float16, decode and prefill M): a kernel that
    departs from its declaration in any of them fails; a source that claims that and falls short is inconclusive
    (raised under `strict`).
    """
    pair = Pair(_kernel(kernel_a), _kernel(kernel_b), "assert_interchangeable")
    source = _source(tiles, seed)
    report = run_conformance(pair, source, regimes, seed=seed, ulp_threshold=ulp_threshold)
    problems = [f"  {c.check} fired: {c.detail}" for c in report.checks if c.fired]
    if strict:
        problems += [f"  inconclusive: {why}" for why in report.inconclusive_because]
    if problems:
        head = f"{pair.a.name} and {pair.b.name} are not interchangeable on {source.record['label']}:"
        raise NotInterchangeable("\n".join([head, *problems]), report)
    return report
