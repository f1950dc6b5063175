"""cuBLASLt's block-scaled declaration at long K is exactly what the committed four-seed readings identified: a
shape is declared where one schedule reproduced every element of every seed and was alone in doing so on at least
two seeds, and nowhere else (analysis/results/h100/fp8-block/long-k/)."""

from __future__ import annotations

import json
from pathlib import Path

from alibi.kernels import block_scaled
from alibi.kernels.registry import get_kernel

READINGS = Path(__file__).resolve().parents[2] / "analysis" / "results" / "h100" / "fp8-block" / "long-k"


def identified() -> dict[tuple[str, int, int, int], str]:
    kernel = get_kernel("cublaslt-fp8-block")
    found: dict[tuple[str, int, int, int], str] = {}
    for path in sorted(READINGS.glob("*/cublaslt-long-k*.json")):
        doc = json.loads(path.read_text())
        assert doc["kernel"] == kernel.name and doc["seeds"] >= 4
        for row in doc["shapes"]:
            common, alone = row["common"], [m for m in row["matched_per_seed"] if m == row["common"]]
            if len(common) != 1 or len(alone) < 2 or not row["run_to_run_identical"]:
                continue
            key = (doc["gpu"], *kernel.padded_shape(row["M"], row["N"], row["K"]))
            assert found.setdefault(key, common[0]) == common[0], f"two readings disagree at {key}"
    return found


def test_the_long_k_declaration_is_exactly_the_shapes_four_seeds_pinned_to_one_schedule():
    assert block_scaled.IDENTIFIED_LONG_K == identified()


def test_a_shape_one_seed_had_declared_and_three_others_contradicted_is_not_declared():
    kernel = get_kernel("cublaslt-fp8-block")
    assert ("NVIDIA H100 80GB HBM3", 128, 256, 7168) not in block_scaled.IDENTIFIED_LONG_K
    rows = [r for p in READINGS.glob("*/cublaslt-long-k*.json") for r in json.loads(p.read_text())["shapes"]
            if (r["M"], r["N"], r["K"]) == (128, 256, 7168)]
    assert rows and rows[0]["common"] == [] and len({tuple(m) for m in rows[0]["matched_per_seed"]}) > 1
    assert kernel.multiples == (4, 128, 512)
