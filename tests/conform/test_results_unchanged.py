"""`alibi conform` on the built-in default preset gives the same results as before the package was regrouped.

`data/default-preset-results.json` holds the results part of the report.json that `alibi conform` wrote on the
CPU with SOURCE_DATE_EPOCH=1764547200 at commit 53d93fd, right after the regroup into concept folders and before
any check was touched (aa9bf69, before the regroup, wrote the same report.json bytes): the verdict, the
per-check summary and every unit (torch-cpu against triton under the Triton interpreter; exact integer
accumulators on CPUs with VNNI, as CI's, and elementwise fp32 epilogues).
What may differ between machines — the environment and the kernels' version evidence — is left out. A change
that alters a verdict, a count, an ulp or a listed difference of the default run fails here; a deliberate one
re-records the file and says why in its commit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alibi.cli import main

EXPECTED = Path(__file__).parent / "data" / "default-preset-results.json"


def results_part(report: dict) -> dict:
    part = {k: report[k] for k in ("schema", "created_at", "verdict", "equivalence", "inconclusive_because", "seed",
                                   "regimes", "checks", "tiles")}
    return {**part, "kernel_a": report["kernel_a"]["name"], "kernel_b": report["kernel_b"]["name"]}


@pytest.mark.slow
def test_the_default_conform_run_reports_exactly_the_recorded_results(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764547200")
    assert main(["conform", "--quiet", "--out", str(tmp_path / "report")]) == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert results_part(report) == json.loads(EXPECTED.read_text())
