"""Judging units in batches: every check of every unit of one shape at once, with one transfer to the host.

A conformance unit's checks are a few dozen reductions over its outputs; run one unit at a time, a capture
of small tiles is bound by per-operation overhead and device synchronizations, not by arithmetic
(`alibi bench conform`). So the pipeline first runs the kernels of a group of units whose tiles share a
shape (`UnitRun`: the outputs, the operands as each arm held them, the invariance runs), then `measure` stacks
the group into tensors [B, ...] and queues each check's measurement on the whole batch (`alibi.conform.checks`:
every measurement is elementwise, or a reduction over one unit's own elements) without waiting for the device;
what depends only on the scales is known on the host before (`ScaleFacts`). `Measurement.collect` then brings
every unit's numbers, first differences and causes to the host in one transfer, and `Measurement.verdicts` builds
each unit's verdicts from them; the pipeline does host work of the next batch in between. On a GPU the device work
of a batch is replayed from a CUDA graph of its layout (`BatchLayout`, `alibi.conform.judge_graphs`). A unit's
numbers are exactly those it gets alone: a batch of one is the same code (tests/conform/test_results_unchanged.py
holds the reports to the bytes of the unit-by-unit pipeline).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from alibi.conform import checks
from alibi.conform.differences import DIFFERENCE_CAP, LISTED_COLUMNS, differences_from, listed_differences
from alibi.conform.judge_graphs import judge_graphs
from alibi.conform.results import Safety, UnitResult
from alibi.exact.emulator import EpilogueModel, Prediction, apply_epilogue, int32_wrap, prediction
from alibi.exact.fp8_block_mma import BlockSchedule, accumulate_blocks, block_schedule_differences
from alibi.exact.fp8_mma import AccumulationSchedule, accumulate
from alibi.exact.numerics import bitwise_differ_mask, compare_outputs, dtype_name, is_pow2, is_subnormal
from alibi.kernels.base import OPERANDS
from alibi.kernels.cpu import unit_scales
from alibi.tiles.tile import Tile

Stage = Callable[[str], AbstractContextManager[None]]


@dataclass(frozen=True)
class ScaleFacts:
    """What a unit's checks know of its scales before any launch, found where the tile's scales lie (the host, for
    files and presets): whether every weight scale is a power of two (`all_pow2`), how many weight scales its
    regime changed (`changed`), and how many activation and weight scales are subnormal (`subnormal`)."""

    all_pow2: bool
    changed: int
    subnormal: int

    @classmethod
    def of_units(cls, units: list[tuple[Tile, Tile]]) -> list[ScaleFacts]:
        """The facts of each (original, t) of `units` — t the tile `original` under a regime, all of one shape — at
        once (one transfer when the scales are on a GPU)."""
        n = len(units)
        s_a = torch.stack([t.s_a for _, t in units]).reshape(n, -1)
        s_w = torch.stack([t.s_w for _, t in units]).reshape(n, -1)
        original = torch.stack([o.s_w for o, _ in units]).reshape(n, -1)
        columns = torch.stack([is_pow2(s_w).all(1).to(torch.int64), (original != s_w).sum(1),
                               is_subnormal(s_a).sum(1) + is_subnormal(s_w).sum(1)]).tolist()
        return [cls(bool(all_pow2), changed, subnormal) for all_pow2, changed, subnormal in zip(*columns, strict=True)]


@dataclass
class PreparedTile:
    """A tile on the check device with what both regimes share: the exact accumulator (int8), each arm's exposed
    accumulator once a check has asked for it, and per regime the tile under it (`regimes`) and its scale facts
    (`facts`)."""

    tile: Tile
    acc: torch.Tensor | None
    regimes: dict[str, Tile]
    facts: dict[str, ScaleFacts]
    exposed: dict[str, torch.Tensor | None] = field(default_factory=dict)
    scheduled: dict[Any, torch.Tensor] = field(default_factory=dict)  # fp8: model accumulators

    def scheduled_accumulator(self, schedule: AccumulationSchedule | BlockSchedule, tile: Tile | None = None,
                              regime: str = "real") -> torch.Tensor:
        """The fp32 accumulator `schedule` prescribes for this fp8 tile (computed once, shared by both regimes); a
        block schedule's includes the scales, so it is computed once per regime, on `tile` (this tile under it)."""
        if isinstance(schedule, BlockSchedule):
            t = tile or self.tile
            key: Any = (schedule, regime)
            if key not in self.scheduled:
                self.scheduled[key] = accumulate_blocks(schedule, t.a_q, t.s_a, t.w_q, t.s_w, t.block_layout)
            return self.scheduled[key]
        if schedule not in self.scheduled:
            self.scheduled[schedule] = accumulate(schedule, self.tile.a_q, self.tile.w_q)
        return self.scheduled[schedule]


@dataclass
class UnitRun:
    """What both arms produced for one unit (a prepared tile under one regime), on the check device: `tile` with
    the regime's scales, each arm's output, the operands as each arm held them after its run, and — in the real
    regime, with invariance on — the sub-batch outputs and a second run of each arm."""

    prepared: PreparedTile
    regime: str
    tile: Tile
    out_a: torch.Tensor
    out_b: torch.Tensor
    operands_a: dict[str, torch.Tensor | None]
    operands_b: dict[str, torch.Tensor | None]
    subsets: dict[str, list[tuple[list[int], torch.Tensor]]] | None
    again: dict[str, torch.Tensor] | None
    evidence: dict[str, dict[str, Any]]
    own_exposed: dict[str, torch.Tensor | None] | None = None
    """Block-scaled tiles, whose accumulators include the scales: what each arm exposed on this unit's launch
    (else None, and the accumulators the tile's first launches exposed are shared by its regimes)."""

    def exposed_accumulator(self, arm: str) -> torch.Tensor | None:
        return self.prepared.exposed.get(arm) if self.own_exposed is None else self.own_exposed.get(arm)

    def shape_key(self) -> tuple:
        """What units must share to be judged as one batch (the operands are copies of the tile's, so its shape,
        format, bias and scale layout fix theirs)."""
        exposed = tuple(None if x is None else tuple(x.shape) for x in (self.exposed_accumulator("a"),
                                                                          self.exposed_accumulator("b")))
        return (*tile_key(self.tile), tuple(self.out_a.shape), tuple(self.out_b.shape), exposed)


def tile_key(t: Tile) -> tuple:
    """What tiles must share for their units to stack into one batch: format, shape, output dtype, bias presence
    and scale layout."""
    return (t.fmt, t.M, t.N, t.K, t.out_dtype, t.bias is None, tuple(t.s_a.shape), tuple(t.s_w.shape))


def bias_handling(model: EpilogueModel | None) -> str | None:
    """How a model's bias meets the product, for the pow2 identity: its bias mode, plus the rounding to the output
    dtype between the scales when it has one (a bias then meets an already rounded product, whatever the scales)."""
    if model is None:
        return None
    return model.bias + ("+round_between" if model.round_between else "")


def uses_statistics(*models: EpilogueModel | None) -> bool:
    return any(m is not None and m.statistics is not None for m in models)


def difference_causes(a: EpilogueModel, b: EpilogueModel, out_a: torch.Tensor, out_b: torch.Tensor,
                      acc: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor, bias: torch.Tensor | None,
                      out_dtype: torch.dtype, acc_b: torch.Tensor | None = None) -> torch.Tensor:
    """Per unit of a batch ([B, M, N] model outputs `out_a`, `out_b` on accumulators `acc`): which steps from model
    a to model b change bits, as a [steps, B] bool tensor over `cause_steps(a, b, bias)` (preceded, for fp8 arms
    whose declared schedules give another accumulator `acc_b`, by the accumulation step).

    The models are walked from a to b one attribute at a time (the accumulator; statistics, order, the rounding
    between the scales, the bias mode; the rounding before the order when b's order is product_first, which has
    none), each step taken only where the attribute differs (the bias mode only with a bias)."""
    changed, current, out_current = [], a, out_a
    if acc_b is not None:
        out_next = out_b if a == b else apply_epilogue(a, acc_b, s_a, s_w, bias, out_dtype)
        changed.append(checks.anywhere(bitwise_differ_mask(out_current, out_next)))
        acc, out_current = acc_b, out_next
    for _label, attr in cause_steps(a, b, bias is not None):
        nxt = replace(current, **{attr: getattr(b, attr)})
        out_next = out_b if nxt == b else apply_epilogue(nxt, acc, s_a, s_w, bias, out_dtype)
        changed.append(checks.anywhere(bitwise_differ_mask(out_current, out_next)))
        current, out_current = nxt, out_next
    return torch.stack(changed) if changed else torch.zeros((0, out_a.shape[0]), dtype=torch.bool)


def cause_steps(a: EpilogueModel, b: EpilogueModel, bias: bool) -> list[tuple[str, str]]:
    """The (label, attribute) steps from model a to model b, in walking order (`difference_causes`)."""
    steps = [("statistics", "statistics"), ("scale order", "order"), ("intermediate rounding", "round_between"),
             ("bias mode", "bias")]
    if b.order == "product_first":
        steps[1], steps[2] = steps[2], steps[1]
    taken, current = [], a
    for label, attr in steps:
        if getattr(current, attr) == getattr(b, attr) or (attr == "bias" and not bias):
            continue
        taken.append((label, attr))
        current = replace(current, **{attr: getattr(b, attr)})
    return taken


def schedule_cause(a: AccumulationSchedule | BlockSchedule, b: AccumulationSchedule | BlockSchedule) -> str:
    """What differs between two declared fp8 accumulation schedules, as a cause label."""
    if isinstance(a, BlockSchedule) and isinstance(b, BlockSchedule):
        return f"accumulation schedule ({', '.join(block_schedule_differences(a, b)) or 'same'})"
    if isinstance(a, BlockSchedule) or isinstance(b, BlockSchedule):
        return "accumulation schedule (block-scaled against per-row)"
    parts = [label for label, differs in (("step model", a.step != b.step),
                                          ("promotion interval", a.promotion_k != b.promotion_k),
                                          ("split-K", a.split_k != b.split_k)) if differs]
    return f"accumulation schedule ({', '.join(parts) or 'same'})"


def difference_cause(a: EpilogueModel, b: EpilogueModel, out_a: torch.Tensor, out_b: torch.Tensor,
                     acc: torch.Tensor, tile: Tile) -> str | None:
    """What in the two declared models makes their outputs `out_a`, `out_b` differ on this tile: `scale order`,
    `intermediate rounding`, `bias mode`, `statistics` (a statistics-based dequantization), or several (joined by
    "and"), None where the models agree everywhere (`difference_causes` on a batch of one)."""
    changed = difference_causes(a, b, out_a.unsqueeze(0), out_b.unsqueeze(0), acc.unsqueeze(0), tile.s_a.unsqueeze(0),
                                tile.s_w.unsqueeze(0), None if tile.bias is None else tile.bias.unsqueeze(0),
                                tile.out_dtype)
    labels = [label for label, _ in cause_steps(a, b, tile.bias is not None)]
    return " and ".join(label for label, hit in zip(labels, changed[:, 0].tolist(), strict=True) if hit) or None


def _where(flags: list[bool]) -> list[int]:
    return [i for i, flag in enumerate(flags) if flag]


def _consecutive(units: list[int]) -> bool:
    return units == list(range(units[0], units[-1] + 1))


def _take(batch: torch.Tensor, units: list[int]) -> torch.Tensor:
    """The units `units` of a batch: a view when they are consecutive (the pipeline orders a batch's units by
    regime, so the real-scale and the power-of-two units each are), else a copy."""
    if _consecutive(units):
        return batch[units[0]:units[-1] + 1]
    return batch[torch.tensor(units, device=batch.device)]


def _spread_mask(mask: torch.Tensor, units: list[int]) -> dict[int, torch.Tensor]:
    """A mask measured on the units `units`, by unit index."""
    return {i: mask[k] for k, i in enumerate(units)}


def judge(pair, runs: list[UnitRun], stage: Stage, *, ulp_threshold: int = checks.DEFAULT_ULP_THRESHOLD,
          invariance: bool = True, graphs: bool = False) -> list[UnitResult]:
    """Every check of every unit in `runs` (module docstring): each batch `measure`d, then collected and judged."""
    return judged(measure(pair, runs, stage, ulp_threshold=ulp_threshold, invariance=invariance, graphs=graphs),
                  len(runs), stage)


def judged(measurements: list[Measurement], n: int, stage: Stage) -> list[UnitResult]:
    """The results of the `n` runs `measure` gave `measurements` of, each collected and judged, in the runs' order."""
    results: list[UnitResult | None] = [None] * n
    for batch in measurements:
        try:
            batch.collect(stage)
            for i, unit in zip(batch.indices, batch.verdicts(), strict=True):
                results[i] = unit
        finally:
            batch.release()
    return results  # type: ignore[return-value]


def measure(pair, runs: list[UnitRun], stage: Stage, *, ulp_threshold: int = checks.DEFAULT_ULP_THRESHOLD,
            invariance: bool = True, graphs: bool = False) -> list[Measurement]:
    """Queue every check's measurement of the units in `runs` on the check device, without waiting for any: runs
    whose tiles differ in shape, format or what the arms exposed are measured apart, one `Measurement` per batch.
    graphs: on a GPU, replay each batch's device work from a CUDA graph of its layout where one was captured
    (`alibi.conform.judge_graphs`: the same operations, so the same bits)."""
    batches: dict[tuple, list[int]] = {}
    for i, run in enumerate(runs):
        batches.setdefault(run.shape_key(), []).append(i)
    return [_measure_batch(pair, [runs[i] for i in indices], indices, stage, ulp_threshold, invariance, graphs)
            for indices in batches.values()]


@dataclass(frozen=True)
class Declarations:
    """What both arms declare for one batch's shape: each epilogue model at its M and, for fp8, each accumulation
    schedule at its M × N × K (`deterministic` schedules only are run; `nondeterministic` is named in the verdict)."""

    a: EpilogueModel | None
    b: EpilogueModel | None
    schedule_a: AccumulationSchedule | None = None
    schedule_b: AccumulationSchedule | None = None

    @classmethod
    def of(cls, pair, t: Tile) -> Declarations:
        def epilogue(k):
            at = getattr(k, "epilogue_at", None)
            return at(t.M) if at is not None else k.epilogue

        def schedule(k):
            at = getattr(k, "schedule_at", None)
            return at(t.M, t.N, t.K) if at is not None and t.fmt != "int8" else None
        return cls(epilogue(pair.a), epilogue(pair.b), schedule(pair.a), schedule(pair.b))

    def schedule(self, arm: str) -> AccumulationSchedule | None:
        s = self.schedule_a if arm == "a" else self.schedule_b
        return s if s is not None and s.deterministic else None

    def label(self, arm: str) -> str | None:
        """The declaration an arm's output is held to: its epilogue, after its schedule for fp8."""
        model, s = (self.a, self.schedule_a) if arm == "a" else (self.b, self.schedule_b)
        if model is None:
            return None
        return model.name if s is None else f"{s.label}:{model.name}"


def unjudged_fp8_reason(d: Declarations, names: dict[str, str], t: Tile) -> str:
    """Why an fp8 unit's differences are not predicted: an arm declares no schedule, or a nondeterministic one at
    this shape (named), or no epilogue model."""
    why = []
    for arm in ("a", "b"):
        s = d.schedule_a if arm == "a" else d.schedule_b
        model = d.a if arm == "a" else d.b
        who = f"arm {arm} (`{names[arm]}`)"
        if model is None:
            why.append(f"{who} declares no epilogue model")
        elif s is None:
            why.append(f"{who} declares no fp8 accumulation schedule here")
        elif not s.deterministic:
            why.append(f"{who} declares a nondeterministic reduction at M={t.M}, N={t.N}, K={t.K} ({s.describe()})")
    return "; ".join(why) + ": the exact set of differences is not predicted"


@dataclass(frozen=True)
class BatchLayout:
    """What fixes a batch's device work (`measured`), known on the host before anything is measured: its size, the
    format and output dtype, both arms' declarations, whether scales sit in blocks and a bias is added, which units
    are power-of-two, real-scale or run for invariance (and the invariance runs' rows), the ulp threshold, and each
    input's shape, dtype and device (`inputs`: the tensors `batch_inputs` stacks). Two batches of one layout run the
    same device operations on different values: the key of the batch's CUDA graph (`alibi.conform.judge_graphs`)."""

    B: int
    int8: bool
    dtype: torch.dtype
    decl: Declarations
    block: bool
    bias: bool
    pow2_units: tuple[int, ...]
    real_units: tuple[int, ...]
    any_real: bool
    invariance_units: tuple[int, ...]
    subset_rows: tuple[tuple[tuple[int, ...], ...], ...]  # per arm (a, b): each invariance run's rows
    ulp_threshold: int
    inputs: tuple[tuple[str, tuple[int, ...], torch.dtype, torch.device], ...]

    @classmethod
    def of(cls, pair, runs: list[UnitRun], tensors: dict[str, list[torch.Tensor]], ulp_threshold: int
           ) -> BatchLayout:
        t0 = runs[0].tile
        int8 = t0.fmt == "int8"
        decl = Declarations.of(pair, t0)
        invariance = tuple(i for i, r in enumerate(runs) if r.subsets is not None)
        rows = tuple(tuple(tuple(rows) for rows, _ in runs[invariance[0]].subsets[arm]) if invariance else ()
                     for arm in ("a", "b"))
        return cls(len(runs), int8, t0.out_dtype, decl, t0.block_layout is not None, t0.bias is not None,
                   tuple(_where([r.prepared.facts[r.regime].all_pow2 for r in runs]))
                   if int8 and not uses_statistics(decl.a, decl.b) else (),
                   tuple(_where([r.regime == "real" for r in runs])) if int8 else (),
                   any(r.regime == "real" for r in runs), invariance, rows, ulp_threshold,
                   tuple((name, (len(ts), *ts[0].shape), ts[0].dtype, ts[0].device) for name, ts in tensors.items()))

    @property
    def same_schedule(self) -> bool:
        """Both arms' outputs are modelled on one accumulator: int8's exact one, or one deterministic schedule."""
        d = self.decl
        return self.int8 or (d.schedule("a") is not None and d.schedule("a") == d.schedule("b"))

    @property
    def predicted(self) -> bool:
        """The differences between the arms are predicted: both declare a model and, for fp8, a schedule."""
        d = self.decl
        return d.a is not None and d.b is not None and (self.int8 or sum(
            d.schedule(arm) is not None for arm in ("a", "b")) == 2)

    @property
    def cause_labels(self) -> list[str]:
        """What each step of `difference_causes` changes (`cause_{j}`), in walking order."""
        if not self.predicted:
            return []
        d = self.decl
        return ([schedule_cause(d.schedule_a, d.schedule_b)] if not self.same_schedule else []) + \
            [label for label, _ in cause_steps(d.a, d.b, self.bias)]

    @property
    def capturable(self) -> bool:
        """The batch's units of each kind lie side by side (as the pipeline orders them), so every part of the batch
        is a view: a list of scattered units would be copied through an index made on the host."""
        return all(_consecutive(list(units)) for units in (self.pow2_units, self.real_units, self.invariance_units)
                   if units)


def batch_inputs(decl: Declarations, runs: list[UnitRun]) -> dict[str, list[torch.Tensor]]:
    """Every tensor a batch's measurement reads, per unit, by name (each stacked into one [B, ...] tensor): the outputs,
    scales and bias; int8: the exact accumulator and the operands as prepared; what each arm exposed and, fp8, the
    accumulator its declared schedule prescribes; the operands as each arm left them (an arm's when every unit has
    it); the invariance runs' outputs (on their units only)."""
    t0 = runs[0].tile
    int8 = t0.fmt == "int8"
    tiles = [r.tile for r in runs]
    x = {"out_a": [r.out_a for r in runs], "out_b": [r.out_b for r in runs], "s_a": [t.s_a for t in tiles],
         "s_w": [t.s_w for t in tiles]}
    if t0.bias is not None:
        x["bias"] = [t.bias for t in tiles]
    if int8:
        x |= {"acc": [r.prepared.acc for r in runs], "a_q": [r.prepared.tile.a_q for r in runs],
              "w_q": [r.prepared.tile.w_q for r in runs]}
    for arm in ("a", "b"):
        exposed = [r.exposed_accumulator(arm) for r in runs]
        if all(e is not None for e in exposed):
            x[f"exposed_{arm}"] = exposed
        if not int8 and decl.schedule(arm) is not None:
            # the fp32 accumulator the arm's declared schedule prescribes (`alibi.exact.fp8_mma`)
            x[f"scheduled_{arm}"] = [r.prepared.scheduled_accumulator(decl.schedule(arm), r.tile, r.regime)
                                     for r in runs]
    for key in sorted(OPERANDS):
        for arm in ("a", "b"):
            held = [(r.operands_a if arm == "a" else r.operands_b)[key] for r in runs]
            if all(v is not None for v in held):
                x[f"operand_{arm}:{key}"] = held
    invariance = [r for r in runs if r.subsets is not None]
    for arm in ("a", "b"):
        for j in range(len(invariance[0].subsets[arm]) if invariance else 0):
            x[f"subset_{arm}:{j}"] = [r.subsets[arm][j][1] for r in invariance]
        if invariance:
            x[f"again_{arm}"] = [r.again[arm] for r in invariance]
    return x


@dataclass
class Measured:
    """A batch's measurement on the check device (`measured`): every value measured and then each unit's first
    differing elements, in one float64 tensor (`numbers`, read back by `checks.spread` with `on`: the units of a value
    measured on some of them only; and `alibi.conform.differences.differences_from`), the masks
    a fired check reads its first mismatch from, the outputs and their comparison, and what the verdicts read
    where a check fires (each arm's accumulators, each arm's output against its model's)."""

    numbers: checks.Gathered
    on: dict[str, list[int]]
    masks: dict[str, Any]
    out_a: torch.Tensor
    out_b: torch.Tensor
    differs: torch.Tensor
    ulp: torch.Tensor
    accumulators: dict[str, Any]
    models: dict[str, tuple[torch.Tensor, torch.Tensor | None]]


def measured(layout: BatchLayout, x: dict[str, torch.Tensor], stage: Stage) -> Measured:
    """Every check's measurement of one batch (`layout`; its inputs stacked, `x`), queued on the check device: device
    work only, nothing waited for, no tensor made from the host's values, so a CUDA graph can hold all of it."""
    int8, dtype, decl, B = layout.int8, layout.dtype, layout.decl, layout.B
    ma, mb = decl.a, decl.b
    out_a, out_b, s_a, s_w, bias = x["out_a"], x["out_b"], x["s_a"], x["s_w"], x.get("bias")
    pow2_units, real_units = list(layout.pow2_units), list(layout.real_units)
    with stage("reference"):
        acc = x.get("acc")
        acc32 = int32_wrap(acc) if int8 else None  # what an int32 register holds, taken once for every model
        exposed = {arm: x.get(f"exposed_{arm}") for arm in ("a", "b")}
        scheduled = {arm: x[f"scheduled_{arm}"] for arm in ("a", "b") if f"scheduled_{arm}" in x}
        # block-scaled tiles: the scales are inside the accumulators, so the epilogue models run with scales of 1
        es_a, es_w = (s_a, s_w) if not layout.block else unit_scales(out_a)

        # int8: every arm is held to its model applied to the exact accumulator; fp8: to its declared epilogue applied
        # to the accumulator its declared schedule prescribes, or, declaring no schedule, to its epilogue applied to its
        # *own* exposed fp32 accumulator (unjudged when it exposes none).
        def model_out(model: EpilogueModel | None, arm: str) -> torch.Tensor | None:
            base = acc32 if int8 else scheduled.get(arm, exposed[arm])
            return None if model is None or base is None else apply_epilogue(model, base, es_a, es_w, bias, dtype)
        expect_a = model_out(ma, "a")
        expect_b = expect_a if (layout.same_schedule and ma is not None and ma == mb) else model_out(mb, "b")
        # The pow2 identity's fp32 reference, on the units whose weight scales are all powers of two (known on the
        # host: `ScaleFacts`); the exact values (fp64) of the near-zero split, on the real-scale units.
        reference_fp32 = (apply_epilogue(EpilogueModel("a_then_w"), _take(acc32, pow2_units), _take(s_a, pow2_units),
                                         _take(s_w, pow2_units), None, torch.float32) if pow2_units else None)
        exact = None
        if real_units:
            exact = _take(acc, real_units).to(torch.float64) * _take(s_a, real_units).to(torch.float64).reshape(
                len(real_units), -1, 1) * _take(s_w, real_units).to(torch.float64).reshape(len(real_units), 1, -1)
            if bias is not None:
                exact = exact + _take(bias, real_units).to(torch.float64).reshape(len(real_units), 1, -1)
    with stage("checks"):
        comparison = compare_outputs(out_a, out_b)
        differs, ulp = comparison.differs, comparison.ulp
        m: dict[str, torch.Tensor | checks.Counted] = {"n_differing": checks.count(differs),
                                                       "max_ulp": checks.largest(ulp)}
        on: dict[str, list[int]] = {}  # the units of a value measured on some of them only (`checks.spread`)

        def measured_on(units: list[int], values: dict[str, torch.Tensor]) -> None:
            m.update(values)
            on.update(dict.fromkeys(values, units))
        masks: dict[str, Any] = {}
        expected_acc = acc32
        if int8:
            m.update(max_abs_acc=checks.largest(acc.abs()), a_has_min=checks.anywhere(x["a_q"] == -128),
                     w_has_min=checks.anywhere(x["w_q"] == -128))
            for arm in ("a", "b"):
                if exposed[arm] is not None and exposed[arm].shape == expected_acc.shape:
                    masks[f"acc_{arm}"] = checks.accumulator_mismatch(exposed[arm], expected_acc)
                    m[f"acc_{arm}"] = checks.count(masks[f"acc_{arm}"])
        for key in sorted(OPERANDS):
            a, b = x.get(f"operand_a:{key}"), x.get(f"operand_b:{key}")
            if a is None and b is None:  # a batch's tiles all have the operand or all lack it (`tile_key`)
                continue
            differ = checks.operands_differ(a, b)
            m[f"operands_{key}"] = (torch.ones(B, dtype=torch.bool, device=differs.device) if differ is True
                                    else differ.to(differs.device))
        for arm in ("a", "b") if not int8 else ():
            if arm in scheduled and exposed[arm] is not None and exposed[arm].shape == scheduled[arm].shape:
                masks[f"acc_{arm}"] = bitwise_differ_mask(exposed[arm], scheduled[arm])
                m[f"acc_{arm}"] = checks.count(masks[f"acc_{arm}"])
        if layout.predicted:
            predicted = bitwise_differ_mask(expect_a, expect_b)
            pd, masks["predicted"] = checks.predicted_differences_measure(differs, predicted)
            m.update({f"pd_{k}": v for k, v in pd.items()})
            # which step from model a to model b changes bits (`difference_causes`), read where differences are
            # predicted
            causes = difference_causes(ma, mb, expect_a, expect_b, acc32 if int8 else scheduled["a"],
                                       *((s_a, s_w) if int8 else (es_a, es_w)), bias, dtype,
                                       None if layout.same_schedule else scheduled["b"])
            m.update({f"cause_{j}": changed for j, changed in enumerate(causes)})
        for arm, out, expected in (("a", out_a, expect_a), ("b", out_b, expect_b)):
            if expected is not None:
                em, masks[f"em_{arm}"] = checks.epilogue_model_measure(out, expected)
                m.update({f"em_{arm}_{k}": v for k, v in em.items()})
        if pow2_units:
            p2, judged = checks.pow2_identity_measure(_take(differs, pow2_units), reference_fp32)
            masks["pow2"] = _spread_mask(judged, pow2_units)
            measured_on(pow2_units, {f"pow2_{k}": v for k, v in p2.items()})
        if real_units:
            near_units = _take(differs, real_units), _take(ulp, real_units)
            top, near = checks.near_zero_mask(exact, dtype_name(dtype))
            nz, above = checks.near_zero_measure(*near_units, top, near)
            nz["max_rel_above_floor"] = checks.max_relative_difference(
                _take(out_a, real_units), _take(out_b, real_units), exact, above & near_units[0])
            measured_on(real_units, {f"nz_{k}": v for k, v in nz.items()})
            measured_on(real_units, {f"rt_{k}": v for k, v in checks.real_scale_tolerance_measure(
                near_units[1], near_units[0], layout.ulp_threshold, near).items()})
        elif layout.any_real:  # fp8: no exact values, no near-zero split
            m.update({f"rt_{k}": v for k, v in
                      checks.real_scale_tolerance_measure(ulp, differs, layout.ulp_threshold, None).items()})
        if layout.invariance_units:
            measured_on(list(layout.invariance_units), _invariance_measure(layout, x, out_a, out_b))
        expected = {"a": expected_acc, "b": expected_acc} if int8 else {arm: scheduled.get(arm) for arm in ("a", "b")}
        # every unit's first differing elements (`alibi.conform.differences`) come over with the values
        listed = listed_differences(out_a, out_b, differs, ulp)
        return Measured(checks.gathered(m, listed.reshape(-1)), on, masks, out_a, out_b, differs, ulp,
                        {"a": exposed["a"], "b": exposed["b"], "expected": expected},
                        {"a": (out_a, expect_a), "b": (out_b, expect_b)})


@dataclass
class Measurement:
    """One batch's checks as queued on the check device (`measure`; `measured` holds its tensors, `layout` what
    fixes them), with what the host phase needs. `collect` brings the numbers and the first differences to the host
    in one transfer; `verdicts` builds each unit's result from them; `release`
    hands a replayed batch's CUDA graph back for the next batch of its layout. The device work of a later batch
    may be queued between `measure` and `collect` (`alibi.conform.pipeline.evaluate_batches`)."""

    pair: Any
    runs: list[UnitRun]
    indices: list[int]  # each run's place in the runs given to `measure`
    layout: BatchLayout
    invariance: bool
    measured: Measured
    release: Callable[[], None] = lambda: None
    values: list[dict[str, float]] = field(default_factory=list)
    differences: list[Any] = field(default_factory=list)
    causes: list[str | None] = field(default_factory=list)

    def collect(self, stage: Stage) -> None:
        """The batch's numbers on the host (`values`), each unit's first differences and cause."""
        with stage("checks"):
            got = self.measured
            flat = got.numbers.flat.cpu().tolist()
            self.values = checks.spread(flat, got.numbers, got.on)
            for run, v in zip(self.runs, self.values, strict=True):
                facts = run.prepared.facts[run.regime]
                v.update(pow2_scales_changed=facts.changed, subnormal_scales=facts.subnormal)
            counts = [int(v["n_differing"]) for v in self.values]
            listed = flat[len(flat) - LISTED_COLUMNS * len(counts) * DIFFERENCE_CAP:]
            self.differences = differences_from(listed, counts, got.out_a.shape[-1], got.out_a.element_size())
            labels = self.layout.cause_labels
            self.causes = [" and ".join(label for j, label in enumerate(labels) if v[f"cause_{j}"]) or None
                           if v.get("pd_n_predicted") else None for v in self.values]

    def verdicts(self) -> list[UnitResult]:
        """Each unit's verdicts and result, from the numbers `collect` brought over."""
        got = self.measured
        return [_unit(self.pair, self.layout.decl, run, i, self.values[i], got.masks, self.differences[i],
                      self.causes[i], self.layout.ulp_threshold, self.invariance, got.accumulators, got.models)
                for i, run in enumerate(self.runs)]


def _measure_batch(pair, runs: list[UnitRun], indices: list[int], stage: Stage, ulp_threshold: int,
                   invariance: bool, graphs: bool) -> Measurement:
    tensors = batch_inputs(Declarations.of(pair, runs[0].tile), runs)
    layout = BatchLayout.of(pair, runs, tensors, ulp_threshold)
    got, release = judge_graphs().measure(layout, tensors,
                                          lambda x, timed: measured(layout, x, timed), stage, graphs=graphs,
                                          capturable=layout.capturable)
    return Measurement(pair, runs, indices, layout, invariance, got, release)


def _invariance_measure(layout: BatchLayout, x: dict[str, torch.Tensor], out_a: torch.Tensor, out_b: torch.Tensor
                        ) -> dict[str, torch.Tensor]:
    """M-invariance and run-to-run counts of the units with invariance runs (`layout.invariance_units`), one per such
    unit."""
    units = list(layout.invariance_units)
    full = {"a": _take(out_a, units), "b": _take(out_b, units)}
    m = {}
    for arm, subsets in zip(("a", "b"), layout.subset_rows, strict=True):
        for j, rows in enumerate(subsets):
            m[f"mi_{arm}_{j}"] = checks.count(bitwise_differ_mask(x[f"subset_{arm}:{j}"],
                                                                  full[arm][:, rows[0]:rows[-1] + 1]))
        m[f"rr_{arm}"] = checks.count(bitwise_differ_mask(full[arm], x[f"again_{arm}"]))
    return m


# The measurements whose values a unit's verdicts read as a group: each value's name starts with the group's name
# and an underscore (the model deviations' with their arm's too: `em_a_`, `em_b_`).
PARTS = ("pd", "nz", "rt", "operands", "em_a", "em_b")


def _parts(v: dict[str, float]) -> dict[str, dict[str, float]]:
    """The values of `v` by the measurement that gave them (`PARTS`), each by the name it gave them; one pass."""
    parts: dict[str, dict[str, float]] = {p: {} for p in PARTS}
    for k, x in v.items():
        head, _, rest = k.partition("_")
        if head == "em":
            arm, _, rest = rest.partition("_")
            head = f"em_{arm}"
        if head in parts:
            parts[head][rest] = x
    return parts


def _first(masks: dict[str, Any], name: str, i: int) -> Callable[[], list[int] | None]:
    return lambda: checks.first_mismatch(masks[name][i])


def _unit(pair, decl: Declarations, run: UnitRun, i: int, v: dict[str, float], masks: dict[str, torch.Tensor],
          differences, cause, ulp_threshold: int, invariance: bool, accumulators: dict[str, Any],
          models: dict[str, tuple[torch.Tensor, torch.Tensor | None]]) -> UnitResult:
    """One unit's verdicts and result from its numbers `v` (the keys `_measure_batch` measured, and its scale facts)."""
    t, regime = run.tile, run.regime
    int8 = t.fmt == "int8"
    ma, mb = decl.a, decl.b
    names = {"a": pair.a.name, "b": pair.b.name}
    parts = _parts(v)
    pred: Prediction | None = (prediction(int(v["max_abs_acc"]), bool(v["a_has_min"]), bool(v["w_has_min"]), t.K)
                               if int8 else None)
    if not int8 and "pd_n_predicted" not in v:
        pd, why_not = None, unjudged_fp8_reason(decl, names, t)
    elif not int8:
        pd, why_not = parts["pd"], ""
    elif ma is None or mb is None:
        pd, why_not = None, checks.undeclared_model_reason([arm for arm, m in (("a", ma), ("b", mb)) if m is None],
                                                           names)
    else:
        pd, why_not = parts["pd"], ""
    near = (checks.near_zero_result(parts["nz"], dtype_name(t.out_dtype))
            if int8 and regime == "real" else checks.NO_NEAR_ZERO)
    rt = parts["rt"]
    verdicts = [
        checks.shared_operands_verdict([k for k, x in parts["operands"].items() if x]),
        checks.int32_no_overflow(pred, t.K),
        checks.lossless_fp32_entry(pred),
        _accumulator_verdict(run, i, v, masks, accumulators) if int8 else _fp8_accumulator_verdict(decl, run, i, v, masks,
                                                                                                 accumulators),
        checks.pow2_identity_verdict(run.prepared.facts[regime].all_pow2, pred.int32_safe, t.M * t.N,
                                     int(v.get("pow2_n_excluded", 0)), int(v.get("pow2_n_differing", 0)),
                                     _first(masks, "pow2", i), bias=t.bias is not None,
                                     bias_modes=(bias_handling(ma), bias_handling(mb)))
        if int8 and not uses_statistics(ma, mb) else
        checks.inapplicable("pow2-identity", f"{t.fmt} accumulation rounds in an implementation-defined order")
        if not int8 else
        checks.inapplicable("pow2-identity", "an arm dequantizes with absmax statistics 127·s and a constant, "
                            "which power-of-two scales do not make commute: judged by predicted-differences",
                            evidence={"reason": "statistics"}),
        checks.real_scale_tolerance_verdict(rt if regime == "real" else None, ulp_threshold),
        checks.token_level_risk(),
        checks.epilogue_model_verdict(
            {arm: (decl.label(arm) if not int8 and decl.schedule(arm) is not None else (model.name if model else None),
                   parts[f"em_{arm}"] or None,
                   lambda arm=arm: checks.Deviation(models[arm][0][i], models[arm][1][i], masks[f"em_{arm}"][i]))
             for arm, model in (("a", ma), ("b", mb))}, names),
        checks.predicted_differences_verdict(pd, _first(masks, "predicted", i), why_not, cause),
    ]
    if run.subsets is not None:
        verdicts += _invariance_verdicts(run, v)
    else:
        why = "checked in the real-scale regime" if invariance else "disabled (--no-invariance)"
        verdicts += [checks.inapplicable("m-invariance", why), checks.inapplicable("run-to-run", why)]
    n_differing = int(v["n_differing"])
    explained = None if pd is None else not (pd["n_unpredicted"] or pd["n_predicted_not_observed"])
    return UnitResult(
        tile=t.name, regime=regime, fmt=t.fmt, M=t.M, K=t.K, N=t.N, out_dtype=dtype_name(t.out_dtype),
        bias=t.bias is not None, n_elements=t.M * t.N, n_differing=n_differing,
        max_ulp=checks.optional_int(v["max_ulp"]), bitwise_equal=n_differing == 0, differences=differences,
        max_abs_acc=pred.max_abs_acc if pred else None,
        headroom_bits=None if pred is None or pred.headroom_bits == float("inf") else pred.headroom_bits,
        prediction=Safety(pred.prediction) if pred else None,
        n_predicted=None if pd is None else int(pd["n_predicted"]), explained=explained,
        cause=cause if explained else None,
        near_zero_floor=near.floor, n_near_zero=near.n_near_zero, n_differing_near_zero=near.n_differing_near_zero,
        max_ulp_above_floor=near.max_ulp_above_floor, max_rel_diff_above_floor=near.max_rel_diff_above_floor,
        pow2_scales_changed=int(v["pow2_scales_changed"]) if regime == "pow2" else 0,
        subnormal_scales=int(v["subnormal_scales"]), verdicts=tuple(verdicts))


def _accumulator_verdict(run: UnitRun, i: int, v: dict[str, float], masks: dict[str, torch.Tensor],
                         accumulators: dict[str, torch.Tensor | None]):
    exposed = sorted(arm for arm in ("a", "b") if run.prepared.exposed.get(arm) is not None)
    bad: dict[str, Any] = {}
    for arm in exposed:
        if f"acc_{arm}" not in v:
            bad[arm] = {"shape": list(run.prepared.exposed[arm].shape)}
        elif v[f"acc_{arm}"]:
            bad[arm] = checks.accumulator_violation(accumulators[arm][i], accumulators["expected"][arm][i],
                                                    masks[f"acc_{arm}"][i], int(v[f"acc_{arm}"]))
    return checks.exact_accumulator_verdict(exposed, bad)


def _fp8_accumulator_verdict(decl: Declarations, run: UnitRun, i: int, v: dict[str, float],
                             masks: dict[str, torch.Tensor], accumulators: dict[str, Any]):
    """The exact-accumulator check of an fp8 unit: each exposed fp32 accumulator against the one its arm's declared
    schedule prescribes, bit for bit."""
    judged = sorted(arm for arm in ("a", "b") if f"acc_{arm}" in v)
    if not judged:
        exposed = [arm for arm in ("a", "b") if run.exposed_accumulator(arm) is not None]
        why = ("no arm exposes its fp32 accumulator" if not exposed else
               f"arm(s) {', '.join(exposed)} expose an accumulator but declare no deterministic schedule here")
        return checks.inapplicable("exact-accumulator", why)
    bad = {}
    for arm in judged:
        if v[f"acc_{arm}"]:
            at = checks.first_mismatch(masks[f"acc_{arm}"][i])
            got, want = accumulators[arm][i][tuple(at)], accumulators["expected"][arm][i][tuple(at)]
            bad[arm] = {"n_differing": int(v[f"acc_{arm}"]), "first": at, "got": float(got), "expected": float(want),
                        "schedule": decl.label(arm)}
    ev = {"exposed_by": judged, "schedules": {arm: decl.label(arm) for arm in judged}, **({"mismatches": bad} if bad else {})}
    if bad:
        return checks.fired("exact-accumulator", f"fp32 accumulator differs from the one its declared schedule "
                            f"prescribes in arm(s) {', '.join(sorted(bad))}", evidence=ev)
    return checks.passed("exact-accumulator", f"fp32 accumulator(s) of arm(s) {', '.join(judged)} equal the declared "
                         "schedules' bit for bit", evidence=ev)


def _invariance_verdicts(run: UnitRun, v: dict[str, float]):
    counts = {arm: [(rows, int(v[f"mi_{arm}_{j}"])) for j, (rows, _) in enumerate(run.subsets[arm])]
              for arm in ("a", "b")}
    again = {arm: int(v[f"rr_{arm}"]) for arm in ("a", "b")}
    return [checks.m_invariance_verdict(counts),
            checks.run_to_run_verdict(["a", "b"], {arm: n for arm, n in again.items() if n})]


__all__ = ["Declarations", "Measurement", "PreparedTile", "ScaleFacts", "UnitRun", "bias_handling", "difference_cause",
           "difference_causes", "judge", "judged", "measure", "schedule_cause", "tile_key"]
