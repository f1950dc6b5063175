"""The fp8 emulator path of `conform` and `matrix` on outputs recorded on the GPU (H100/H200), so that a change to
the step model or to a kernel's declared schedule that breaks a recorded prediction fails on the CPU.

The fixture `tests/fixtures/fp8-recorded/recorded.safetensors` was written by `analysis/h200/fp8_measure.py
--parts record` (its manifest and the commit it ran at: `tests/fixtures/fp8-recorded/README.md`): random e4m3 tiles
at decode and prefill shapes, K from 256 to 2048 (one K not a multiple of 128), bf16 and fp16 outputs, and each
fp8 kernel's output and exposed accumulator. A `RecordedFp8Kernel` hands back those bits and declares what the
real kernel declares; conform then runs the emulator on the CPU and judges them.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from alibi.conform.matrix import PairStatus, run_matrix
from alibi.conform.pipeline import Pair, run_conformance, source_from_tiles
from alibi.exact.fp8_mma import WGMMA_FP8
from alibi.kernels.base import Kernel
from alibi.kernels.registry import get_kernel
from alibi.tiles.tile import Tile

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "fp8-recorded" / "recorded.safetensors"
GPU_KERNELS = ("cutlass-fp8", "triton-fp8", "cublaslt-fp8", "cublaslt-fp8-tensorwise", "fbgemm-fp8-row",
               "vllm-cutlass-fp8")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def recorded() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    return load_file(FIXTURE)


def recorded_tiles(data: dict[str, torch.Tensor]) -> dict[str, Tile]:
    tiles = {}
    for key in data:
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)-(\w+)/a_q", key)
        if m:
            tag = key.removesuffix("/a_q")
            tiles[tag] = Tile(tag, data[key].view(torch.float8_e4m3fn), data[f"{tag}/s_a"],
                              data[f"{tag}/w_q"].view(torch.float8_e4m3fn), data[f"{tag}/s_w"], None,
                              DTYPES[m.group(4)])
    return tiles


class RecordedFp8Kernel(Kernel):
    """Replays one GPU kernel's recorded bits for the recorded tiles; declares what that kernel declares (its
    schedule and epilogue are asked of the real kernel class, which imports without a GPU)."""

    formats = ("fp8_e4m3",)
    device = "cpu"

    def __init__(self, name: str, data: dict[str, torch.Tensor], declared: Kernel):
        self.name, self.data, self.declared = name, data, declared
        self.epilogue = declared.epilogue

    def epilogue_at(self, M: int):
        return self.declared.epilogue_at(M)

    def schedule_at(self, M: int, N: int, K: int):
        return self.declared.accumulation if self.name == "triton-fp8" else self.declared.schedule_at(M, N, K)

    def _key(self, a_q: torch.Tensor, w_q: torch.Tensor, dtype: torch.dtype) -> str:
        M, K = a_q.shape
        return f"{M}x{w_q.shape[0]}x{K}-{str(dtype).removeprefix('torch.')}"

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        key = f"{self._key(a_q, w_q, out_dtype)}/{self.name}/out"
        if key in self.data:
            return self.data[key].clone()
        return self._rows_of_a_recorded_tile(a_q, w_q, out_dtype)

    def _rows_of_a_recorded_tile(self, a_q, w_q, out_dtype):
        """Rows of a recorded tile run on their own (the matrix's m-invariance sub-batches): the recorded rows of the
        full tile. Whether the GPU kernel gives those bits at the smaller M was checked on the GPU (the matrix there
        runs m-invariance on the real kernel), not here."""
        suffix = f"x{w_q.shape[0]}x{a_q.shape[1]}-{str(out_dtype).removeprefix('torch.')}"
        rows = a_q.view(torch.uint8)
        for key, full in self.data.items():
            tag, _, leaf = key.partition("/")
            if leaf != "a_q" or not tag.endswith(suffix) or f"{tag}/{self.name}/out" not in self.data:
                continue
            idx = [next((i for i in range(full.shape[0]) if torch.equal(full[i], r)), None) for r in rows]
            if None not in idx:
                return self.data[f"{tag}/{self.name}/out"][idx].clone()
        raise KeyError(f"{self.name}: rows of shape {list(a_q.shape)} were not recorded")

    def run(self, tile, *, accumulator=False, on_device=False, evidence=True, wait=True):
        key = f"{tile.name}/{self.name}/out"
        if key not in self.data:  # a sub-batch of rows or another tile: not recorded
            pytest.skip(f"{tile.name}: not recorded for {self.name}")
        return super().run(tile, accumulator=accumulator, on_device=on_device, evidence=evidence, wait=wait)

    def accumulator(self, a_q, w_q):
        return self.data.get(f"{self._key(a_q, w_q, torch.bfloat16)}/{self.name}/acc")


pytestmark = pytest.mark.skipif(not FIXTURE.is_file(), reason="the recorded GPU outputs are not in this checkout")


@pytest.fixture(scope="module")
def data():
    return recorded()


def kernels_recorded(data) -> list[str]:
    return [k for k in GPU_KERNELS if any(key.endswith(f"/{k}/out") for key in data)]


def declared_kernel(name: str) -> Kernel:
    k = get_kernel(name)
    if name == "triton-fp8":  # its schedule_at asks the device; the recorded bits are the sm90 GPU's
        from alibi.exact.fp8_mma import FAST_ACCUM
        k.accumulation = FAST_ACCUM
    return k


def tiles_for(data, name: str) -> list[Tile]:
    return [t for tag, t in recorded_tiles(data).items() if f"{tag}/{name}/out" in data]


@pytest.mark.parametrize("name", GPU_KERNELS)
def test_each_recorded_gpu_kernel_equals_its_declared_schedule_and_epilogue_bit_for_bit(data, name):
    if name not in kernels_recorded(data):
        pytest.skip(f"{name} was not available on the GPU when the fixture was recorded")
    kernel = RecordedFp8Kernel(name, data, declared_kernel(name))
    emulator = get_kernel("emulator-fp8:fast-accum:w_then_a")
    report = run_conformance(Pair(kernel, emulator, "recorded"), source_from_tiles(tiles_for(data, name)),
                             ("real",), invariance=False, created_at=None)
    epilogue = report.check("epilogue-model")
    # judged on every recorded tile (an arm without a declaration would make it inapplicable), and held there
    assert not epilogue.fired, epilogue.detail
    assert epilogue.evidence["applicable"] == epilogue.evidence["units"] == len(tiles_for(data, name)), epilogue.detail


def test_the_recorded_fp8_matrix_has_every_pair_bitwise_or_explained(data):
    names = kernels_recorded(data)
    common = set.intersection(*(set(t.name for t in tiles_for(data, n)) for n in names))
    tiles = [t for tag, t in recorded_tiles(data).items() if tag in common]
    kernels = [RecordedFp8Kernel(n, data, declared_kernel(n)) for n in names]
    m = run_matrix(names, source_from_tiles(tiles), ("real",), kernels=kernels, created_at=None)
    assert {c.status for c in m.cells} <= {PairStatus.BITWISE, PairStatus.EXPLAINED}, \
        [(c.kernel_a, c.kernel_b, c.status, c.not_judged_because) for c in m.cells]


def test_a_step_model_with_one_more_alignment_bit_breaks_a_recorded_prediction(data, monkeypatch):
    """The fixture pins the model: with a 14-bit alignment the emulator no longer reproduces cutlass-fp8's bits."""
    import alibi.exact.fp8_mma as fp8_mma
    name = "cutlass-fp8"
    if name not in kernels_recorded(data):
        pytest.skip("cutlass-fp8 not recorded")
    declared = declared_kernel(name)
    wide = replace(declared.accumulation, step=replace(WGMMA_FP8, align_bits=14))
    monkeypatch.setattr(declared, "accumulation", wide)
    kernel = RecordedFp8Kernel(name, data, declared)
    report = run_conformance(Pair(kernel, get_kernel("emulator-fp8:fast-accum:w_then_a"), "recorded"),
                             source_from_tiles(tiles_for(data, name)), ("real",), invariance=False, created_at=None)
    assert report.check("epilogue-model").fired
    assert fp8_mma.WGMMA_FP8.align_bits == 13
