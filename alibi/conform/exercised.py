"""Which attributes of each arm's declared epilogue a tile source exercised: could a departure have shown?

A pass says that each arm's output equals its declared model on every tile. That certifies the declaration only
where a kernel departing from it would have given other bits: a source without a bias cannot tell the bias modes
apart, and real operands tell the scale orders apart only at parts per million. For each arm that declares an
int8 epilogue model, each attribute of it — the scale order, the intermediate rounding, the bias mode — and each
context — output dtype × decode (M = 1) or prefill (M > 1) — this module asks whether every single-attribute
alternative of the declared model (the other orders, the rounding toggled, the other bias modes) gives other bits
than the declared model on some tile of that context, under the regimes run, from the exact accumulator. An
attribute is *exercised* in a context when every alternative showed there.

The default tile source claims to exercise every attribute in every `REQUIRED_CONTEXTS`
(`alibi.tiles.declaration_probe`); `alibi.conform.pipeline.run_conformance` records this accounting in the
report's `source.exercised` for such a source and makes a verdict that would pass inconclusive, naming the
attribute, arm and context, when one was not exercised.

A kernel that takes its bias only in the output dtype (`Kernel.bias_in_output_dtype`: vLLM's) declares nothing
about an fp32 bias, and refuses one that dtype cannot hold. For a pair with such an arm, `within_declarations`
leaves the fp32-bias declaration probes out of the source (the record's `left_out` names them and why): the
output-dtype-bias probes exercise its declaration, and the accounting says which arm takes its bias how
(`bias`), so an fp32 bias it never declared is neither run nor counted as unexercised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from alibi.exact.emulator import BIAS_MODES, ORDERS, EpilogueModel, apply_epilogue, exact_accumulator
from alibi.exact.numerics import bitwise_equal_mask, dtype_name

ATTRIBUTES = ("scale order", "intermediate rounding", "bias mode")
REQUIRED_CONTEXTS = ("bfloat16 decode", "bfloat16 prefill", "float16 decode", "float16 prefill")


def context(M: int, out_dtype: torch.dtype) -> str:
    """`bfloat16 decode` (M = 1), `float16 prefill` (M > 1), ..."""
    return f"{dtype_name(out_dtype)} {'decode' if M == 1 else 'prefill'}"


def alternatives(model: EpilogueModel) -> dict[str, list[EpilogueModel]]:
    """Every model that departs from `model` in one attribute, by attribute."""
    orders = [replace(model, order=o, round_between=model.round_between and o != "product_first")
              for o in ORDERS if o != model.order]
    rounding = [] if model.order == "product_first" else [replace(model, round_between=not model.round_between)]
    return {"scale order": orders, "intermediate rounding": rounding,
            "bias mode": [replace(model, bias=b) for b in BIAS_MODES if b != model.bias]}


def bias_in_output_dtype_only(kernel) -> bool:
    """Whether `kernel` declares its bias in the output dtype only (a recording wrapper passes it through)."""
    return bool(getattr(kernel, "bias_in_output_dtype", False))


def within_declarations(source, kernels: Sequence):
    """`source` less the tiles no declaration of `kernels` covers: for a source that claims to exercise every
    attribute (`record["exercises_declarations"]`), the fp32-bias declaration probes when a kernel takes its bias
    only in the output dtype (module docstring); the record's `left_out` names them and why. Any other source is
    returned as it is (a tile the user gave is run, and a kernel that cannot take it says so), and so is one
    already narrowed: applying this twice changes nothing. The manifest resource stays the source's: the same
    tiles were made or read, and the record says which of them this pair ran."""
    narrow = [k.name for k in kernels if bias_in_output_dtype_only(k)]
    if not narrow or not source.record.get("exercises_declarations"):
        return source
    fp32_bias = [t for t in source.tiles if t.meta.get("kind") == "declaration-probe" and t.bias is not None
                 and t.bias.dtype != t.out_dtype]
    if not fp32_bias:
        return source
    who = " and ".join(f"`{n}`" for n in dict.fromkeys(narrow))
    record = {**source.record, "left_out": {
        "tiles": [t.name for t in fp32_bias],
        "because": f"{who} take{'s' if len(set(narrow)) == 1 else ''} a bias only in the output dtype: a float32 "
                   "bias is no part of its declaration, so the float32-bias declaration probes are left out for "
                   "this pair (the output-dtype-bias probes exercise its bias mode)"}}
    left_out = {id(t) for t in fp32_bias}
    return replace(source, tiles=tuple(t for t in source.tiles if id(t) not in left_out), record=record)


def exercised(pair, tiles: Iterable, regimes: Iterable[str], apply_regime: Callable) -> dict[str, Any]:
    """The accounting (module docstring) of `pair`'s declarations on `tiles` under `regimes` (each tile under a
    regime as `apply_regime(tile, regime)` gives it: the pipeline's): per arm, its declared model(s) and, per
    attribute and context, the alternatives that did not show (an empty list: exercised)."""
    arms = {"a": pair.a, "b": pair.b}
    missing: dict[str, dict[str, dict[str, dict[str, EpilogueModel]]]] = {arm: {} for arm in arms}
    declared: dict[str, set[str]] = {arm: set() for arm in arms}
    seen: set[str] = set()
    # biased and small tiles first: they show most alternatives, so the others are mostly skipped (`todo`)
    for tile in sorted(tiles, key=lambda t: (t.bias is None, t.M * t.N * t.K)):
        if tile.fmt != "int8":
            continue
        ctx = context(tile.M, tile.out_dtype)
        seen.add(ctx)
        todo = {}
        for arm, kernel in arms.items():
            at = getattr(kernel, "epilogue_at", None)
            model = at(tile.M) if at is not None else kernel.epilogue
            if model is None:
                continue
            declared[arm].add(model.name)
            entry = missing[arm].setdefault(ctx, {})
            key = f"{ctx}:{model.name}"
            if key not in entry:  # every alternative still to show, until a tile shows it
                entry[key] = {attr: {m.name: m for m in alts} for attr, alts in alternatives(model).items()}
            pending = {attr: alts for attr, alts in entry[key].items()
                       if alts and (attr != "bias mode" or tile.bias is not None)}  # without a bias no bias mode shows
            if pending:
                todo[arm] = (model, pending)
        if not todo:
            continue
        acc = exact_accumulator(tile.a_q, tile.w_q)
        for regime in regimes:
            t = apply_regime(tile, regime)
            outs: dict[str, torch.Tensor] = {}

            def out(model: EpilogueModel, t=t, outs=outs) -> torch.Tensor:
                if model.name not in outs:
                    outs[model.name] = apply_epilogue(model, acc, t.s_a, t.s_w, t.bias, t.out_dtype)
                return outs[model.name]
            for model, pending in todo.values():
                for attr, alts in pending.items():
                    shown = [n for n, alt in alts.items() if not bool(bitwise_equal_mask(out(model), out(alt)).all())]
                    for name in shown:
                        del alts[name]
    result: dict[str, Any] = {}
    for arm in arms:
        per_attr: dict[str, dict[str, list[str]]] = {attr: {} for attr in ATTRIBUTES}
        for ctx, entries in missing[arm].items():
            for attr in ATTRIBUTES:
                per_attr[attr][ctx] = sorted({name for pending in entries.values() for name in pending[attr]})
        result[arm] = {"declares": sorted(declared[arm]), "kernel": arms[arm].name,
                       "bias": "output dtype only" if bias_in_output_dtype_only(arms[arm]) else "float32 or output dtype",
                       "not_shown": {attr: {ctx: alts for ctx, alts in sorted(by_ctx.items()) if alts}
                                     for attr, by_ctx in per_attr.items()},
                       "contexts": sorted(missing[arm])}
    return {"contexts": sorted(seen), "required_contexts": list(REQUIRED_CONTEXTS), "arms": result}


def unexercised(accounting: dict[str, Any], required: Iterable[str] = REQUIRED_CONTEXTS) -> list[str]:
    """One line per (arm, attribute, context) that the accounting shows not exercised, or a required context no
    tile had: why a verdict that would pass is inconclusive."""
    lines = []
    for arm, rec in accounting["arms"].items():
        if not rec["declares"]:
            continue
        who = f"arm {arm} (`{rec['kernel']}`, declares {', '.join(rec['declares'])})"
        for ctx in required:
            if ctx not in rec["contexts"]:
                lines.append(f"exercised: no tile in {ctx} (output dtype, M) for {who}: no attribute of its "
                             "declaration was tested there")
        for attr in ATTRIBUTES:
            for ctx, alts in rec["not_shown"][attr].items():
                lines.append(f"exercised: {attr} of {who} not exercised in {ctx}: no tile gives other bits under "
                             f"{', '.join(alts)}, so a kernel departing that way would pass")
    return lines


__all__ = ["ATTRIBUTES", "REQUIRED_CONTEXTS", "alternatives", "bias_in_output_dtype_only", "context", "exercised",
           "unexercised", "within_declarations"]
