"""The runner's GPU attention core and RMSNorm (`alibi.model.invariant_triton`): one program per row.

On the CPU these run under the Triton interpreter on small shapes (it executes one program at a
time); on CUDA (`gpu` marker) the same propositions are checked on the compiled kernels at the
study's head shapes. Inputs are float32 where a result is compared with a float64 reference, so
no conversion the interpreter emulates differently from the GPU enters the comparison."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from alibi.kernels.triton_int8 import TRITON_IMPORT_ERROR
from alibi.model.invariant import causal_allowed

pytestmark = pytest.mark.skipif(TRITON_IMPORT_ERROR is not None, reason=f"{TRITON_IMPORT_ERROR}")

from alibi.model import invariant_triton  # noqa: E402  (after the skip: the module needs Triton)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Triton's own `tl.sum`/`tl.max` are interpreted only when TRITON_INTERPRET was set before triton was first
# imported; in a pytest process where another test imported triton earlier they are compiled functions an
# interpreted kernel cannot call. The propositions then run in a fresh process (the last test below).
IN_PROCESS = DEVICE == "cuda" or type(invariant_triton.tl.sum).__name__ == "InterpretedFunction"
in_process = pytest.mark.skipif(not IN_PROCESS, reason="triton was imported before TRITON_INTERPRET was set in this "
                                "process: these run in a fresh one (test_..._in_a_fresh_process)")


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({torch.float32: torch.int32, torch.bfloat16: torch.int16}[t.dtype])


def reference_attention(q, k, v, allowed, scaling):
    group = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(group, dim=1)
    v64 = v.double().repeat_interleave(group, dim=1)
    scores = (q.double() @ k64.transpose(-1, -2)) * scaling
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v64


@pytest.fixture(scope="module")
def qkv():
    """2 prompts, 2 query heads over 1 KV head (GQA), 68 positions (two key blocks of 64), head_dim 48
    (not a power of two: masked lanes)."""
    g = torch.Generator().manual_seed(7)
    b, hq, hkv, length, d = 2, 2, 1, invariant_triton.KEY_BLOCK + 4, 48
    q = torch.randn(b, hq, length, d, generator=g).to(DEVICE)
    k = torch.randn(b, hkv, length, d, generator=g).to(DEVICE)
    v = torch.randn(b, hkv, length, d, generator=g).to(DEVICE)
    prefill = invariant_triton.attention(q, k, v, causal_allowed(length, length, q.device), 0.125)
    return q, k, v, prefill


@in_process
def test_attention_matches_a_float64_softmax_within_float32_rounding(qkv):
    q, k, v, prefill = qkv
    length = q.shape[2]
    expected = reference_attention(q, k, v, causal_allowed(length, length, q.device), 0.125)
    assert prefill.dtype == torch.float32
    torch.testing.assert_close(prefill.double(), expected, rtol=2e-6, atol=2e-6)


@in_process
def test_a_decode_step_gives_the_bits_of_its_prefill_row_in_either_key_block(qkv):
    q, k, v, prefill = qkv
    for p in (5, q.shape[2] - 1):  # the first block, and the second block's last key
        step = invariant_triton.attention(q[:, :, p:p + 1], k[:, :, :p + 1], v[:, :, :p + 1],
                                          causal_allowed(1, p + 1, q.device), 0.125)
        assert torch.equal(bits(step), bits(prefill[:, :, p:p + 1])), p


@in_process
def test_a_chunk_after_a_cached_prefix_and_a_prompt_alone_give_the_bits_of_the_full_prefill(qkv):
    q, k, v, prefill = qkv
    length = q.shape[2]
    chunk = invariant_triton.attention(q[:, :, 60:], k, v, causal_allowed(length - 60, length, q.device), 0.125)
    assert torch.equal(bits(chunk), bits(prefill[:, :, 60:]))
    alone = invariant_triton.attention(q[1:, :, 60:], k[1:], v[1:], causal_allowed(length - 60, length, q.device), 0.125)
    assert torch.equal(bits(alone), bits(prefill[1:, :, 60:]))


@in_process
def test_keys_a_row_may_not_see_contribute_nothing_even_when_they_hold_nan(qkv):
    q, k, v, prefill = qkv
    p = 40
    k_bad, v_bad = k.clone(), v.clone()
    k_bad[:, :, p + 1:] = float("nan")
    v_bad[:, :, p + 1:] = float("nan")
    sees_up_to_p = (torch.arange(q.shape[2], device=q.device) <= p)[None, None, None, :]
    row = invariant_triton.attention(q[:, :, p:p + 1], k_bad, v_bad, sees_up_to_p, 0.125)
    assert torch.equal(bits(row), bits(prefill[:, :, p:p + 1]))


@in_process
def test_the_mask_free_causal_path_gives_the_bits_of_the_explicit_causal_mask_for_prefill_chunk_and_decode(qkv):
    q, k, v, prefill = qkv
    length = q.shape[2]
    assert torch.equal(bits(invariant_triton.attention(q, k, v, None, 0.125)), bits(prefill))
    chunk = invariant_triton.attention(q[:, :, 60:], k, v, None, 0.125)
    assert torch.equal(bits(chunk), bits(prefill[:, :, 60:]))
    step = invariant_triton.attention(q[:, :, 5:6], k[:, :, :6], v[:, :, :6], None, 0.125)
    assert torch.equal(bits(step), bits(prefill[:, :, 5:6]))
    # the output is laid out [B, S, H, D]: the caller's transpose to that layout copies nothing
    assert prefill.transpose(1, 2).is_contiguous()


@in_process
def test_rms_norm_matches_float64_and_a_token_alone_gives_its_bits_inside_a_batch():
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(3, 5, 200, generator=g) * 3).to(DEVICE)
    w = torch.randn(200, generator=g).to(DEVICE)
    out = invariant_triton.rms_norm(x, w, 1e-5)
    x64 = x.double()
    expected = w.double() * (x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + 1e-5))
    torch.testing.assert_close(out.double(), expected, rtol=3e-6, atol=1e-6)
    assert torch.equal(bits(invariant_triton.rms_norm(x[1:2, 2:3], w, 1e-5)), bits(out[1:2, 2:3]))


@in_process
def test_rms_norm_promotes_dtypes_as_torch_does_and_weights_after_the_cast():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.bfloat16, device=DEVICE)
    w32 = torch.full((4,), 0.5, device=DEVICE)
    out = invariant_triton.rms_norm(x, w32, 1e-6)
    assert out.dtype == torch.float32  # bf16 activations × fp32 weight, as `weight * hidden.to(bf16)` in torch
    assert invariant_triton.rms_norm(x, w32.bfloat16(), 1e-6).dtype == torch.bfloat16


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_at_the_studys_decode_shape_batch_64_and_batch_1_give_row_0_the_same_bits_repeat_exactly_with_or_without_a_mask():
    g = torch.Generator().manual_seed(0)
    b, hq, hkv, length, d = 64, 9, 3, 192, 64
    q = torch.randn(b, hq, 1, d, generator=g).cuda().bfloat16()
    k = torch.randn(b, hkv, length, d, generator=g).cuda().bfloat16()
    v = torch.randn(b, hkv, length, d, generator=g).cuda().bfloat16()
    first = {}
    for mask in (causal_allowed(1, length, q.device), None):
        runs = [invariant_triton.attention(q, k, v, mask, 0.125) for _ in range(20)]
        assert all(torch.equal(bits(r), bits(runs[0])) for r in runs)
        alone = invariant_triton.attention(q[:1], k[:1], v[:1], mask, 0.125)
        assert torch.equal(bits(alone), bits(runs[0][:1]))
        first[mask is None] = runs[0]
    assert torch.equal(bits(first[True]), bits(first[False]))  # the mask-free path gives the mask's bits


@pytest.mark.skipif(IN_PROCESS, reason="the propositions above ran in this process")
def test_the_interpreter_propositions_hold_in_a_fresh_process():
    test_file = Path(__file__).resolve()
    child = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
                           capture_output=True, text=True, cwd=test_file.parents[2], timeout=900,
                           env={**os.environ, "TRITON_INTERPRET": "1"})
    assert child.returncode == 0 and "7 passed" in child.stdout, child.stdout[-2000:]
