"""Certify a pair from its declared epilogue models alone, without running either kernel (`alibi predict-pair`).

For int8 tiles whose accumulator cannot wrap, a kernel held to its declared model (by `alibi conform`,
`alibi identify`, or its own tests) computes exactly `apply_epilogue(model, exact accumulator, ...)`.
Two such kernels therefore differ on a tile exactly where their two models do, and nowhere else:
this module computes that set per tile and scale regime, and names what in the models causes it
(`alibi.conform.judge.difference_cause`). Zero predicted differences on every tile is a certificate that
the pair is bitwise interchangeable there — conditional on each kernel equalling its declared model,
which is what the epilogue-model check of `alibi conform` establishes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from alibi.conform.results import Regime
from alibi.errors import InputError
from alibi.io.typed import TypedResult

SCHEMA = "alibi.pair-prediction/v1"


class PairVerdict(StrEnum):
    """What the declared models predict for a pair: no difference anywhere, some, or nothing (an int32
    accumulator may wrap)."""

    BITWISE = "bitwise"
    DIFFERS = "differs"
    UNDECIDED = "undecided"


@dataclass(frozen=True)
class PredictedUnit:
    """One tile under one regime: n_predicted elements where the models differ, of n_elements; cause (None
    when there are none); wrap_possible: the int32 accumulator may wrap, so no prediction is made."""

    tile: str
    regime: Regime
    n_elements: int
    n_predicted: int | None
    cause: str | None
    wrap_possible: bool


@dataclass(frozen=True)
class PairPrediction(TypedResult):
    """The declared-model prediction for a pair over a tile source. verdict: `bitwise` (no predicted
    difference anywhere), `differs` (some), `undecided` (a tile whose accumulator may wrap)."""

    SCHEMA = SCHEMA
    JSON_INDENT = 2
    REMEDY = "re-run `alibi predict-pair`"

    model_a: str
    model_b: str
    source: dict[str, Any]
    verdict: PairVerdict
    units: tuple[PredictedUnit, ...]
    schema: str = SCHEMA


def declared_model(name: str):
    """The epilogue model a kernel declares (registry name), or a model named directly (`w_then_a+fma`)."""
    # deferred: keeps torch out of start-up
    from alibi.exact.emulator import BIAS_MODES, ORDERS, EpilogueModel
    from alibi.kernels.registry import get_kernel, kernel_names

    if name in kernel_names():
        model = get_kernel(name).epilogue
        if model is None:
            raise InputError(f"kernel {name!r} declares no epilogue model, so nothing can be predicted for it; "
                             "give a kernel that declares one, or a model such as w_then_a+fma")
        return model
    try:
        return EpilogueModel.parse(name)
    except InputError:
        raise InputError(f"{name!r} is neither a kernel (see 'alibi kernels') nor an epilogue model "
                         f"(<{'|'.join(ORDERS)}>[+{'|'.join(BIAS_MODES)}][+round_between]"
                         "[+absmax_stats*<constant>])") from None


def predict_pair(a: str, b: str, source, regimes=("real", "pow2")) -> PairPrediction:
    """Predict, per tile and regime, where the declared models of `a` and `b` differ (no kernel runs). On a source
    that claims every attribute, a kernel that takes its bias only in the output dtype is not predicted on the
    fp32-bias probes it never takes (`alibi.conform.exercised.within_declarations`; the source record says so)."""
    # deferred: keeps torch out of start-up
    from alibi.conform.exercised import within_declarations
    from alibi.conform.judge import difference_cause
    from alibi.conform.pipeline import apply_regime, check_device, prepare, validate_regimes
    from alibi.exact.emulator import apply_epilogue, predict_tile
    from alibi.exact.numerics import bitwise_differ_mask
    from alibi.kernels.registry import get_kernel, kernel_names

    ma, mb = declared_model(a), declared_model(b)
    regimes = validate_regimes(regimes)
    source = within_declarations(source, [get_kernel(n) for n in (a, b) if n in kernel_names()])
    units = []
    for tile in source.tiles:
        if tile.fmt != "int8":
            raise InputError(f"tile {tile.name!r} is {tile.fmt}: the declared models predict exact differences "
                             "for int8 tiles only (fp8 accumulation order is implementation-defined)")
        prepared = prepare(tile, check_device())
        int32_safe = predict_tile(prepared.tile, prepared.acc).int32_safe
        for regime in regimes:
            t = apply_regime(prepared.tile, regime)
            if not int32_safe:
                units.append(PredictedUnit(t.name, regime, t.M * t.N, None, None, True))
                continue
            out_a = apply_epilogue(ma, prepared.acc, t.s_a, t.s_w, t.bias, t.out_dtype)
            out_b = out_a if ma == mb else apply_epilogue(mb, prepared.acc, t.s_a, t.s_w, t.bias, t.out_dtype)
            n = int(bitwise_differ_mask(out_a, out_b).sum())
            units.append(PredictedUnit(t.name, regime, t.M * t.N, n,
                                       difference_cause(ma, mb, out_a, out_b, prepared.acc, t) if n else None, False))
    verdict = (PairVerdict.UNDECIDED if any(u.wrap_possible for u in units)
               else PairVerdict.DIFFERS if any(u.n_predicted for u in units) else PairVerdict.BITWISE)
    return PairPrediction(ma.name, mb.name, source.record, verdict, tuple(units))


__all__ = ["SCHEMA", "PairPrediction", "PairVerdict", "PredictedUnit", "declared_model", "predict_pair"]
