"""The model of Triton's fp32 division on sm_90 (`alibi.exact.triton_division`) against the GPU's own quotients
(tests/fixtures/triton-division: 8,192 pairs recorded on an H100 with the table, alibi/exact/data/README.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from alibi.errors import InputError
from alibi.exact.triton_division import triton_divide, triton_reciprocal

PAIRS = Path(__file__).parent.parent / "fixtures" / "triton-division" / "pairs-h100.npz"


def recorded() -> dict[str, torch.Tensor]:
    with np.load(PAIRS) as d:
        return {k: torch.from_numpy(d[k]) for k in ("x", "y", "quotient", "reciprocal")}


def test_the_model_reproduces_every_recorded_gpu_quotient_and_reciprocal_bit_for_bit():
    r = recorded()
    assert bool((triton_reciprocal(r["y"]).view(torch.int32) == r["reciprocal"].view(torch.int32)).all())
    assert bool((triton_divide(r["x"], r["y"]).view(torch.int32) == r["quotient"].view(torch.int32)).all())


def test_the_recorded_quotients_are_not_all_correctly_rounded_so_the_comparison_can_fail():
    r = recorded()
    ieee = (r["x"] / r["y"]).view(torch.int32) != r["quotient"].view(torch.int32)
    assert int(ieee.sum()) > 1000


def test_the_reciprocal_of_a_power_of_two_is_exact_and_the_sign_follows_the_divisor():
    y = torch.tensor([1.0, 2.0, 0.25, -4.0, 2.0**-60])
    assert triton_reciprocal(y).tolist() == [1.0, 0.5, 4.0, -0.25, 2.0**60]


@pytest.mark.parametrize("bad", [0.0, float("inf"), float("nan"), 2.0**-120, 2.0**110])
def test_a_divisor_outside_the_measured_range_is_refused(bad):
    with pytest.raises(InputError, match="Triton's division is modelled"):
        triton_reciprocal(torch.tensor([1.0, bad]))
