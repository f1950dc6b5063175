"""`alibi conform` gives the same results as before the package was regrouped and before units were judged in batches.

`data/default-preset-results.json` holds the results part of the report.json that `alibi conform` wrote on the
CPU with SOURCE_DATE_EPOCH=1764547200 at commit 53d93fd, right after the regroup into concept folders and before
any check was touched (aa9bf69, before the regroup, wrote the same report.json bytes): the verdict, the
per-check summary and every unit (torch-cpu against triton under the Triton interpreter; exact integer
accumulators on CPUs with VNNI, as CI's, and elementwise fp32 epilogues).
What may differ between machines — the environment and the kernels' version evidence — is left out. A change
that alters a verdict, a count, an ulp or a listed difference of the default run fails here; a deliberate one
re-records the file and says why in its commit.

Re-recorded for issue 36 item 0: the default source gained the eight declaration probes
(`alibi.tiles.declaration_probe`), so the report has 32 units instead of 16; the first 16 (the SmolLM2 block
and the epilogue-probe tile, both regimes) are byte for byte those recorded before.
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest
from batched_golden import PAIRS, results

from alibi.cli import main

EXPECTED = Path(__file__).parent / "data" / "default-preset-results.json"
# Recorded by `python tests/batched_golden.py` at 2cdee84, the last commit that judged one unit at a time
# (every check measured and transferred unit by unit), on the CPU.
BATCHED_EXPECTED = Path(__file__).parent / "data" / "batched-golden-results.json.xz"


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


@pytest.mark.slow
@pytest.mark.parametrize("pair", PAIRS, ids=" vs ".join)
def test_units_judged_in_batches_give_every_verdict_count_and_listed_difference_of_units_judged_one_at_a_time(pair):
    """Tiles of repeated shapes (judged several at once) and of unique ones, with and without sub-batches, bf16 and
    fp16 with biases, pairs that differ in 13 % of the elements (truncated difference lists), statistics, and a
    mutant whose checks fire (their first mismatches included): the results equal those recorded before batching."""
    expected = json.loads(lzma.decompress(BATCHED_EXPECTED.read_bytes()))[" vs ".join(pair)]
    assert json.loads(json.dumps(results(pair), sort_keys=True)) == expected
