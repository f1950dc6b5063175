"""On a GPU: the `cublas` kernel is `torch._int_mm` plus its declared `w_then_a+add_before_cast` epilogue.

Bit patterns of its output equal the CPU emulation of the declared model on the exact
accumulator, and its accumulator equals the int64 reference — including M ≤ 16 (rows padded to
17 for torch._int_mm), K and N not multiples of 8 (zero padded) and all −128 operands at K = 32768.
"""

from __future__ import annotations

import pytest
import torch

from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator

pytestmark = pytest.mark.gpu

SHAPES = [
    (1, 4096, 4096), (1, 1000, 1536), (4, 5, 7), (16, 4096, 4096), (16, 192, 576), (17, 1000, 1000),
    (33, 584, 1530), (100, 300, 520), (128, 4096, 4096), (512, 1000, 4096), (512, 4096, 4096),
    (512, 256, 32768), (777, 1234, 2000), (4096, 4096, 4096), (4096, 1001, 576),
    (3, 96, 32768), (64, 4104, 4096), (129, 2056, 1024), (2048, 1536, 8192), (1, 8192, 8192),
]


def _operands(M, N, K, seed, bias_dtype=None):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-128, 128, (M, K), dtype=torch.int8, generator=g)
    w = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)
    s_a = (torch.rand(M, generator=g) * 0.05 + 1e-3).float()
    s_w = (torch.rand(N, generator=g) * 2e-3 + 1e-4).float()
    bias = None if bias_dtype is None else (torch.randn(N, generator=g) * 4).to(bias_dtype)
    return a, s_a, w, s_w, bias


def _bits(t):
    return t.contiguous().view(torch.int16)


@pytest.fixture(scope="module")
def kernel():
    from alibi.kernels.cublas import CublasInt8Kernel

    return CublasInt8Kernel()


@pytest.mark.parametrize("M,N,K", SHAPES)
def test_cublas_output_equals_w_then_a_add_before_cast_model_bit_for_bit(kernel, M, N, K):
    a, s_a, w, s_w, _ = _operands(M, N, K, seed=M + 2 * N + 3 * K)
    out = kernel.scaled_mm(a.cuda(), s_a.cuda(), w.cuda(), s_w.cuda()).cpu()
    expected = apply_epilogue(kernel.epilogue, exact_accumulator(a, w), s_a, s_w, None, torch.bfloat16)
    assert int((_bits(out) != _bits(expected)).sum()) == 0


@pytest.mark.parametrize("M,N,K", SHAPES)
def test_cublas_accumulator_equals_the_int64_reference(kernel, M, N, K):
    a, _, w, _, _ = _operands(M, N, K, seed=K)
    acc = kernel.accumulator(a.cuda(), w.cuda()).cpu()
    assert acc.dtype == torch.int32 and torch.equal(acc.to(torch.int64), exact_accumulator(a, w))


def test_cublas_all_minus_128_operands_at_k_32768_accumulate_exactly(kernel):
    a = torch.full((16, 32768), -128, dtype=torch.int8)
    w = torch.full((40, 32768), -128, dtype=torch.int8)
    acc = kernel.accumulator(a.cuda(), w.cuda()).cpu()
    assert torch.equal(acc.to(torch.int64), exact_accumulator(a, w))
    assert int(acc.max()) == 2**29


@pytest.mark.parametrize("preset", ["epilogue-probe", "epilogue-probe-bias"])
def test_cublas_matches_its_declared_model_and_no_other_on_the_epilogue_probe(kernel, preset):
    from alibi.exact.emulator import BIAS_MODES, ORDERS
    from alibi.tiles.synthetic import synthetic_tiles

    tile = synthetic_tiles(preset)[0]
    out = kernel.scaled_mm(tile.a_q.cuda(), tile.s_a.cuda(), tile.w_q.cuda(), tile.s_w.cuda(),
                           None if tile.bias is None else tile.bias.cuda(), tile.out_dtype).cpu()
    acc = exact_accumulator(tile.a_q, tile.w_q)
    modes = BIAS_MODES if tile.bias is not None else ("fma",)
    matches = [m for m in (EpilogueModel(o, b) for o in ORDERS for b in modes)
               if torch.equal(_bits(apply_epilogue(m, acc, tile.s_a, tile.s_w, tile.bias, tile.out_dtype)), _bits(out))]
    if tile.bias is None:
        assert [m.order for m in matches] == ["w_then_a"]
    else:
        assert matches == [kernel.epilogue]
