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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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


__all__ = ["ATTRIBUTES", "REQUIRED_CONTEXTS", "alternatives", "context", "exercised", "unexercised"]
