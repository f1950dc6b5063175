"""Each block kernel's declared schedule reproduces its recorded H200 and H100 output bits
(tests/fixtures/fp8-block-recorded, README there), on the CPU, FBGEMM's through the measured model of Triton's
division: a change to the block model, the step model, the division table or a declaration that breaks a measured
prediction fails here, with no GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from alibi.exact.emulator import apply_epilogue
from alibi.exact.fp8_block import DEEPSEEK_V3
from alibi.exact.fp8_block_mma import accumulate_blocks
from alibi.kernels.cpu import unit_scales
from alibi.kernels.registry import get_kernel

FIXTURES = Path(__file__).parent.parent / "fixtures" / "fp8-block-recorded"
RECORDED = (FIXTURES / "recorded-h200.safetensors", FIXTURES / "recorded-h100.safetensors")
KERNELS = ("cublaslt-fp8-block", "vllm-triton-fp8-block", "vllm-cutlass-fp8-block", "torchao-fp8-block",
           "fbgemm-fp8-block")


def recorded_outputs(path: Path) -> list[tuple[str, str]]:
    with safe_open(str(path), "pt") as f:
        keys = set(f.keys())
    tiles = sorted({k.split("/")[0] for k in keys})
    return [(tile, k) for tile in tiles for k in KERNELS if f"{tile}/{k}/out" in keys]


CASES = [pytest.param(path, k, tile, id=f"{path.stem}-{k}-{tile}")
         for path in RECORDED for tile, k in recorded_outputs(path)]


def test_the_fixtures_hold_every_kernel_and_the_probe():
    for path in RECORDED:
        assert {k for _, k in recorded_outputs(path)} == set(KERNELS)
    assert len(CASES) == 22 + 24


@pytest.mark.parametrize(("path", "name", "tile"), CASES)
def test_each_declared_block_schedule_reproduces_the_recorded_gpu_bits(path, name, tile):
    with safe_open(str(path), "pt") as f:
        a_q, w_q = (f.get_tensor(f"{tile}/{x}").view(torch.float8_e4m3fn) for x in ("a_q", "w_q"))
        s_a, s_w, out = f.get_tensor(f"{tile}/s_a"), f.get_tensor(f"{tile}/s_w"), f.get_tensor(f"{tile}/{name}/out")
    kernel = get_kernel(name)
    (M, K), N = a_q.shape, w_q.shape[0]
    schedule = kernel.schedule_at(M, N, K)
    assert schedule is not None, f"{name} declares no schedule at {M}x{N}x{K}"
    acc = accumulate_blocks(schedule, a_q, s_a, w_q, s_w, DEEPSEEK_V3)
    expected = apply_epilogue(kernel.epilogue_at(M), acc, *unit_scales(acc), None, out.dtype)
    differing = int((expected.view(torch.int16) != out.view(torch.int16)).sum())
    assert differing == 0, f"{name} on {tile}: {differing} of {out.numel()} elements differ from {schedule.label}"
