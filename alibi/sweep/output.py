"""Sweep folders (the JSON, the CSV and the manifest) and depth-fit folders (fits.json, fits.md, figures,
manifest), each staged and renamed into place only when complete."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from alibi.governance import build_predicate, resource, treatment_of, write_manifest
from alibi.io import atomic
from alibi.sweep.analysis import FITS_JSON, FITS_MD, DepthAnalysis
from alibi.sweep.arms import Arm
from alibi.sweep.depth_fits import DepthData
from alibi.sweep.figure import depth_figure, rows_figure
from alibi.sweep.records import (
    DEPTH_CSV,
    DEPTH_JSON,
    ROWS_CSV,
    ROWS_JSON,
    DepthSweep,
    RowsSweep,
)
from alibi.sweep.summary import fits_markdown


def _arms(arms: tuple[Arm, Arm]) -> dict:
    return {a.label: treatment_of(a.kernel, a.label) for a in arms}


def write_depth_folder(sweep: DepthSweep, arms: tuple[Arm, Arm], out: str | Path) -> Path:
    parameters = {"sweep": "depth", "format": sweep.format, "fp8_scales": sweep.fp8_scales, "M": sweep.M,
                  "N": sweep.N, "Ks": list(sweep.Ks), "seeds": list(sweep.seeds), "nested_prefix": sweep.nested_prefix,
                  "near_zero_rel": sweep.near_zero_rel, "operands": sweep.operands,
                  "operand_device": sweep.operand_device, "reference": sweep.reference,
                  "timing": asdict(sweep.timing)}
    with atomic.staged_dir(out) as stage:
        atomic.write_text(stage / DEPTH_JSON, sweep.to_json())
        atomic.write_text(stage / DEPTH_CSV, sweep.to_csv())
        predicate = build_predicate(seed=sweep.seeds[0], arms=_arms(arms), parameters=parameters)
        write_manifest(stage, "depth-sweep", predicate, files=[DEPTH_JSON, DEPTH_CSV])
    return Path(out)


def write_rows_folder(sweep: RowsSweep, arms: tuple[Arm, Arm], out: str | Path) -> Path:
    parameters = {"sweep": "rows", "format": sweep.format, "fp8_scales": sweep.fp8_scales, "K": sweep.K,
                  "N": sweep.N, "Ms": list(sweep.Ms), "elements_target": sweep.elements_target,
                  "rows_per_block": sweep.rows_per_block, "confidence": sweep.confidence,
                  "operands": sweep.operands, "operand_device": sweep.operand_device,
                  "timing": asdict(sweep.timing)}
    with atomic.staged_dir(out) as stage:
        atomic.write_text(stage / ROWS_JSON, sweep.to_json())
        atomic.write_text(stage / ROWS_CSV, sweep.to_csv())
        predicate = build_predicate(seed=sweep.seed, arms=_arms(arms), parameters=parameters)
        write_manifest(stage, "rows-sweep", predicate, files=[ROWS_JSON, ROWS_CSV])
    return Path(out)


def write_analysis_folder(analysis: DepthAnalysis, data: list[DepthData], inputs: list[str | Path],
                          rows_path: str | Path | None, out: str | Path) -> list[str]:
    """fits.json, fits.md, the figures and a manifest, staged and renamed into place when complete."""
    with atomic.staged_dir(out) as stage:
        atomic.write_text(stage / FITS_JSON, analysis.to_json())
        atomic.write_text(stage / FITS_MD, fits_markdown(analysis))
        written = [FITS_JSON, FITS_MD]
        written += [p.name for p in depth_figure(list(zip(analysis.analyses, data)), stage / "depth")]
        if analysis.rows is not None:
            written += [p.name for p in rows_figure(analysis.rows, stage / "rows")]
        resources = {f"sweep{i}": resource(f"sweep{i}", p) for i, p in enumerate(inputs)}
        if rows_path is not None:
            resources["rows"] = resource("rows", rows_path)
        predicate = build_predicate(inputs=resources, seed=analysis.bootstrap_seed,
                                    parameters={"analysis": "depth", "bootstrap": analysis.bootstrap,
                                                "level": analysis.level, "sources": list(analysis.sources),
                                                "rows_source": analysis.rows_source})
        write_manifest(stage, "depth-fits", predicate, files=written)
    return written + ["manifest.json"]
