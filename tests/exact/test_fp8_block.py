"""Block-scaled fp8, the format (alibi/exact/fp8_block.py): the quantisers against blocks worked by hand, and the
layout's shapes and text."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from alibi.errors import InputError
from alibi.exact.fp8_block import GROUP_EPS, BlockLayout, quantize_fp8_blocks, quantize_fp8_groups

f32 = np.float32


def fp8_values(q: torch.Tensor) -> list[list[float]]:
    return q.to(torch.float32).tolist()


def test_activation_groups_match_hand_worked_scales_including_a_ragged_group_and_an_all_zero_row():
    # K = 130: one full group of 128 and a ragged group of 2. Row 0: amax 896 → s = 896/448 = 2 exactly; the
    # ragged group's amax is 3 → s = RN32(3/448), and 3/s, -1.5/s round (fp32, then e4m3) to 448 and -224.
    # Row 1 is all zero: amax is clamped to eps = fp32(1e-10), so s = RN32(eps/448) and every byte is +0.
    x = torch.zeros(2, 130)
    x[0, :3] = torch.tensor([896.0, -224.0, 1.0])
    x[0, 128:] = torch.tensor([3.0, -1.5])
    q, s = quantize_fp8_groups(x.to(torch.bfloat16))
    assert s.dtype == torch.float32 and list(s.shape) == [2, 2]
    assert s[0].tolist() == [2.0, float(f32(3) / f32(448))]
    zero_scale = float(f32(GROUP_EPS) / f32(448))
    assert s[1].tolist() == [zero_scale, zero_scale] and zero_scale > 0
    assert fp8_values(q)[0][:3] == [448.0, -112.0, 0.5] and fp8_values(q)[0][128:] == [448.0, -224.0]
    assert not q[1].view(torch.uint8).any()


def test_a_group_value_is_divided_by_its_scale_not_multiplied_by_a_reciprocal():
    # amax 1.37 (fp32) → s = RN32(1.37/448). -1.0275/s = -336.00003 (fp32) rounds to the e4m3 value -352, while
    # -1.0275·RN32(1/s) = -336 exactly, an e4m3 tie that goes to the even -320: vLLM divides (`y / y_s`).
    x = torch.tensor([[f32(1.37), f32(-1.0275)]])
    q, s = quantize_fp8_groups(x, block_k=2)
    assert s.item() == float(f32(1.37) / f32(448))
    assert fp8_values(q)[0] == [448.0, -352.0]


def test_weight_blocks_match_hand_worked_scales_with_ragged_rows_and_columns_and_a_zero_block():
    # 2×2 blocks over a 3×3 weight: block (0,0) rows 0-1 cols 0-1 has amax 8 → s = RN32(8/448); (0,1) = col 2 of
    # rows 0-1, amax 1 → RN32(1/448); (1,0) = row 2 cols 0-1, amax 0.5 → RN32(0.5/448); (1,1) is zero → RN32(eps/448).
    w = torch.tensor([[4.0, -8.0, 1.0], [2.0, 1.0, 0.0], [0.5, -0.25, 0.0]])
    q, s = quantize_fp8_blocks(w, BlockLayout(2, 2))
    want = [[f32(8) / f32(448), f32(1) / f32(448)], [f32(0.5) / f32(448), f32(GROUP_EPS) / f32(448)]]
    assert s.tolist() == [[float(v) for v in row] for row in want]
    assert fp8_values(q) == [[224.0, -448.0, 448.0], [112.0, 56.0, 0.0], [448.0, -224.0, 0.0]]


def test_the_checkpoint_layout_gives_weight_scale_inv_its_ceil_shapes():
    layout = BlockLayout()
    assert layout.a_scale_shape(16, 576) == (16, 5) and layout.w_scale_shape(192, 576) == (2, 5)
    assert BlockLayout.parse(layout.text) == layout and layout.text == "block:1x128:128x128"
    cols = layout.column_scales(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), 130)
    assert cols.shape == (130, 2) and cols[127].tolist() == [1.0, 2.0] and cols[128].tolist() == [3.0, 4.0]


@pytest.mark.parametrize("text", ["block:1x128:128x64", "block:128x128", "rows"])
def test_a_malformed_layout_is_refused_naming_the_form(text):
    with pytest.raises(InputError, match="block:1x<k>:<n>x<k>"):
        BlockLayout.parse(text)
