"""`alibi.conform.differences`: which output elements differ, with both bit patterns and values, capped with a count."""

from __future__ import annotations

import torch

from alibi.conform.differences import DIFFERENCE_CAP, SEARCH_BLOCK, Differences, differing_elements, first_differences
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


def test_each_unit_of_a_batch_lists_its_own_first_differences_across_search_blocks():
    """Units whose outputs span several search blocks, the last one partial: each lists exactly its first
    differing elements in row-major order (found as a list of positions here), whether it has none, fewer than the
    cap, or more, and wherever they fall among the blocks."""
    M, N = 7, 3 * SEARCH_BLOCK // 7 + 5  # M·N: three blocks and a part of a fourth
    gen = torch.Generator().manual_seed(4)
    a = torch.randn((4, M, N), generator=gen).to(torch.bfloat16)
    b = a.clone()
    chosen = [[], [5, 6, SEARCH_BLOCK - 1, SEARCH_BLOCK, M * N - 1],
              sorted(torch.randperm(M * N, generator=gen)[:200].tolist()), list(range(2 * SEARCH_BLOCK - 3, M * N, 29))]
    for u, flat in enumerate(chosen):
        b[u].view(-1)[flat] = b[u].view(-1)[flat] * 2 + 1
    c = compare_outputs(a, b)
    counts = [int(x) for x in c.differs.reshape(4, -1).sum(1)]
    assert counts == [len(flat) for flat in chosen] and counts[2] > DIFFERENCE_CAP and counts[3] > DIFFERENCE_CAP
    for u, d in enumerate(first_differences(a, b, c.differs, c.ulp, counts)):
        assert d.count == counts[u]
        assert [e.row * N + e.column for e in d.elements] == chosen[u][:DIFFERENCE_CAP]
        assert all(int(e.a_bits, 16) == int(a[u, e.row, e.column].view(torch.int16)) & 0xFFFF for e in d.elements)
