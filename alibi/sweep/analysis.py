"""`alibi analyze depth`: fit every given depth sweep, attach a rows sweep, write fits.json, fits.md and figures.

`fits.json` is a `DepthAnalysis` (schema `alibi-depth-fits/v1`): one `alibi.sweep.depth_fits.DepthFits`
per input sweep, in the order given, plus the rows sweep when one is passed. `fits.md` renders it
(`alibi.sweep.summary`); `depth.png|svg` and `rows.png|svg` are the figures (`alibi.sweep.figure`); `alibi.sweep.output` writes the folder.
"""

from __future__ import annotations

from dataclasses import dataclass

from alibi.io.typed import TypedResult
from alibi.sweep.depth_fits import LEVEL, DepthFits, fit_depth
from alibi.sweep.records import DepthInput, RowsSweep

FITS_SCHEMA = "alibi-depth-fits/v1"
FITS_JSON, FITS_MD = "fits.json", "fits.md"


@dataclass(frozen=True)
class DepthAnalysis(TypedResult):
    """The fits of several depth sweeps (`analyses`, with their `sources`), the bootstrap settings
    they share, and optionally a rows sweep (`rows`, read from `rows_source`)."""

    SCHEMA = FITS_SCHEMA
    REMEDY = "re-run `alibi analyze depth`"
    FILE = FITS_JSON

    sources: tuple[str, ...]
    analyses: tuple[DepthFits, ...]
    bootstrap: int
    bootstrap_seed: int
    level: float
    rows_source: str | None
    rows: RowsSweep | None
    schema: str = FITS_SCHEMA


def analyze(inputs: list[DepthInput], rows: RowsSweep | None, rows_source: str | None, *, bootstrap: int,
            bootstrap_seed: int, progress=None) -> DepthAnalysis:
    fits = []
    for item in inputs:
        sweep = item.sweep
        fits.append(fit_depth(item.data, source=item.source, label=item.label,
                              format=None if sweep is None else sweep.format,
                              kernel_a=None if sweep is None else sweep.kernel_a,
                              kernel_b=None if sweep is None else sweep.kernel_b,
                              bootstrap=bootstrap, bootstrap_seed=bootstrap_seed))
        if progress:
            progress(progress_line(item.label, fits[-1]))
    return DepthAnalysis(tuple(i.source for i in inputs), tuple(fits), bootstrap, bootstrap_seed, LEVEL,
                         rows_source, rows)


def progress_line(label: str, fits: DepthFits) -> str:
    """One input's outcome as `analyze depth` prints it: its status and the model selected, or that none was
    (a status other than `ok`: no model is fitted, never Python's `None`)."""
    chosen = f"selected {fits.selected}" if fits.selected is not None else "no model selected"
    return f"{label}: {fits.status}, {chosen}"
