"""Prefill versus decode within one arm, and the first module whose bits differ.

A served model computes a token's logits either inside a prefill (all tokens of the prompt in one
forward, GEMMs of M = T) or while decoding (one token per forward against the KV cache, M = 1).
Same kernel, same weights, same tokens: any difference is the model's own arithmetic changing
with the regime. Per window of the prompt set, tokens 0 … T+P−1 are run

- *prefill*: one forward over all T+P tokens without a cache (`LoadedModel.logits`);
- *decode*: a prefill of tokens 0 … T−1 with the cache, then one forward per token T … T+P−1
  (`LoadedModel.incremental_logits`),

and the output rows at positions T … T+P−1 (the rows decode computes one token at a time; row t
predicts token t+1) are compared bit for bit: the fp32 logits, and
the digest of every module's output row at that position (`alibi.model.trace.ModuleTrace`, the
same trace `alibi locate` and `alibi variations` compare). The first module in execution order whose row
differs in any bit is where the two regimes part for that position. Modules mix positions only in
the attention core, so a row can differ there because an earlier position's keys or values
differed, even if that position's own q/k/v rows agree; the per-module counts show such cases.
Rows 0 … T−1 are compared too (the decode regime's T-token prefill against the full prefill:
`context_rows_differ`), since the cached keys and values of those positions feed every decode step.

Bitwise means bit patterns (`alibi.exact.numerics.bits`): +0 and −0 differ, NaN payloads count.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from alibi.exact.numerics import bits
from alibi.governance.manifest import write_manifest
from alibi.io import atomic
from alibi.io.progress import Progress
from alibi.io.typed import TypedResult
from alibi.model.runner import load_model
from alibi.model.trace import ModuleTrace
from alibi.tokens.setup import Span, check_output, load_prompts, open_inputs, replay_predicate, resolve_span

SCHEMA = "alibi-prefill-decode/v1"
RESULT_FILE = "prefill_decode.json"
DEFAULT_POSITIONS = 64
GRANULARITY_CORE = ("every leaf module (embedding, rotary cos/sin, each RMSNorm, q/k/v/o, gate/up/down, activation, "
                    "final norm, lm_head) and the attention core: q and k after RoPE and the attention output")
GRANULARITY_NO_CORE = ("every leaf module (embedding, rotary cos/sin, each RMSNorm, q/k/v/o, gate/up/down, activation, "
                       "final norm, lm_head); the attention core was not reached (this model does not dispatch "
                       "through transformers' attention table): a difference born there shows at o_proj")


@dataclass(frozen=True)
class PositionComparison:
    """One compared position of one window.

    position: the input token whose output row is compared (it predicts token position+1);
    logits_identical: the fp32 logit rows of the two regimes are bitwise equal; argmax_prefill /
    argmax_decode: the top-1 token of each regime (first maximal index); margin_prefill: top-1
    minus top-2 logit in the prefill regime (fp32); first_module: the first module in execution
    order whose output row at this position differs in any bit (None when none does);
    modules_differing: how many recorded modules' rows differ at this position.
    """

    window: int
    position: int
    logits_identical: bool
    argmax_prefill: int
    argmax_decode: int
    margin_prefill: float
    first_module: str | None
    modules_differing: int

    @property
    def flip(self) -> bool:
        return self.argmax_prefill != self.argmax_decode


@dataclass(frozen=True)
class PrefillDecodeResult(TypedResult):
    """Prefill vs decode of one arm (schema `alibi-prefill-decode/v1`).

    kernel: the arm's kernel (None for a dense model); context, positions, windows: the span;
    module_order: every recorded module in execution order; attention_core: q/k after RoPE and the
    attention output were recorded; granularity: in words, what was recorded;
    n_positions: compared positions (windows × positions); logits_identical / logits_differ:
    positions whose fp32 logit rows are / are not bitwise equal; argmax_flips: positions whose
    top-1 token differs between the regimes; first_module_counts: over positions whose logits
    differ, how often each module was the first to differ; first_module_counts_flips: the same
    over flips; first_kind_counts: `first_module_counts` with the layer index removed
    (`self_attn.attention` for every layer's); unattributed: positions whose logits differ but no
    recorded module's row does (0 unless a module escaped the hooks); internal_only: positions with
    identical logits where some module's row differs; module_differ_counts: per module, the compared
    positions at which its row differs; context_rows_differ: per module, the rows 0 … T−1 of the
    decode regime's T-token prefill that differ from the full prefill's (summed over windows);
    context_logits_differ: the same for the logit rows; positions_detail: every compared position;
    seconds: wall time of both regimes, hooks included.
    """

    SCHEMA = SCHEMA
    JSON_SORT_KEYS = True
    REMEDY = "re-run `alibi replay prefill-vs-decode`"
    FILE = RESULT_FILE

    kernel: str | None
    context: int
    positions: int
    windows: tuple[int, ...]
    module_order: tuple[str, ...]
    attention_core: bool
    granularity: str
    n_positions: int
    logits_identical: int
    logits_differ: int
    argmax_flips: int
    first_module_counts: dict[str, int]
    first_module_counts_flips: dict[str, int]
    first_kind_counts: dict[str, int]
    unattributed: int
    internal_only: int
    module_differ_counts: dict[str, int]
    context_rows_differ: dict[str, int]
    context_logits_differ: int
    positions_detail: tuple[PositionComparison, ...]
    seconds: float
    schema: str = SCHEMA


def module_kind(name: str) -> str:
    """A module's name without the model prefix and layer index (`model.layers.3.mlp.up_proj` →
    `mlp.up_proj`), so counts can be pooled over layers."""
    return re.sub(r"^(?:model\.)?(?:.*\.)?layers\.\d+\.", "", name).removeprefix("model.")


def rows_differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Bool [n] on the CPU: row i of `a` and `b` ([n, …], same dtype and shape) differ in any bit."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"cannot compare {a.dtype}{list(a.shape)} with {b.dtype}{list(b.shape)} row by row")
    n = a.shape[0]
    if a.is_floating_point():
        a, b = bits(a), bits(b)
    return (a.reshape(n, -1) != b.reshape(n, -1)).any(dim=1).cpu()


@dataclass(frozen=True)
class WindowComparison:
    """One window's comparison: per position detail, and per module the differing rows [T+P]."""

    detail: tuple[PositionComparison, ...]
    order: tuple[str, ...]
    module_rows: dict[str, torch.Tensor]
    logit_rows: torch.Tensor
    attention_core: bool


def compare_window(lm, ids: torch.Tensor, context: int, window: int = 0) -> WindowComparison:
    """Run both regimes over the token ids [T+P] with every module recorded, and compare."""
    n = ids.numel()
    with ModuleTrace(lm) as pre:
        full = lm.logits(ids.reshape(1, -1))[0]
    with ModuleTrace(lm) as dec:
        inc = lm.incremental_logits(ids, context)
    if set(pre.order) != set(dec.order):
        only = sorted(set(pre.order) ^ set(dec.order))
        raise RuntimeError(f"modules {only[:3]} ran in only one of the two regimes; they cannot be compared")
    order = tuple(pre.order)
    module_rows = {name: pre.position_digests(name, n) != dec.position_digests(name, n) for name in order}
    logit_rows = rows_differ(full, inc)
    matrix = torch.stack([module_rows[name] for name in order]) if order else torch.zeros(0, n, dtype=torch.bool)
    top2 = full[context:].topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1]).cpu().tolist()
    arg_pre, arg_dec = full[context:].argmax(-1).cpu().tolist(), inc[context:].argmax(-1).cpu().tolist()
    detail = []
    for i, t in enumerate(range(context, n)):
        column = matrix[:, t]
        hits = column.nonzero()
        detail.append(PositionComparison(window=window, position=t, logits_identical=not bool(logit_rows[t]),
                                         argmax_prefill=int(arg_pre[i]), argmax_decode=int(arg_dec[i]),
                                         margin_prefill=float(margin[i]),
                                         first_module=order[int(hits[0, 0])] if hits.numel() else None,
                                         modules_differing=int(column.sum())))
    return WindowComparison(tuple(detail), order, module_rows, logit_rows, pre.attention_core and dec.attention_core)


def _ordered(counter: Counter, order: tuple[str, ...]) -> dict[str, int]:
    return {name: counter[name] for name in order if counter[name]}


def prefill_vs_decode(lm, input_ids: torch.Tensor, span: Span, progress: Progress | None = None) -> PrefillDecodeResult:
    """Compare the two regimes over `span` of the prompt ids [N,L] (see the module docstring)."""
    start = time.perf_counter()
    details: list[PositionComparison] = []
    module_counts, context_counts = Counter(), Counter()
    context_logits = 0
    order: tuple[str, ...] = ()
    core = True
    t = span.context
    for k, w in enumerate(span.windows):
        cmp = compare_window(lm, input_ids[w, : span.fed], t, w)
        if order and cmp.order != order:
            raise RuntimeError(f"window {w}: the modules ran in another order than in window {span.windows[0]}")
        order, core = cmp.order, core and cmp.attention_core
        details += cmp.detail
        for name, rows in cmp.module_rows.items():
            module_counts[name] += int(rows[t:].sum())
            context_counts[name] += int(rows[:t].sum())
        context_logits += int(cmp.logit_rows[:t].sum())
        if progress:
            differ = sum(not d.logits_identical for d in cmp.detail)
            progress(k + 1, len(span.windows), f"window {w}: logits differ at {differ}/{span.positions} positions")
    differing = [d for d in details if not d.logits_identical]
    flips = [d for d in details if d.flip]
    firsts = Counter(d.first_module for d in differing if d.first_module is not None)
    kinds = Counter()
    for name, count in firsts.items():
        kinds[module_kind(name)] += count
    return PrefillDecodeResult(
        kernel=lm.kernel.name if lm.kernel is not None else None, context=t, positions=span.positions,
        windows=span.windows, module_order=order, attention_core=core,
        granularity=GRANULARITY_CORE if core else GRANULARITY_NO_CORE, n_positions=len(details),
        logits_identical=len(details) - len(differing), logits_differ=len(differing), argmax_flips=len(flips),
        first_module_counts=_ordered(firsts, order),
        first_module_counts_flips=_ordered(Counter(d.first_module for d in flips if d.first_module), order),
        first_kind_counts=dict(kinds.most_common()),
        unattributed=sum(d.first_module is None for d in differing),
        internal_only=sum(d.logits_identical and d.first_module is not None for d in details),
        module_differ_counts=_ordered(module_counts, order), context_rows_differ=_ordered(context_counts, order),
        context_logits_differ=context_logits, positions_detail=tuple(details),
        seconds=round(time.perf_counter() - start, 3))


def summary_lines(result: PrefillDecodeResult) -> list[str]:
    """A short human summary (stdout of the command)."""
    lines = [(f"prefill-vs-decode with {result.kernel or 'the dense model'}: {result.n_positions} positions "
              f"({len(result.windows)} windows × {result.positions} after {result.context} tokens)"),
             (f"  logits bitwise identical: {result.logits_identical}/{result.n_positions}; argmax flips: "
              f"{result.argmax_flips}; unattributed: {result.unattributed}")]
    for kind, count in list(result.first_kind_counts.items())[:5]:
        lines.append(f"  first differing module {kind}: {count} positions")
    if not result.attention_core:
        lines.append("  note: the attention core was not reached; see `granularity` in the result")
    return lines


def resolve_pvd_span(prompts, windows: int | None, context: int | None, positions: int | None, where) -> Span:
    """As `resolve_span`, with P defaulting to 64 (or what is left of the window after T)."""
    if positions is None:
        t = prompts.tokens // 2 if context is None else context
        positions = max(min(DEFAULT_POSITIONS, prompts.tokens - t), 1)
    return resolve_span(prompts, windows, context, positions, where)


def run_prefill_vs_decode(model_dir: str | os.PathLike, prompts_dir: str | os.PathLike, out: str | os.PathLike, *,
                          kernel: str | None, windows: int | None = None, context: int | None = None,
                          positions: int | None = None, device: str | None = None, overwrite: bool = False,
                          progress: Progress | None = None, deterministic: bool = True) -> PrefillDecodeResult:
    """Prefill vs decode of one arm into the folder `out` (prefill_decode.json + manifest.json)."""
    prompts = load_prompts(prompts_dir)
    span = resolve_pvd_span(prompts, windows, context, positions, prompts_dir)
    check_output(out, {"--model": model_dir, "--prompts": prompts_dir}, overwrite)
    inputs = open_inputs(model_dir, prompts)
    lm = load_model(model_dir, kernel, device, deterministic=deterministic)
    if progress:
        progress.note(f"prefill-vs-decode: {lm.kernel.name if lm.kernel else 'dense'} on {lm.device}, "
                      f"{len(span.windows)} windows × {span.positions} positions after {span.context} tokens")
    result = prefill_vs_decode(lm, prompts.input_ids, span, progress)
    label = lm.kernel.name if lm.kernel is not None else "dense"
    with atomic.staged_dir(out) as stage:
        atomic.write_text(Path(stage) / RESULT_FILE, result.to_json())
        write_manifest(stage, "replay", replay_predicate(inputs, lm, label, {
            "replay": "prefill-vs-decode", **span.as_dict(),
            "regimes": "prefill: one forward of T+P tokens, no cache; decode: prefill of T tokens, then one "
                       "forward per token with the KV cache"}))
    return result


__all__ = ["PositionComparison", "PrefillDecodeResult", "compare_window", "module_kind", "prefill_vs_decode",
           "rows_differ", "run_prefill_vs_decode", "summary_lines"]
