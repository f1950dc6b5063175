"""The sweep's arms: the fp8-sequential reference kernel, kernel resolution and the format checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from alibi.errors import InputError
from alibi.exact.emulator import EpilogueModel
from alibi.sweep.arms import (
    SequentialFp8Kernel,
    home_device,
    resolve_kernel,
    resolve_pair,
)


def _e4m3(shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(torch.float8_e4m3fn)


def test_fp8_sequential_accumulator_adds_in_k_order_with_one_fp32_rounding_per_term():
    """Against an independent scalar implementation: numpy float32 arithmetic, term by term."""
    a, w = _e4m3((3, 300), 0), _e4m3((4, 300), 1)
    acc = resolve_kernel("fp8-sequential:w_then_a").accumulator(a, w)
    an, wn = a.to(torch.float32).numpy(), w.to(torch.float32).numpy()
    for m in range(3):
        for n in range(4):
            s = np.float32(0.0)
            for k in range(300):
                s = np.float32(s + np.float32(an[m, k] * wn[n, k]))
            assert acc[m, n].view(torch.int32).item() == np.array(s).view(np.int32).item()


def test_fp8_sequential_accumulator_is_exact_when_every_partial_sum_is():
    """Half-integers of magnitude ≤ 8: products are multiples of 1/4 of magnitude ≤ 64, so every partial
    sum of 512 of them is a multiple of 1/4 below 2¹⁵ — at most 2¹⁷ quarters, exact in fp32 (2²⁴)."""
    g = torch.Generator().manual_seed(2)
    a = (torch.randint(-16, 17, (8, 512), generator=g) / 2).to(torch.float8_e4m3fn)
    w = (torch.randint(-16, 17, (8, 512), generator=g) / 2).to(torch.float8_e4m3fn)
    acc = SequentialFp8Kernel(EpilogueModel("a_then_w")).accumulator(a, w)
    assert torch.equal(acc.double(), a.double() @ w.double().T)


def test_fp8_sequential_order_is_not_the_correctly_rounded_sum():
    """Its rounding is real: at K = 4096 some accumulators differ from RN32(exact sum)."""
    a, w = _e4m3((16, 4096), 3), _e4m3((16, 4096), 4)
    acc = resolve_kernel("fp8-sequential:a_then_w").accumulator(a, w)
    assert int((acc != (a.double() @ w.double().T).float()).sum()) > 0


def test_fp8_sequential_name_round_trips_and_unknown_orders_are_refused():
    k = resolve_kernel("fp8-sequential:a_then_w+add_after_cast")
    assert k.name == "fp8-sequential:a_then_w+add_after_cast" and k.epilogue.bias == "add_after_cast"
    with pytest.raises(InputError, match="unknown kernel 'fp8-sequential:sideways'"):
        resolve_kernel("fp8-sequential:sideways")


@pytest.mark.parametrize("name, fmt", [("emulator:w_then_a", "fp8_e4m3"), ("fp8-sequential:a_then_w", "int8"),
                                       ("torch-cpu", "fp8_e4m3")])
def test_a_kernel_that_does_not_handle_the_format_is_refused(name, fmt):
    with pytest.raises(InputError, match=f"--kernel-a '{name}' handles .* not {fmt}"):
        resolve_pair(name, name, fmt, tensorwise_ok=True)


def test_home_device_is_the_cpu_for_cpu_kernels():
    arms = resolve_pair("torch-cpu", "emulator:a_then_w", "int8", tensorwise_ok=True)
    assert home_device(arms, "auto").type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="--device cuda"):
            home_device(arms, "cuda")
