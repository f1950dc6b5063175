"""cuBLASLt's block-scaled declaration at long K is exactly what the committed fits identified: a shape is declared
where one schedule alone reproduced every fp32 output bit of every recorded seed (analysis/fit_block_schedule.py on
analysis/h200/block_record.py's outputs), and nowhere else; and the declared schedule reproduces recorded outputs
here, on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from alibi.controls.fp8_block_schedule import random_block_tile
from alibi.exact.fp8_block import DEEPSEEK_V3
from alibi.exact.fp8_block_mma import accumulate_blocks
from alibi.kernels import block_scaled
from alibi.kernels.registry import get_kernel

RESULTS = Path(__file__).resolve().parents[2] / "analysis" / "results" / "h100" / "fp8-block"
RECORD = RESULTS / "d7205d1" / "record-cublaslt.safetensors"


def canonical(label: str) -> str:
    """Two parts added in either order give the same bits (fp32 addition commutes): one name for both."""
    return label.replace(":split-2-desc", ":split-2")


def fits() -> list[tuple[dict, dict]]:
    out = []
    for path in sorted(RESULTS.glob("**/fit-*.json")):
        doc = json.loads(path.read_text())
        assert doc["metadata"]["kernel"] == "cublaslt-fp8-block" and doc["dtype"] == "fp32"
        out += [(doc, row) for row in doc["shapes"]]
    return out


def identified() -> dict[tuple[str, int, int, int], str]:
    found: dict[tuple[str, int, int, int], str] = {}
    for doc, row in fits():
        schedules = sorted({canonical(label) for label in row["fits"]})
        if len(schedules) != 1 or row["seeds"] < 2 or row["padded"][2] <= block_scaled.SHORT_K:
            continue
        key = (doc["metadata"]["gpu"], *row["padded"])
        assert found.setdefault(key, schedules[0]) == schedules[0], f"two fits disagree at {key}"
    return found


def test_the_long_k_declaration_is_exactly_the_shapes_whose_fp32_outputs_one_schedule_alone_reproduces():
    assert len(fits()) >= 39
    assert block_scaled.IDENTIFIED_LONG_K == identified()


def test_every_fitted_shape_up_to_the_short_k_runs_the_short_k_declaration():
    kernel = get_kernel("cublaslt-fp8-block")
    short = [row for _, row in fits() if row["padded"][2] <= block_scaled.SHORT_K]
    assert short and all(row["fits"] == [kernel.accumulation.label] for row in short)


def test_the_shape_a_bf16_reading_misdeclared_splits_k_in_two():
    """At 128 × 256 × 7168 one bf16 seed had pointed at the unsplit promotion (later withdrawn); every fp32 bit of
    four seeds says split-2."""
    key = ("NVIDIA H100 80GB HBM3", 128, 256, 7168)
    assert block_scaled.IDENTIFIED_LONG_K[key] == "block128:fma(sa*sw,p,acc):split-2"
    row = next(row for _, row in fits() if row["shape"] == "128x256x7168")
    assert row["seeds"] == 4 and "block128:fma(sa*sw,p,acc)" not in row["fits"]


@pytest.mark.parametrize("shape", ["1x256x7168", "8x576x7168"])
def test_the_declared_schedule_reproduces_every_recorded_output_bit(shape, monkeypatch):
    """The declaration the kernel makes on the H100, emulated here, against outputs recorded there (fp32 and bf16)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA H100 80GB HBM3")
    kernel = get_kernel("cublaslt-fp8-block")
    M, N, K = (int(x) for x in shape.split("x"))
    schedule = kernel.schedule_at(M, N, K)
    assert schedule is not None and schedule.split is not None
    with safe_open(str(RECORD), "pt") as f:
        assert f.metadata()["gpu"] == "NVIDIA H100 80GB HBM3"
        for seed in range(4):
            tile = random_block_tile(M, N, K, seed)
            acc = accumulate_blocks(schedule, tile.a_q, tile.s_a, tile.w_q, tile.s_w, DEEPSEEK_V3)
            assert torch.equal(acc.view(torch.int32), f.get_tensor(f"{shape}/{seed}/fp32").view(torch.int32))
            assert torch.equal(acc.to(torch.bfloat16).view(torch.int16),
                               f.get_tensor(f"{shape}/{seed}/bf16").view(torch.int16))
