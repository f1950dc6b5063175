"""The deterministic attention core with a padded, non-causal mask (issue 36, item 6).

The runner feeds `alibi.model.invariant.attention` causal masks, but the function takes any boolean mask per batch
row, head and query: a batch of prompts of different lengths is padded, and padding is masked. Its result is held
to a float64 softmax built here from plain torch operations (neither `causal_allowed` nor the fixed-order sums of
the code under test), and padded keys must not touch a bit of it, even when they hold NaN.
"""

from __future__ import annotations

import torch

from alibi.exact.numerics import bits
from alibi.model.invariant import attention

# fp32 arithmetic over at most 12 keys of 16 dimensions, against float64: a few fp32 ulps of outputs of size ~1.
FP32_TOLERANCE = 1e-5
B, HQ, HKV, S, L, D = 3, 4, 2, 5, 12, 16
PAD_LEFT = (0, 4, 2)  # batch row b: its first PAD_LEFT[b] keys are padding
PAD_RIGHT = (0, 0, 3)  # and its last PAD_RIGHT[b]


def padded_mask() -> torch.Tensor:
    """bool [B, 1, S, L]: each row attends to every real key of its prompt (bidirectional, not causal), minus a
    few holes that differ by query, so that no two query rows see the same keys."""
    allowed = torch.zeros(B, 1, S, L, dtype=torch.bool)
    for b in range(B):
        real = list(range(PAD_LEFT[b], L - PAD_RIGHT[b]))
        for s in range(S):
            allowed[b, 0, s, real] = True
            allowed[b, 0, s, real[s % len(real)]] = False  # a hole; every row keeps other real keys
    return allowed


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q·kᵀ·scale over the allowed keys)·v in float64, key/value head h // (HQ/HKV) for query head h."""
    group = HQ // HKV
    kr, vr = k.double().repeat_interleave(group, dim=1), v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("bhsd,bhld->bhsl", q.double(), kr) * scale
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return torch.einsum("bhsl,bhld->bhsd", weights, vr)


def operands(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, HQ, S, D, generator=g), torch.randn(B, HKV, L, D, generator=g), \
        torch.randn(B, HKV, L, D, generator=g)


def test_attention_with_a_padded_non_causal_mask_agrees_with_a_float64_softmax_over_the_allowed_keys():
    q, k, v = operands()
    allowed = padded_mask()
    got = attention(q, k, v, allowed, 0.25)
    want = reference(q, k, v, allowed, 0.25)
    assert got.shape == (B, HQ, S, D) and got.dtype == torch.float32
    assert (got.double() - want).abs().max().item() < FP32_TOLERANCE


def test_padded_keys_do_not_change_a_bit_of_the_result_even_when_they_hold_nan():
    q, k, v = operands()
    allowed = padded_mask()
    got = attention(q, k, v, allowed, 0.25)
    k2, v2 = k.clone(), v.clone()
    for b in range(B):
        for pad in [*range(PAD_LEFT[b]), *range(L - PAD_RIGHT[b], L)]:
            k2[b, :, pad], v2[b, :, pad] = float("nan"), float("nan")
    again = attention(q, k2, v2, allowed, 0.25)
    assert torch.equal(bits(again), bits(got))


def test_each_batch_row_is_masked_by_its_own_mask():
    """The same prompt at two batch rows with other padding: the rows' results are those each mask gives alone."""
    q, k, v = operands()
    allowed = padded_mask()
    together = attention(q, k, v, allowed, 0.25)
    for b in range(B):
        alone = attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], allowed[b:b + 1], 0.25)
        assert torch.equal(bits(alone), bits(together[b:b + 1]))
    assert not torch.equal(bits(together[1]), bits(attention(q, k, v, allowed[:1], 0.25)[1]))  # masks matter
