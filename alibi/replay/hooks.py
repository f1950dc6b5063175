"""Recording every module's output, row by row, while a model runs.

`ModuleRecorder(lm)` is a context manager. While active it holds, for each recorded module, the
rows of its output indexed by token position, over every forward of the model (a prefill, or a
prefill followed by single-token decode steps with the KV cache), so two regimes can be compared
position by position. It records

- every *leaf* module (one without children) through a torch forward hook: in a Llama the token
  embedding, the rotary embedding (its cos and sin, `…rotary_emb[0]` and `[1]`), each RMSNorm, the
  q/k/v/o projections, the MLP's gate/up/down projections and its activation, the final norm and
  `lm_head`. Containers (decoder layers, the attention and MLP blocks) add nothing a leaf does not
  show: their outputs are sums of leaf outputs and inputs;
- the attention core, which is a function and not a module: the attention function transformers
  dispatches to (`ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`, e.g. `sdpa`) is wrapped
  for the duration, and records its query and key *after* RoPE (`…self_attn.q_rope`, `.k_rope`;
  for keys only the rows of the current call's positions, not the cached ones) and its output
  (`…self_attn.attention`, before `o_proj`). The wrapper calls the original function with the same
  arguments and returns its result unchanged, and the mask the model builds depends only on the
  implementation's name, which stays the same, so recording changes no bit of the computation.
  If a model does not dispatch through that table, these three are absent and `attention_core`
  is False.

Rows. A module's output in one forward is `[1, S, …]` (batch 1) for the S tokens of that forward,
which start at position `past` (the KV cache's length before it; 0 for a prefill). q/k are
`[1, H, S, D]` and are taken per position across heads. Modules are named by `named_modules`,
with `#k` appended to the k-th call within one forward of a module called more than once, and
listed in the order of their first call (`order`): execution order.

Recorded rows are detached copies on the model's device: recording never touches the tensors
the model computes with.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Self

import torch

ATTENTION_SUFFIXES = ("q_rope", "k_rope", "attention")


def _tensors(output) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for t in output if isinstance(t, torch.Tensor)]
    return []


@dataclass
class ModuleRecorder:
    """Context manager: rows of every leaf module's output and of the attention core, by position."""

    lm: object
    order: list[str] = field(default_factory=list)
    chunks: dict[str, list[tuple[int, torch.Tensor]]] = field(default_factory=lambda: defaultdict(list))
    attention_core: bool = False
    _past: int = 0
    _calls: dict[str, int] = field(default_factory=dict)
    _handles: list = field(default_factory=list)
    _names: dict[int, str] = field(default_factory=dict)
    _restore: object = None

    # --- recording ---------------------------------------------------------------------------

    def _store(self, name: str, rows: torch.Tensor) -> None:
        """rows: [S, …] for positions past … past+S−1 of the current forward."""
        if name not in self.chunks:
            self.order.append(name)
        self.chunks[name].append((self._past, rows.detach().clone()))

    def _call_name(self, base: str) -> str:
        k = self._calls.get(base, 0)
        self._calls[base] = k + 1
        return base if k == 0 else f"{base}#{k}"

    def _on_forward_start(self, _module, args, kwargs) -> None:
        past = kwargs.get("past_key_values")
        self._past = int(past.get_seq_length()) if past is not None and hasattr(past, "get_seq_length") else 0
        self._calls = {}

    def _leaf_hook(self, module, _inputs, output) -> None:
        name = self._call_name(self._names[id(module)])
        tensors = _tensors(output)
        for i, t in enumerate(tensors):
            if t.dim() < 2 or t.shape[0] != 1:
                continue  # not a [1, S, ...] activation (batch 1 is what the regimes compare)
            self._store(name if len(tensors) == 1 else f"{name}[{i}]", t[0])

    def _attention(self, original):
        def wrapped(module, query, key, value, attention_mask, *args, **kwargs):
            result = original(module, query, key, value, attention_mask, *args, **kwargs)
            owner = self._names.get(id(module), "attention")
            k = self._calls.get(f"{owner}.core", 0)
            self._calls[f"{owner}.core"] = k + 1
            suffix = "" if k == 0 else f"#{k}"
            s = query.shape[2]
            self.attention_core = True
            self._store(f"{owner}.q_rope{suffix}", query[0].transpose(0, 1))
            self._store(f"{owner}.k_rope{suffix}", key[0, :, -s:].transpose(0, 1))
            out = _tensors(result)
            if out:
                self._store(f"{owner}.attention{suffix}", out[0][0])
            return result

        return wrapped

    # --- context -----------------------------------------------------------------------------

    def __enter__(self) -> Self:
        model = self.lm.model
        self._names = {id(m): name for name, m in model.named_modules()}
        self._handles.append(model.register_forward_pre_hook(self._on_forward_start, with_kwargs=True))
        for name, module in model.named_modules():
            if name and not any(True for _ in module.children()):
                self._handles.append(module.register_forward_hook(self._leaf_hook))
        self._restore = self._wrap_attention(model)
        return self

    def _wrap_attention(self, model):
        try:
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        except ImportError:
            return None
        impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
        if impl is None or impl not in ALL_ATTENTION_FUNCTIONS:
            return None
        local = ALL_ATTENTION_FUNCTIONS._local_mapping
        had, before = impl in local, local.get(impl)
        ALL_ATTENTION_FUNCTIONS[impl] = self._attention(ALL_ATTENTION_FUNCTIONS[impl])

        def restore() -> None:
            if had:
                local[impl] = before
            else:
                local.pop(impl, None)

        return restore

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._restore is not None:
            self._restore()
            self._restore = None

    # --- reading -----------------------------------------------------------------------------

    def rows(self, name: str, positions: int) -> torch.Tensor:
        """The rows [positions, …] of module `name`, position t from the forward that computed it.

        Raises ValueError unless every position 0 … positions−1 was computed exactly once."""
        chunks = sorted(self.chunks[name], key=lambda c: c[0])
        covered = [p for start, rows in chunks for p in range(start, start + rows.shape[0])]
        if covered != list(range(positions)):
            raise ValueError(f"{name}: recorded positions are not exactly 0..{positions - 1}")
        return torch.cat([rows for _, rows in chunks], dim=0)

