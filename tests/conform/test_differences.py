"""`alibi.conform.differences`: which output elements differ, with both bit patterns and values, capped with a count."""

from __future__ import annotations

import torch

from alibi.conform.differences import DIFFERENCE_CAP, Differences, differing_elements
from alibi.exact.numerics import compare_outputs


def _bf16(bits: list[list[int]]) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.int16).view(torch.bfloat16)


def test_each_differing_element_is_listed_with_its_position_bits_values_and_ulp():
    a = _bf16([[0x3F80, 0x4000, 0x0000], [0x3F80, 0x3F80, 0x4040]])   # 1, 2, +0 / 1, 1, 3
    b = _bf16([[0x3F80, 0x4001, 0x0000], [0x3F81, 0x3F80, 0x4040]])   # 1, 2+ulp, +0 / 1+ulp, 1, 3
    d = differing_elements(a, b, compare_outputs(a, b))
    assert d.count == 2 and not d.truncated
    assert [(e.row, e.column, e.a_bits, e.b_bits, e.a, e.b, e.ulp) for e in d.elements] == [
        (0, 1, "0x4000", "0x4001", 2.0, 2.015625, 1),
        (1, 0, "0x3f80", "0x3f81", 1.0, 1.0078125, 1),
    ]


def test_signed_zeros_differ_and_non_finite_values_are_named_without_an_ulp_distance():
    a = _bf16([[0x0000, 0x7F80, 0x7FC0]])   # +0, +inf, nan
    b = _bf16([[-0x8000, -0x0080, 0x7FC1]])  # -0, -inf, nan with another payload
    d = differing_elements(a, b, compare_outputs(a, b))
    assert [(e.a_bits, e.b_bits) for e in d.elements] == [("0x0000", "0x8000"), ("0x7f80", "0xff80"),
                                                           ("0x7fc0", "0x7fc1")]
    assert [e.ulp for e in d.elements] == [0, None, None]  # ±0 are the same point of the ulp scale
    assert (d.elements[1].a, d.elements[1].b, d.elements[2].a) == ("inf", "-inf", "nan")
    d.to_json()  # the report's JSON writer refuses NaN literals


def test_the_list_stops_at_the_cap_in_row_major_order_while_the_count_stays_complete():
    a = torch.zeros((4, 50), dtype=torch.bfloat16)
    b = a.clone()
    changed = [(r, c) for r in range(4) for c in range(0, 50, 5)]  # 40 elements
    for r, c in changed:
        b[r, c] = 1.0
    d = differing_elements(a, b, compare_outputs(a, b))
    assert d.count == 40 and d.cap == DIFFERENCE_CAP and len(d.elements) == DIFFERENCE_CAP and d.truncated
    assert [(e.row, e.column) for e in d.elements] == changed[:DIFFERENCE_CAP]
    assert len(differing_elements(a, b, compare_outputs(a, b), cap=3).elements) == 3


def test_fp16_outputs_are_reported_in_their_own_bits():
    a = torch.tensor([[1.0, 65504.0]], dtype=torch.float16)
    b = torch.tensor([[1.0, 65472.0]], dtype=torch.float16)
    (e,) = differing_elements(a, b, compare_outputs(a, b)).elements
    assert (e.row, e.column, e.a_bits, e.b_bits, e.a, e.b, e.ulp) == (0, 1, "0x7bff", "0x7bfe", 65504.0, 65472.0, 1)


def test_differences_survive_a_json_round_trip_unchanged():
    a = _bf16([[0x3F80, 0x7F80]])
    b = _bf16([[0x3F81, 0x7F80]])
    d = differing_elements(a, b, compare_outputs(a, b))
    assert Differences.from_json(d.to_json()) == d
    assert d.to_dict()["schema"] == "alibi.differences/v1"


def test_equal_outputs_have_no_differences():
    a = torch.randn((8, 8)).to(torch.bfloat16)
    d = differing_elements(a, a.clone(), compare_outputs(a, a.clone()))
    assert d.count == 0 and d.elements == ()
