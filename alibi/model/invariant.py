"""Batch-invariant arithmetic for the model runner: every output row depends on its own inputs alone.

The specification the deterministic runner meets: under a fixed model, kernel and device, the same
token at the same position gets bitwise-identical logits whatever else runs — another batch size,
other prompts beside it, the prompt fed in one prefill or in chunks, decoded one token at a time
against the KV cache, or recomputed without a cache. A library kernel does not promise this: it
picks its algorithm (split-K, split-KV, the reduction tree of a norm) from the shapes it is given,
and a different shape is a different order of floating-point additions. Measured on the H200
(torch 2.11): `scaled_dot_product_attention` at decode gives different bits from one run to the next
and between batch 1 and batch 64, and RMSNorm and the attention core differ between prefill and
decode. So the runner computes the three places where a row meets a reduction in a way whose
order cannot depend on any shape but the row's own:

- **Sums are one fixed tree** (`tree_sum`): the axis is padded to a power of two with −0.0 and
  halved by elementwise adds (`x[:n/2] + x[n/2:]`). An elementwise add is one IEEE operation per
  element on every device, whatever the tensor's size, so the tree's result depends only on the
  values. −0.0 is the exact additive identity (x + −0 = x for every x, −0 included), so padding
  further changes nothing: a row of length t+1 padded to 2^a and the same row inside a masked row
  of length 2^b > 2^a reduce to the same bits (each halving past 2^a adds only −0 to the first half).
- **Attention** (`attention`) is softmax(q·kᵀ·scale + mask)·v with the dot products over the head
  dimension, the softmax denominator and the weighted sum over keys each such a tree, the max
  exact, and masked keys contributing −0.0. Key position j sits at index j in every execution
  (the cache holds positions 0 … L−1), so prefill, chunked prefill and decode sum the same values
  in the same tree. The exponential: on CUDA `torch.exp` applies one device function to every
  element; on the CPU torch's vectorized and scalar paths may use different exp implementations
  for the tail of a buffer, so `exp` there is built from correctly rounded adds and multiplies.
- **Dense Linears** (`RowBlockLinear`, e.g. an untied or tied `lm_head`): a GEMM computes each
  output element from its own row and column, so a row's bits can change only when the library
  picks another algorithm for another shape. Every call therefore runs on blocks of exactly
  `ROW_BLOCK` rows for the device (zero-padded, in a fresh buffer): one shape, one algorithm, for every batch.
- **RMSNorm** (`rms_norm`): the mean of squares is a `tree_sum`; the rest is elementwise.

On the GPU the attention core and RMSNorm run as Triton kernels with one program per row
(`alibi.model.invariant_triton`): the same specification, met by a fixed order of their own at a
fraction of the cost of the elementwise chains (`IMPLEMENTATION` names which one ran). The dense
Linears use row blocks on both.

The quantized Linears are the kernel's business: an int8 kernel with an exact accumulator and an
elementwise epilogue is M-invariant, and `alibi variations` names a kernel that is not.
"""

from __future__ import annotations

import torch

ROW_BLOCK = {"cuda": 64, "cpu": 8}
"""Rows per GEMM call of `RowBlockLinear`, by device type: on the GPU a decode step of a 64-prompt
batch is one block and a smaller one costs the same time; on the CPU the padding rows cost
arithmetic, so blocks are short. Any fixed size is invariant; it is recorded in the execution mode."""


def row_block(device: torch.device) -> int:
    return ROW_BLOCK.get(device.type, ROW_BLOCK["cpu"])


IMPLEMENTATION = {"cuda": "triton-rows", "cpu": "tree"}
"""How the attention core and RMSNorm meet the specification, by device type: one Triton program per
row on the GPU, `tree_sum` chains elsewhere. Recorded in the execution mode: two implementations are
two orders, so two arms must use the same one."""


def implementation(device: torch.device) -> str:
    return IMPLEMENTATION.get(device.type, IMPLEMENTATION["cpu"])

_QUERY_BLOCK_ELEMENTS = 1 << 26
"""Query rows are processed in groups whose [rows, keys, head_dim] fp32 products stay below this."""


def tree_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over `dim` (kept, size 1) by one pairwise tree over the axis padded to a power of two
    with −0.0: the result depends on the values alone, not on the axis' length beyond its last
    nonzero element, the device's reduction heuristics or the rest of the tensor (module docstring)."""
    dim = dim % x.dim()
    n = x.shape[dim]
    width = 1 << max(n - 1, 0).bit_length()
    if width > n:
        pad = list(x.shape)
        pad[dim] = width - n
        x = torch.cat([x, torch.full(pad, -0.0, dtype=x.dtype, device=x.device)], dim=dim)
    while width > 1:
        width //= 2
        x = x.narrow(dim, 0, width) + x.narrow(dim, width, width)
    return x


# exp(x) for x ≤ 0 from correctly rounded float32 operations (used on the CPU, see the module
# docstring): x = n·ln2 + r with |r| ≤ ln2/2 (Cody–Waite, ln2 split so n·LN2_HI is exact), then
# e^r by a degree-7 Taylor polynomial in Horner form (truncation below 2^-27 relative on that
# interval; with the roundings of the steps, measured at most 1.21 ulp from e^x over [-87, 0]),
# then scaled by 2^n built from its bit pattern. Each step is a separate elementwise operation, so
# no compiler can contract or reorder it.
_LN2_HI, _LN2_LO = 0.693145751953125, 1.4286068203094172e-06
_EXP_TAYLOR = (1 / 5040, 1 / 720, 1 / 120, 1 / 24, 1 / 6, 1 / 2, 1.0, 1.0)
_EXP_MIN = -87.0  # below this e^x is under float32's smallest normal: the result is 0


def exp_nonpositive(x: torch.Tensor) -> torch.Tensor:
    """e^x for float32 x ≤ 0 (−inf → 0), identical bits for identical inputs on any tensor shape."""
    if x.device.type == "cuda":
        return torch.exp(x)
    n = torch.floor(x * 1.4426950408889634 + 0.5)
    r = (x - n * _LN2_HI) - n * _LN2_LO
    p = torch.full_like(r, _EXP_TAYLOR[0])
    for c in _EXP_TAYLOR[1:]:
        p = p * r + c
    finite = x >= _EXP_MIN
    scale = ((torch.where(finite, n, 0.0).to(torch.int32) + 127) << 23).view(torch.float32)
    return torch.where(finite, p * scale, 0.0)


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor | None,
              scaling: float) -> torch.Tensor:
    """softmax(q·kᵀ·scaling, keys where `allowed`)·v, every reduction a `tree_sum`.

    query [B, Hq, S, D]; key, value [B, Hkv, L, D] with Hq a multiple of Hkv (query head h reads
    key/value head h // (Hq/Hkv), as transformers' `repeat_kv`); allowed: bool, broadcastable to
    [B, Hq, S, L], or None for `causal_allowed(S, L)`; every query row must allow at least one key.
    Returns [B, Hq, S, D] in the query's dtype; the arithmetic is float32. On CUDA:
    `alibi.model.invariant_triton.attention`.
    """
    if implementation(query.device) == "triton-rows":
        from alibi.model import invariant_triton  # Triton is imported only where it runs

        return invariant_triton.attention(query, key, value, allowed, scaling)
    b, hq, s, d = query.shape
    hkv, length = key.shape[1], key.shape[2]
    if allowed is None:
        allowed = causal_allowed(s, length, query.device)
    group = hq // hkv
    k = key.float()[:, :, None].expand(b, hkv, group, length, d).reshape(b, hq, length, d)
    v = value.float()[:, :, None].expand(b, hkv, group, length, d).reshape(b, hq, length, d)
    allowed = allowed.expand(b, hq, s, length)
    step = max(1, _QUERY_BLOCK_ELEMENTS // max(1, b * hq * length * d))
    out = []
    for i in range(0, s, step):
        q = query[:, :, i:i + step].float()
        ok = allowed[:, :, i:i + step]
        scores = tree_sum(q[:, :, :, None, :] * k[:, :, None], dim=-1)[..., 0] * scaling
        scores = torch.where(ok, scores, float("-inf"))
        weights = exp_nonpositive(scores - scores.amax(dim=-1, keepdim=True))
        weights = torch.where(ok, weights, -0.0)
        total = tree_sum(weights, dim=-1)
        terms = torch.where(ok[..., None], weights[..., None] * v[:, :, None], -0.0)
        out.append(tree_sum(terms, dim=-2)[..., 0, :] / total)
    return torch.cat(out, dim=2).to(query.dtype)


def causal_allowed(queries: int, keys: int, device: torch.device) -> torch.Tensor:
    """bool [1, 1, queries, keys]: the query rows are the last `queries` positions of `keys` (a prefill,
    a chunk after a cached prefix, or one decode step), each attending to itself and what precedes it."""
    q_pos = torch.arange(keys - queries, keys, device=device)[:, None]
    return (torch.arange(keys, device=device)[None, :] <= q_pos)[None, None]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm (`weight · (x / sqrt(mean(x²) + eps))` in float32, cast back before the weight)
    with the mean of squares as a `tree_sum` over the last axis. On CUDA: `alibi.model.invariant_triton.rms_norm`."""
    if implementation(x.device) == "triton-rows":
        from alibi.model import invariant_triton  # Triton is imported only where it runs

        return invariant_triton.rms_norm(x, weight, eps)
    h = x.float()
    variance = tree_sum(h * h, dim=-1) / h.shape[-1]
    return weight * (h * torch.rsqrt(variance + eps)).to(x.dtype)


class RowBlockLinear(torch.nn.Module):
    """A dense Linear whose GEMM always runs on `ROW_BLOCK`-row blocks (module docstring).

    Holds the original Linear's parameters (shared, not copied: a tied `lm_head` stays tied)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        out = torch.empty(rows.shape[0], self.out_features, dtype=x.dtype, device=x.device)
        size = row_block(x.device)
        for start in range(0, rows.shape[0], size):
            n = min(size, rows.shape[0] - start)
            block = torch.zeros(size, self.in_features, dtype=x.dtype, device=x.device)
            block[:n] = rows[start:start + n]
            out[start:start + n] = torch.nn.functional.linear(block, self.weight, self.bias)[:n]
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, row_block={row_block(self.weight.device)}"


__all__ = ["IMPLEMENTATION", "ROW_BLOCK", "RowBlockLinear", "implementation", "row_block", "attention", "causal_allowed", "exp_nonpositive", "rms_norm", "tree_sum"]
