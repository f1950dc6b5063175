"""The zero padding the GPU kernels apply to awkward shapes is exact (checked on the CPU)."""

from __future__ import annotations

import pytest
import torch

from alibi.exact.emulator import exact_accumulator
from alibi.kernels.cublas import int_mm_padded
from alibi.kernels.cutlass import K_MULTIPLE, N_MULTIPLE, pad_operands, scale_vector


@pytest.mark.parametrize("M,N,K", [(1, 5, 7), (3, 1000, 1000), (16, 584, 1530), (5, 8, 16)])
def test_padding_k_and_n_leaves_the_accumulator_of_the_original_columns_unchanged(M, N, K):
    g = torch.Generator().manual_seed(M * N + K)
    a = torch.randint(-128, 128, (M, K), dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=g)
    s_w = torch.rand(N, generator=g) + 0.1
    bias = torch.randn(N, generator=g)
    ap, wp, s_wp, biasp, padding = pad_operands(a, w, s_w, bias)
    assert ap.shape[1] % K_MULTIPLE == 0 and wp.shape[0] % N_MULTIPLE == 0
    assert padding == {"pad_k": -K % K_MULTIPLE, "pad_n": -N % N_MULTIPLE}
    assert torch.equal(exact_accumulator(ap, wp)[:, :N], exact_accumulator(a, w))
    assert torch.equal(s_wp[:N], s_w) and bool((s_wp[N:] == 1).all())
    assert torch.equal(biasp[:N], bias) and bool((biasp[N:] == 0).all())


def test_fp8_operands_are_padded_with_positive_zeros():
    a = torch.randn(3, 10).to(torch.float8_e4m3fn)
    w = torch.randn(5, 10).to(torch.float8_e4m3fn)
    ap, wp, _, _, _ = pad_operands(a, w, None, None)
    assert ap.dtype == torch.float8_e4m3fn and ap.shape == (3, 16) and wp.shape == (8, 16)
    assert bool((ap[:, 10:].view(torch.uint8) == 0).all()) and bool((wp[5:].view(torch.uint8) == 0).all())
    assert torch.equal(ap[:, :10].view(torch.uint8), a.view(torch.uint8))


@pytest.mark.parametrize("M,N,K", [(1, 5, 7), (16, 8, 16), (17, 1001, 1001)])
def test_int_mm_padding_for_small_m_and_odd_k_n_is_exact(M, N, K):
    """torch._int_mm (here its CPU path) with rows padded to 17 and K, N to multiples of 8."""
    g = torch.Generator().manual_seed(K)
    a = torch.randint(-128, 128, (M, K), dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=g)
    acc, padding = int_mm_padded(a, w)
    assert acc.shape == (M, N) and torch.equal(acc.to(torch.int64), exact_accumulator(a, w))
    assert padding["pad_m"] == max(0, 17 - M)


def test_a_per_tensor_scale_is_broadcast_and_a_wrong_length_is_refused():
    from alibi.errors import InputError

    s = torch.tensor([0.5])
    assert torch.equal(scale_vector(s, 4, "s_a"), torch.full((4,), 0.5))
    with pytest.raises(InputError, match="s_w must be a float32 vector of length 4"):
        scale_vector(torch.ones(3), 4, "s_w")
