"""The runner's batch-invariant attention core and RMSNorm on the GPU: one Triton program per row.

`alibi.model.invariant` states the specification (a token's bits depend on its own row alone: not
on the batch, the neighbours, chunking, prefill against decode, or the cache) and meets it on the
CPU with chains of elementwise torch operations. On the GPU that chain costs about 1 ms per
attention call against cuDNN's 28 µs (`analysis/results/h200/determinism`), so the same
specification is met here by kernels whose reduction order is fixed by construction:

- **one program per row.** The attention program owns one (batch row, query head, query position);
  the RMSNorm program owns one token. No program reads another row, and no launch parameter that
  changes the arithmetic depends on the batch or the sequence length (block sizes are constants of
  the head dimension and hidden size alone).
- **keys in fixed blocks from position 0.** Key position j is at index j in every execution (the
  cache holds positions 0 … L−1), and a row visits keys in blocks of `KEY_BLOCK` starting at 0 and
  stopping after the block that holds its last allowed key. A prefill row at position p, the same
  position in a chunk, and a decode step at p therefore run the same blocks over the same values.
  Keys a row may not see inside its last block (the causal future within a prefill, or past the end
  of the cache at decode) are replaced by 0 before any arithmetic, so they contribute exactly +0
  whatever bits sit there.
- **two passes, no rescaling.** Pass 1 finds the row's maximum score (exact, order-free); pass 2
  sums exp(score − max) per lane and the weighted values per block, in block order; the lane sums
  are reduced once at the end. Scores are recomputed in pass 2 by the same instructions, so they
  are the same bits.

The exponential and the square root are the GPU's (one device function per element). The bits
differ from the CPU implementation's (another order, another exp); the promise is invariance on one
device, not equality across devices. On the CPU these kernels run only under the Triton interpreter,
in the tests.
"""

from __future__ import annotations

import torch

from alibi.kernels.triton_int8 import TRITON_IMPORT_ERROR, tl, triton

KEY_BLOCK = 64
"""Keys per block of the attention program: a constant, so a row's block boundaries never move."""


@triton.jit
def _attention_row_kernel(q_ptr, k_ptr, v_ptr, out_ptr, allowed_ptr, hi_ptr,
                          sq_b, sq_h, sq_s, sk_b, sk_h, sk_l, sv_b, sv_h, sv_l, so_b, so_h, so_s,
                          sa_b, sa_s, sh_b, sh_s, group, head_dim, scaling, first_query,
                          CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    s = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    kv = h // group
    d = tl.arange(0, BLOCK_D)
    in_head = d < head_dim
    q = tl.load(q_ptr + b * sq_b + h * sq_h + s * sq_s + d, mask=in_head, other=0.0).to(tl.float32)
    if CAUSAL:  # query row s is position first_query + s and sees keys 0 … that position
        hi = first_query + s + 1
    else:
        hi = tl.load(hi_ptr + b * sh_b + s * sh_s)
    lanes = tl.arange(0, BLOCK_N)
    k_row = k_ptr + b * sk_b + kv * sk_h
    v_row = v_ptr + b * sv_b + kv * sv_h
    a_row = allowed_ptr + b * sa_b + s * sa_s

    lane_max = tl.full([BLOCK_N], float("-inf"), tl.float32)
    for start in range(0, hi, BLOCK_N):
        keys = start + lanes
        if CAUSAL:
            ok = keys < hi
        else:
            ok = tl.load(a_row + keys, mask=keys < hi, other=0) != 0
        k = tl.load(k_row + keys[:, None] * sk_l + d[None, :], mask=ok[:, None] & in_head[None, :], other=0.0)
        score = tl.sum(q[None, :] * k.to(tl.float32), axis=1) * scaling
        lane_max = tl.maximum(lane_max, tl.where(ok, score, float("-inf")))
    row_max = tl.max(lane_max, axis=0)

    lane_total = tl.full([BLOCK_N], 0.0, tl.float32)
    acc = tl.full([BLOCK_D], 0.0, tl.float32)
    for start in range(0, hi, BLOCK_N):
        keys = start + lanes
        if CAUSAL:
            ok = keys < hi
        else:
            ok = tl.load(a_row + keys, mask=keys < hi, other=0) != 0
        k = tl.load(k_row + keys[:, None] * sk_l + d[None, :], mask=ok[:, None] & in_head[None, :], other=0.0)
        score = tl.sum(q[None, :] * k.to(tl.float32), axis=1) * scaling
        weight = tl.where(ok, tl.exp(score - row_max), 0.0)
        lane_total += weight
        v = tl.load(v_row + keys[:, None] * sv_l + d[None, :], mask=ok[:, None] & in_head[None, :], other=0.0)
        acc += tl.sum(weight[:, None] * v.to(tl.float32), axis=0)
    out = acc / tl.sum(lane_total, axis=0)
    tl.store(out_ptr + b * so_b + h * so_h + s * so_s + d, out.to(out_ptr.dtype.element_ty), mask=in_head)


@triton.jit
def _rms_norm_row_kernel(x_ptr, w_ptr, out_ptr, sx, so, hidden, eps, BLOCK_H: tl.constexpr):
    row = tl.program_id(0)
    i = tl.arange(0, BLOCK_H)
    inside = i < hidden
    x = tl.load(x_ptr + row * sx + i, mask=inside, other=0.0).to(tl.float32)
    variance = tl.sum(x * x, axis=0) / hidden
    normed = (x / tl.sqrt_rn(variance + eps)).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + i, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * so + i, (w * normed).to(out_ptr.dtype.element_ty), mask=inside)


def _require_triton() -> None:
    if TRITON_IMPORT_ERROR is not None:
        raise RuntimeError(f"the deterministic runner's GPU path needs Triton: {TRITON_IMPORT_ERROR}")


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor | None,
              scaling: float) -> torch.Tensor:
    """`alibi.model.invariant.attention`'s contract (shapes, GQA, mask, dtype), one program per row.

    With `allowed` None (the causal mask aligned to the last query) the rows' limits are computed in
    the program and no mask is read: the same blocks, the same keys, the same bits as the explicit
    `causal_allowed` mask, without the mask's launches. The output is a [B, Hq, S, D] view of a
    [B, S, Hq, D] tensor, the layout the o-projection reads, so the caller's transpose copies nothing."""
    _require_triton()
    b, hq, s, d = query.shape
    hkv, length = key.shape[1], key.shape[2]
    q = query if query.stride(-1) == 1 else query.contiguous()
    k = key if key.stride(-1) == 1 else key.contiguous()
    v = value if value.stride(-1) == 1 else value.contiguous()
    out = torch.empty(b, s, hq, d, dtype=query.dtype, device=query.device).transpose(1, 2)
    if allowed is None:
        allowed_rows = hi = q  # not read: the kernel's CAUSAL branch takes neither pointer
        mask_strides = (0, 0, 0, 0)
    else:
        if allowed.shape[1] != 1:
            raise ValueError(f"attention mask with {allowed.shape[1]} heads: the runner's masks are per row, [B|1, 1, S, L]")
        allowed = allowed[:, 0, :, :length].expand(allowed.shape[0], s, length)
        if allowed.stride(-1) != 1:
            allowed = allowed.contiguous()
        # one past each row's last allowed key: the row stops after the block that holds it
        hi = (allowed * torch.arange(1, length + 1, device=allowed.device, dtype=torch.int32)).amax(-1).to(torch.int32)
        allowed_rows = allowed.view(torch.uint8)
        batch_stride = (lambda t: t.stride(0) if t.shape[0] > 1 else 0)
        mask_strides = (batch_stride(allowed), allowed.stride(1), batch_stride(hi), hi.stride(1))
    _attention_row_kernel[(s, hq, b)](
        q, k, v, out, allowed_rows, hi,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        *mask_strides, hq // hkv, d, float(scaling), length - s,
        CAUSAL=allowed is None, BLOCK_N=KEY_BLOCK, BLOCK_D=triton.next_power_of_2(d))
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`alibi.model.invariant.rms_norm`'s contract (Llama's RMSNorm, dtype promotion as torch's), one program per token."""
    _require_triton()
    hidden = x.shape[-1]
    rows = x.reshape(-1, hidden)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if rows.shape[0]:
        _rms_norm_row_kernel[(rows.shape[0],)](rows, weight.contiguous(), out, rows.stride(0), out.stride(0), hidden,
                                               float(eps), BLOCK_H=triton.next_power_of_2(hidden))
    return out.reshape(*x.shape[:-1], hidden)


__all__ = ["KEY_BLOCK", "attention", "rms_norm"]
