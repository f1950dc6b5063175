"""How the model runner executes: batch-invariant and deterministic (the default), or the libraries' own way.

`ExecutionMode` is part of every replay manifest's parameters, so two arms run in different modes
fail the identity contract. The deterministic mode (`DETERMINISTIC`) is chosen on purpose, from
what was measured on the H200 (torch 2.11, SmolLM2-135M shapes, 64 prompts × 128 tokens, greedy):

- with the libraries' defaults, two runs differ from the first or second decode step on, first at
  the attention core (`scaled_dot_product_attention`); prompt 0 alone and inside a batch of 64 differ
  at the first decode step; and prefill and decode of one prompt differ at the attention core and
  once at an RMSNorm (`analysis/results/h200/tokens-exploratory`);
- the culprit at decode is cuDNN's attention, which SDPA picks by default there: 2 distinct outputs
  in 50 identical calls and row 0 batch-variant, where flash, efficient and math each gave one output
  and a batch-invariant row 0 (`analysis/results/h200/determinism/probe/sdpa-probe.json`); and with
  those, chunked prefill still differs from one prefill, first at an RMSNorm (torch's mean changes
  its reduction with the number of rows: `…/determinism/study/variations-native`);
- `torch.use_deterministic_algorithms(True)` or SDPA's math backend make runs reproduce and batch
  size irrelevant at decode, but no library setting promises that a prefill, a chunked prefill and
  a decode step give one token the same bits.

So the deterministic mode replaces the three reductions that meet a row — the attention core, the
RMSNorms and the dense Linears (`lm_head`) — by `alibi.model.invariant`, whose order depends on no
shape but the row's own, and also turns on the libraries' deterministic algorithms (with cuBLAS's
fixed workspace, and without bf16 reduced-precision reductions) for whatever else runs. The
quantized Linears keep the chosen kernel: that is what is under test.

`NATIVE` (`--nondeterministic`) leaves transformers' SDPA attention, its RMSNorm and torch's
defaults in place, for measuring them.
"""

from __future__ import annotations

import os
import types
from dataclasses import asdict, dataclass
from typing import Any

import torch

from alibi.errors import InputError
from alibi.model.invariant import RowBlockLinear, attention, implementation, rms_norm, row_block

ATTENTION_NAME = "alibi_invariant"
CUBLAS_WORKSPACE = ":4096:8"
# RMSNorm classes whose forward is exactly Llama's (weight · normalize(x) with the float32 mean of
# squares); another norm is refused in the deterministic mode rather than left variant unnoticed.
LLAMA_STYLE_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm", "Qwen3MoeRMSNorm")


@dataclass(frozen=True)
class ExecutionMode:
    """deterministic: the batch-invariant runner (module docstring); attention: the attention
    implementation (`alibi_invariant` or transformers' `sdpa`); norms and dense_linears: how the
    RMSNorms and the non-quantized Linears compute (`tree` / `row-block:N`, N rows per GEMM, or `native`);
    deterministic_algorithms: `torch.use_deterministic_algorithms` was on; cublas_workspace: the
    `CUBLAS_WORKSPACE_CONFIG` in force (None when unset); decode: how greedy decoding runs, `eager` or
    `cuda-graphs` (`alibi.model.decode_graphs`); graphs_refused: why CUDA graphs were asked for and not used
    (a kernel that cannot be captured, named with the error), None otherwise."""

    deterministic: bool
    attention: str
    norms: str
    dense_linears: str
    deterministic_algorithms: bool
    cublas_workspace: str | None
    decode: str = "eager"
    graphs_refused: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The mode as manifests record it. `decode` and `graphs_refused` appear only where CUDA graphs were asked
        for: an eagerly decoding run records what runs recorded before graphs existed, so its arms still join
        theirs (and `alibi-variations/v2`'s `execution` holds), while a run with graphs differs from both."""
        record = asdict(self)
        if self.decode == "eager" and self.graphs_refused is None:
            del record["decode"], record["graphs_refused"]
        return record

    @property
    def label(self) -> str:
        return "deterministic" if self.deterministic else "native"


def _register_attention() -> None:
    # deferred: keeps transformers out of start-up
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    if ATTENTION_NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTENTION_NAME, invariant_attention_forward)
        AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


def invariant_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                                scaling: float | None = None, **kwargs):
    """transformers' attention-function signature over `alibi.model.invariant.attention`.

    The mask is the one transformers builds for SDPA: a bool [B|1, 1, S, L] tensor (True = attend), a
    float one (0 = attend), or None where it is the plain causal one aligned to the last query."""
    for feature in ("sliding_window", "softcap", "s_aux"):
        if kwargs.get(feature) is not None:
            raise InputError(f"the deterministic runner's attention has no {feature}; run this model with "
                             "--nondeterministic")
    if dropout:
        raise InputError("the deterministic runner does not apply attention dropout (the model is in training mode?)")
    length = key.shape[2]
    if attention_mask is None and 1 < query.shape[2] < length:
        # transformers passes no mask for a prefill into an empty static cache and means SDPA's `is_causal`,
        # aligned to the first key: the keys past the queries are empty slots, which no row may see
        key, value, length = key[:, :, :query.shape[2]], value[:, :, :query.shape[2]], query.shape[2]
    if attention_mask is None:
        allowed = None  # the causal mask aligned to the last query (= the first: as many keys as queries, or one query)
    elif attention_mask.dtype == torch.bool:
        allowed = attention_mask[..., :length]
    else:
        allowed = attention_mask[..., :length] == 0
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    out = attention(query, key, value, allowed, scale)
    return out.transpose(1, 2).contiguous(), None


def _norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    return rms_norm(hidden_states, self.weight, self.variance_epsilon)


def set_library_flags(deterministic: bool) -> tuple[bool, str | None]:
    """Set the process-wide torch flags of the deterministic mode or the native one (a model loaded in the other
    mode runs under them: a process that runs both sets them again before each); returns what torch reports."""
    if deterministic:
        # Must be in the environment before cuBLAS creates its handle; it is read per handle, so a
        # process that already ran a cuBLAS call keeps its old setting (recorded as found).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
        torch.use_deterministic_algorithms(True)
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        # Deterministic algorithms also fill every new tensor with NaN (a guard against reading memory
        # no op wrote). The runner writes every element it reads, so the guard buys nothing here and
        # costs one fill launch per allocation: about 30 per layer and decode step. A kernel that did
        # read unwritten memory would fail the cold-restart variation (`alibi variations`).
        torch.utils.deterministic.fill_uninitialized_memory = False
    else:
        torch.use_deterministic_algorithms(False)
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = True
        torch.utils.deterministic.fill_uninitialized_memory = True  # torch's default
    return torch.are_deterministic_algorithms_enabled(), os.environ.get("CUBLAS_WORKSPACE_CONFIG")


def apply_execution_mode(model: torch.nn.Module, deterministic: bool = True) -> ExecutionMode:
    """Make `model` (a transformers causal LM, quantized Linears already swapped in) run in the
    deterministic mode, or leave it native; set the process-wide torch flags of that mode. Returns
    the mode as applied (read back from torch, not assumed)."""
    algorithms, workspace = set_library_flags(deterministic)
    if not deterministic:
        return ExecutionMode(False, model.config._attn_implementation, "native", "native", algorithms, workspace)
    for name, module in list(model.named_modules()):
        cls = type(module).__name__
        if cls.endswith("RMSNorm"):
            if cls not in LLAMA_STYLE_NORMS:
                raise InputError(f"{name}: {cls} is not a Llama-style RMSNorm the deterministic runner can compute; "
                                 "run this model with --nondeterministic")
            module.forward = types.MethodType(_norm_forward, module)
        elif type(module) is torch.nn.Linear:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, RowBlockLinear(module))
    _register_attention()
    model.config._attn_implementation = ATTENTION_NAME
    device = next(model.parameters()).device
    how = implementation(device)
    return ExecutionMode(True, f"{ATTENTION_NAME}:{how}", how, f"row-block:{row_block(device)}", algorithms, workspace)


__all__ = ["ATTENTION_NAME", "ExecutionMode", "apply_execution_mode", "invariant_attention_forward",
           "set_library_flags"]
