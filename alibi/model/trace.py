"""A trace of a model run: a digest of every module's output, per forward call, batch row and position.

`ModuleTrace(lm)` is a context manager. While active it records, for every forward of the model (a
prefill, a chunk, a decode step against the KV cache, any batch size), for each module in
execution order and each batch row and token position of that forward, a 64-bit digest of the
output row's bit pattern. Two traces — two arms, two cold restarts, two execution variations —
are then compared key by key (prompt, position) to name the first module whose bits differ
(`first_divergence`). It records

- every *leaf* module (one without children) through a torch forward hook: in a Llama the token
  embedding, the rotary embedding (its cos and sin, `…rotary_emb[0]` and `[1]`, which broadcast
  over the batch), each RMSNorm, the q/k/v/o projections, the MLP's gate/up/down projections and
  its activation, the final norm and `lm_head`. Containers add nothing a leaf does not show: their
  outputs are sums of leaf outputs and inputs;
- the attention core, which is a function and not a module: the function transformers dispatches
  to (`ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`) is wrapped for the duration, and
  records its query and key *after* RoPE (`…self_attn.q_rope`, `.k_rope`; for keys only the rows of
  the current call's positions) and its output (`…self_attn.attention`, before `o_proj`). The
  wrapper returns the original's result unchanged, so tracing changes no bit of the computation.

The digest. A row's elements are read as unsigned bit patterns x_i and digested as
Σ x_i·w_i mod 2^64 with fixed odd weights w_i < 2^31 (`row_digests`). It is computed on the
model's device in integer arithmetic, so it is exact and independent of the order of the sum. Two
rows that differ in one element always get different digests (x·w ≡ 0 mod 2^64 with w odd needs
x ≡ 0); rows that differ in several collide with probability about 2^-64 at best. Rows of bf16 values held in
fp32 (the logits) have bit patterns whose 16 low bits are zero, so their digests are multiples of 2^16: 48
effective bits, a collision probability of about 2^-48 for such rows.

Rows and prompts. Row b of a forward is prompt `prompts[b]` (set `trace.prompts` before the forward
when the batch is not prompts 0 … B−1). Modules are named by `named_modules`, with `#k` appended to
the k-th call within one forward of a module called more than once. With `last_token_only`, each
forward records only its last token's rows (a recomputation: position t is the last token of the
forward that recomputes it).
"""

from __future__ import annotations

import functools
import os
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import torch

from alibi.errors import InputError, one_line
from alibi.exact.numerics import bits

ATTENTION_SUFFIXES = ("q_rope", "k_rope", "attention")
_DIGEST_SEED = 0x5EED


@functools.lru_cache(maxsize=64)
def _weights(width: int, device: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(_DIGEST_SEED)
    return (torch.randint(1, 2**31, (width,), generator=g, dtype=torch.int64) | 1).to(device)


def row_digests(t: torch.Tensor) -> torch.Tensor:
    """int64 [B, S] on the CPU: the digest of each row t[b, s, …] (module docstring)."""
    b, s = t.shape[:2]
    if t.is_floating_point():
        width = t.element_size() * 8
        x = bits(t).to(torch.int64) & ((1 << width) - 1)
    else:
        x = t.to(torch.int64)
    x = x.reshape(b, s, -1)
    return (x * _weights(x.shape[-1], str(x.device))).sum(dim=-1).cpu()


def _tensors(output) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for t in output if isinstance(t, torch.Tensor)]
    return []


@dataclass(frozen=True)
class Call:
    """One forward of the model: its index in the run, the cache length before it (`past`, the
    position of its first token), its token count and the prompt of each batch row."""

    index: int
    past: int
    tokens: int
    prompts: tuple[int, ...]


@dataclass(frozen=True)
class Divergence:
    """The first place two traces differ: the prompt and token position, the module (first in
    execution order at that position), its `kind`, and the forward call of each run that computed it."""

    prompt: int
    position: int
    module: str
    kind: str
    call_a: int
    call_b: int


def module_kind(module: torch.nn.Module | None, name: str) -> str:
    """What a recorded module is: w8a8-linear (the kernel under test), linear (dense), norm,
    embedding, rotary, activation, rope (q/k after RoPE), attention-core, or other."""
    if name.rsplit(".", 1)[-1].split("#")[0] in ("q_rope", "k_rope"):
        return "rope"
    if name.rsplit(".", 1)[-1].split("#")[0] == "attention":
        return "attention-core"
    cls = type(module).__name__ if module is not None else ""
    if cls in ("W8A8Linear", "BlockFp8Linear"):  # the block-scaled subclass is the kernel under test too
        return "w8a8-linear"
    if cls in ("Linear", "RowBlockLinear"):
        return "linear"
    if cls.endswith("Norm"):
        return "norm"
    if cls == "Embedding":
        return "embedding"
    if "Rotary" in cls:
        return "rotary"
    if "Activation" in cls or cls in ("SiLU", "GELU", "SiLUActivation"):
        return "activation"
    return "other"


@dataclass
class ModuleTrace:
    """Context manager: per-row digests of every leaf module's output and of the attention core."""

    lm: object
    prompts: Sequence[int] | None = None
    last_token_only: bool = False
    order: list[str] = field(default_factory=list)
    kinds: dict[str, str] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    digests: dict[str, list[tuple[int, torch.Tensor]]] = field(default_factory=dict)
    attention_core: bool = False
    _fed: int = 0
    _calls_in_forward: dict[str, int] = field(default_factory=dict)
    _handles: list = field(default_factory=list)
    _modules: dict[int, tuple[str, torch.nn.Module]] = field(default_factory=dict)
    _restore: object = None

    # --- recording ---------------------------------------------------------------------------

    def _store(self, name: str, kind: str, rows: torch.Tensor) -> None:
        """rows: [B or 1, S, …] for the current call's batch rows and positions."""
        call = self.calls[-1]
        if self.last_token_only:
            rows = rows[:, -1:]
        if rows.shape[0] == 1 and len(call.prompts) > 1:  # broadcast over the batch (rotary cos/sin)
            rows = rows.expand(len(call.prompts), *rows.shape[1:])
        if name not in self.digests:
            self.order.append(name)
            self.kinds[name] = kind
            self.digests[name] = []
        self.digests[name].append((call.index, row_digests(rows.detach())))

    def _call_name(self, base: str) -> str:
        k = self._calls_in_forward.get(base, 0)
        self._calls_in_forward[base] = k + 1
        return base if k == 0 else f"{base}#{k}"

    def _on_forward_start(self, _module, args, kwargs) -> None:
        past = kwargs.get("past_key_values")
        ids = kwargs.get("input_ids", args[0] if args else None)
        batch, tokens = (int(ids.shape[0]), int(ids.shape[1])) if ids is not None else (1, 0)
        prompts = tuple(self.prompts) if self.prompts is not None else tuple(range(batch))
        if len(prompts) != batch:
            raise ValueError(f"trace.prompts names {len(prompts)} prompts for a batch of {batch}")
        start = int(past.get_seq_length()) if past is not None and hasattr(past, "get_seq_length") else 0
        self._fed = tokens
        if self.last_token_only:
            start, tokens = start + tokens - 1, 1
        self.calls.append(Call(len(self.calls), start, tokens, prompts))
        self._calls_in_forward = {}

    def _leaf_hook(self, module, _inputs, output) -> None:
        base, mod = self._modules[id(module)]
        name = self._call_name(base)
        tensors = _tensors(output)
        call = self.calls[-1]
        for i, t in enumerate(tensors):
            if t.dim() < 2 or t.shape[1] != self._fed or t.shape[0] not in (1, len(call.prompts)):
                continue  # not a [B, S, …] activation of this call
            self._store(name if len(tensors) == 1 else f"{name}[{i}]", module_kind(mod, name), t)

    def _attention(self, original):
        def wrapped(module, query, key, value, attention_mask, *args, **kwargs):
            result = original(module, query, key, value, attention_mask, *args, **kwargs)
            owner = self._modules.get(id(module), ("attention", None))[0]
            k = self._calls_in_forward.get(f"{owner}.core", 0)
            self._calls_in_forward[f"{owner}.core"] = k + 1
            suffix = "" if k == 0 else f"#{k}"
            s = query.shape[2]
            self.attention_core = True
            self._store(f"{owner}.q_rope{suffix}", "rope", query.transpose(1, 2))
            self._store(f"{owner}.k_rope{suffix}", "rope", key[:, :, -s:].transpose(1, 2))
            out = _tensors(result)
            if out:
                self._store(f"{owner}.attention{suffix}", "attention-core", out[0])
            return result

        return wrapped

    # --- context -----------------------------------------------------------------------------

    def __enter__(self) -> Self:
        model = self.lm.model
        self._modules = {id(m): (name, m) for name, m in model.named_modules()}
        self._handles.append(model.register_forward_pre_hook(self._on_forward_start, with_kwargs=True))
        for name, module in model.named_modules():
            if name and not any(True for _ in module.children()):
                self._handles.append(module.register_forward_hook(self._leaf_hook))
        self._restore = self._wrap_attention(model)
        return self

    def _wrap_attention(self, model):
        try:
            # deferred: keeps transformers out of start-up
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

    def table(self) -> dict[tuple[int, int], dict[str, tuple[int, int]]]:
        """(prompt, position) → {module: (digest, call index)}; a position computed by several calls
        (it cannot be, in the runner's regimes) keeps the last."""
        out: dict[tuple[int, int], dict[str, tuple[int, int]]] = {}
        for name in self.order:
            for index, d in self.digests[name]:
                call = self.calls[index]
                values = d.tolist()
                for row, prompt in enumerate(call.prompts):
                    for s, digest in enumerate(values[row]):
                        out.setdefault((prompt, call.past + s), {})[name] = (digest, index)
        return out

    def position_digests(self, name: str, positions: int, prompt: int = 0) -> torch.Tensor:
        """int64 [positions]: the digest of module `name`'s row at positions 0 … positions−1 of `prompt`.

        Raises ValueError unless every position was computed exactly once."""
        seen: dict[int, int] = {}
        for index, d in self.digests[name]:
            call = self.calls[index]
            if prompt not in call.prompts:
                continue
            row = d[call.prompts.index(prompt)].tolist()
            for s, digest in enumerate(row):
                if call.past + s in seen:
                    raise ValueError(f"{name}: position {call.past + s} was computed more than once")
                seen[call.past + s] = digest
        if sorted(seen) != list(range(positions)):
            raise ValueError(f"{name}: recorded positions are not exactly 0..{positions - 1}")
        return torch.tensor([seen[p] for p in range(positions)], dtype=torch.int64)


def first_divergence(a: ModuleTrace, b: ModuleTrace, keys=None) -> Divergence | None:
    """The first (position, module) at which two traces differ, over the (prompt, position) keys both
    hold (or `keys`): the smallest position with any difference (prompts in order), then the first
    module in execution order there. None when every compared row is identical. A module that ran
    in only one trace differs."""
    ta, tb = a.table(), b.table()
    shared = sorted(set(ta) & set(tb), key=lambda k: (k[1], k[0])) if keys is None else \
        sorted(keys, key=lambda k: (k[1], k[0]))
    found = _first_difference(a, b, ta, tb, [(k, k) for k in shared])
    return None if found is None else found[0]


def first_divergence_paired(a: ModuleTrace, b: ModuleTrace,
                            pairs: Sequence[tuple[int, int]]) -> tuple[Divergence, int] | None:
    """`first_divergence` over rows that the two traces label differently: `pairs` are (prompt label in
    a, prompt label in b), e.g. a prompt run alone (labelled by its window) and the rows of a batch that
    hold it (labelled by row). Every position both rows hold is compared; the smallest position with a
    difference wins, then the pair's order (a's label, then b's), then execution order. Returns the
    Divergence (its `prompt` is a's label) with b's label, or None when every paired row is identical."""
    ta, tb = a.table(), b.table()
    held_a: dict[int, set[int]] = {}
    held_b: dict[int, set[int]] = {}
    for held, table in ((held_a, ta), (held_b, tb)):
        for prompt, position in table:
            held.setdefault(prompt, set()).add(position)
    keyed = sorted((((la, p), (lb, p)) for la, lb in pairs for p in held_a.get(la, set()) & held_b.get(lb, set())),
                   key=lambda k: (k[0][1], k[0][0], k[1][0]))
    found = _first_difference(a, b, ta, tb, keyed)
    return None if found is None else (found[0], found[1][0])


def _first_difference(a: ModuleTrace, b: ModuleTrace, ta, tb, keyed) -> tuple[Divergence, tuple[int, int]] | None:
    """The first (key in a, key in b) of `keyed`, in its order, where a module's row differs (or ran in one
    trace only): its Divergence and b's key."""
    order = list(a.order) + [n for n in b.order if n not in a.kinds]
    for key_a, key_b in keyed:
        ra, rb = ta.get(key_a, {}), tb.get(key_b, {})
        for name in order:
            da, db = ra.get(name), rb.get(name)
            if da is None and db is None:
                continue
            if da is None or db is None or da[0] != db[0]:
                kind = a.kinds.get(name) or b.kinds.get(name, "other")
                return Divergence(prompt=key_a[0], position=key_a[1], module=name, kind=kind,
                                  call_a=da[1] if da else -1, call_b=db[1] if db else -1), key_b
    return None


# --- a saved trace (trace.pt, an execution of `alibi variations`) -----------------------------------

TRACE_KEYS = ("name", "logits", "order", "kinds", "calls", "digests")


def read_trace_file(path: str | os.PathLike, fix: str) -> dict[str, Any]:
    """The table a saved trace holds (`alibi.tokens.variations.save_execution`), checked before use.

    Read with `torch.load(weights_only=True)`, which builds lists, numbers, strings and tensors and
    nothing else: a file holding any other object (a pickle that could run code on loading) is refused,
    never loaded. Then every key and value must have the shape the writer gives it: the six keys
    (`TRACE_KEYS`), modules named once with a kind each, forward calls numbered 0, 1, … and each digest
    an int64 [rows, positions] tensor of one of those calls (a row per prompt of the call, at most its
    token count). Anything else is an InputError of one line naming the file, what is wrong, and `fix`;
    torch's own message (which advises `weights_only=False`) is never shown.
    """
    label = f"{one_line(str(path))}: not a trace written by alibi"
    try:
        doc = torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError:
        raise InputError(f"{label} (it holds objects other than lists, numbers, strings and tensors, which alibi "
                         f"never loads: loading them could run code); {fix}") from None
    except FileNotFoundError:
        raise InputError(f"{one_line(str(path))}: no such file; {fix}") from None
    except IsADirectoryError:
        raise InputError(f"{one_line(str(path))}: is a folder, not a trace file; {fix}") from None
    except PermissionError:
        raise InputError(f"{one_line(str(path))}: cannot be read (permission denied); make it readable") from None
    except Exception as exc:  # noqa: BLE001 - not a torch file, truncated, corrupt: torch raises many kinds
        raise InputError(f"{label} (not a complete torch file: {exc.__class__.__name__}); {fix}") from None
    try:
        _check_trace(doc)
    except (ValueError, TypeError) as exc:
        raise InputError(f"{label} ({one_line(str(exc))[:200]}); {fix}") from None
    return doc


def _ints(value: Any, n: int | None, what: str) -> list[int]:
    if not isinstance(value, (list, tuple)) or (n is not None and len(value) != n) or \
            not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{what} is not a list of {n if n is not None else 'some'} integers")
    return list(value)


def _check_trace(doc: Any) -> None:
    if not isinstance(doc, dict):
        raise ValueError(f"it holds a {type(doc).__name__}, not the trace's table")
    missing = [k for k in TRACE_KEYS if k not in doc]
    if missing:
        raise ValueError(f"the key {missing[0]!r} is missing")
    if not isinstance(doc["name"], str):
        raise ValueError("'name' is not a string")
    order, kinds, calls, digests = doc["order"], doc["kinds"], doc["calls"], doc["digests"]
    if not isinstance(order, list) or not all(isinstance(n, str) for n in order) or len(set(order)) != len(order):
        raise ValueError("'order' is not a list of distinct module names")
    if not isinstance(kinds, list) or len(kinds) != len(order) or not all(isinstance(k, str) for k in kinds):
        raise ValueError("'kinds' does not give one kind per module of 'order'")
    if not isinstance(calls, list):
        raise ValueError("'calls' is not a list")
    shapes = []
    for i, c in enumerate(calls):
        if not isinstance(c, (list, tuple)) or len(c) != 4:
            raise ValueError(f"call {i} is not [index, past, tokens, prompts]")
        index, past, tokens = _ints(c[:3], 3, f"call {i}")
        prompts = _ints(c[3], None, f"call {i}'s prompts")
        if index != i or past < 0 or tokens < 1 or not prompts or min(prompts) < 0:
            raise ValueError(f"call {i} is not call {i} of a run (index {index}, past {past}, tokens {tokens})")
        shapes.append((len(prompts), tokens))
    if not isinstance(digests, dict) or set(digests) != set(order):
        raise ValueError("'digests' does not hold exactly the modules of 'order'")
    for name in order:
        rows = digests[name]
        if not isinstance(rows, list):
            raise ValueError(f"the digests of {name!r} are not a list")
        for entry in rows:
            if not isinstance(entry, (list, tuple)) or len(entry) != 2:
                raise ValueError(f"a digest entry of {name!r} is not [call, tensor]")
            index, d = entry
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(calls):
                raise ValueError(f"a digest of {name!r} names call {index!r}, which the trace does not hold")
            if not isinstance(d, torch.Tensor) or d.dtype != torch.int64 or d.dim() != 2 or \
                    d.shape[0] != shapes[index][0] or not 1 <= d.shape[1] <= shapes[index][1]:
                raise ValueError(f"a digest of {name!r} at call {index} is not an int64 [rows, positions] tensor "
                                 "of that call")
    logits = doc["logits"]
    if not isinstance(logits, list) or not all(isinstance(e, (list, tuple)) and len(e) == 3 for e in logits):
        raise ValueError("'logits' is not a list of [prompt, position, digest]")
    for e in logits:
        _ints(e, 3, "a logit digest")


__all__ = ["ATTENTION_SUFFIXES", "TRACE_KEYS", "Call", "Divergence", "ModuleTrace", "first_divergence",
           "first_divergence_paired", "module_kind", "read_trace_file", "row_digests"]
