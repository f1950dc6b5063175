"""An arm's private copy of a tile: the same bits, shapes and strides in memory of its own, one copy per buffer for a
tile whose operands share one (`pack`), and never a whole large buffer for a small view of it."""

from __future__ import annotations

import pytest
import torch

from alibi.conform.pipeline import prepare
from alibi.exact.numerics import pow2_round
from alibi.kernels.base import OPERANDS, operands, pack, private_copy
from alibi.tiles.synthetic import synthetic_tiles


def packed(tile, device):
    """The tile with its operands `pack`ed into one buffer on `device`."""
    return tile.replace(**pack({k: v for k, v in operands(tile).items() if v is not None}, device))


def buffers(tile) -> set[int]:
    return {getattr(tile, k).untyped_storage().data_ptr() for k in OPERANDS if getattr(tile, k) is not None}


def assert_same_operands_elsewhere(copy, original) -> None:
    for k in OPERANDS:
        a, b = getattr(original, k), getattr(copy, k)
        if a is None:
            assert b is None
            continue
        assert (b.dtype, b.shape, b.stride()) == (a.dtype, a.shape, a.stride()), k
        assert torch.equal(b.contiguous().view(torch.uint8), a.contiguous().view(torch.uint8)), k
        assert not (buffers(copy) & buffers(original)), k


@pytest.fixture
def tile():
    return synthetic_tiles("smollm2-135m-bias", seed=0, M=16)[0]


def test_packing_keeps_every_operand_bit_for_bit_in_one_buffer(tile):
    p = packed(tile, "cpu")
    assert len(buffers(p)) == 1 and len(buffers(tile)) == 5
    for k in OPERANDS:
        assert torch.equal(getattr(p, k).view(torch.uint8), getattr(tile, k).view(torch.uint8)), k
        v = getattr(p, k)
        assert (v.data_ptr() - v.untyped_storage().data_ptr()) % 256 == 0, k  # (a GPU buffer starts aligned)


def test_a_packed_tile_is_copied_as_one_buffer_and_the_copy_is_its_own(tile):
    p = packed(tile, "cpu")
    c = private_copy(p)
    assert len(buffers(c)) == 1
    assert_same_operands_elsewhere(c, p)
    c.w_q.fill_(7)  # an arm writing into its inputs
    c.s_a.fill_(0.5)
    assert torch.equal(p.w_q, tile.w_q) and torch.equal(p.s_a, tile.s_a)


def test_a_regimes_own_scales_are_copied_apart_from_the_buffer_the_other_operands_share(tile):
    p = packed(tile, "cpu")
    pow2 = p.replace(s_w=pow2_round(p.s_w))
    c = private_copy(pow2)
    assert len(buffers(c)) == 2
    assert_same_operands_elsewhere(c, pow2)


def test_operands_viewing_a_much_larger_buffer_are_copied_one_by_one_not_with_it(tile):
    big = torch.zeros(64 * tile.M, tile.K, dtype=torch.int8)
    scales = torch.ones(64 * tile.M)
    view = tile.replace(a_q=big[:tile.M].copy_(tile.a_q), s_a=scales[:tile.M])
    c = private_copy(view)
    assert c.a_q.untyped_storage().nbytes() == tile.M * tile.K  # not the 64× larger buffer
    assert_same_operands_elsewhere(c, view)


def test_an_unpacked_tile_is_copied_operand_by_operand(tile):
    c = private_copy(tile)
    assert len(buffers(c)) == 5
    assert_same_operands_elsewhere(c, tile)


@pytest.mark.gpu
def test_host_operands_packed_for_the_gpu_cross_in_one_buffer_bit_for_bit(tile):
    p = packed(tile, "cuda")
    assert len(buffers(p)) == 1 and p.a_q.is_cuda
    for k in OPERANDS:
        assert torch.equal(getattr(p, k).cpu().view(torch.uint8), getattr(tile, k).view(torch.uint8)), k
    again = packed(p, "cuda")  # operands already on the GPU: copied there directly
    assert_same_operands_elsewhere(again, p)


def test_a_prepared_tile_holds_the_pow2_regimes_scales_in_its_buffer_so_each_regimes_copy_is_one_copy(tile):
    prepared = prepare(tile, torch.device("cpu"))
    real, pow2 = prepared.regimes["real"], prepared.regimes["pow2"]
    assert buffers(real) == buffers(pow2) and len(buffers(real)) == 1
    assert torch.equal(pow2.s_w, pow2_round(tile.s_w)) and torch.equal(real.s_w, tile.s_w)
    for t in (real, pow2):
        c = private_copy(t)
        assert len(buffers(c)) == 1
        assert_same_operands_elsewhere(c, t)


def test_packed_views_read_each_tensor_back_whatever_its_dtype_and_wherever_the_buffer_starts():
    from alibi.kernels.base import packed, packed_views

    tensors = {"f32": torch.randn(3, 5), "i8": torch.arange(7, dtype=torch.int8),
               "bf16": torch.randn(4).to(torch.bfloat16), "i64": torch.arange(6, dtype=torch.int64).reshape(2, 3)}
    buffer, views = packed(tensors, "cpu")
    inside = torch.zeros(buffer.numel() + 512, dtype=torch.uint8)
    inside[512:].copy_(buffer)  # the same bytes, 512 bytes into a larger buffer
    for found in (views, packed_views(inside[512:], tensors)):
        for k, v in tensors.items():
            assert found[k].dtype == v.dtype and found[k].is_contiguous() and torch.equal(found[k], v), k
