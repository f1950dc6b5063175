"""The detection matrix: every check against every mutant of one base kernel.

For each fault × severity × scale regime the conformance procedure (`alibi.conform.pipeline.run_conformance`) runs
the base against its mutant (arm a = the base, arm b = the mutant) on the same tiles. A row
records, per check, whether it *fired* on any tile, stayed *silent* (applicable, never fired) or
was *inapplicable* on every tile, and whether the fault was *observable*: whether the mutant
changed any output bit relative to the base in any launch the procedure made (the full tile, the
M-invariance sub-batches and the repeated run), measured by recording both arms' outputs launch
by launch. A silent check on an unobservable row is not a miss (nothing could be seen); the
summary counts hits, misses on observable rows and false positives on the null mutant per check.

The result is a `DetectionMatrix` (schema `alibi.mutants/v1`, documented in
docs/positive-controls.md), written as `detection.json`, `detection.md` and a heatmap
(`detection.png`, `detection.svg`) by `write_matrix`.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import torch

from alibi.conform.checks import CHECKS
from alibi.conform.pipeline import Pair, TileSource, environment, run_conformance, tiles_sha256, validate_regimes
from alibi.conform.results import Regime, Report
from alibi.errors import InputError
from alibi.exact.numerics import bitwise_differ_mask, max_ulp_distance
from alibi.governance import write_manifest
from alibi.governance.manifest import digest_set
from alibi.io import atomic
from alibi.io.progress import ProgressCallback
from alibi.io.typed import TypedResult
from alibi.kernels.base import Kernel, KernelOutput
from alibi.kernels.block_mutants import BLOCK_FAULTS, BlockFp8MutantKernel
from alibi.kernels.mutants import (
    ALL,
    FAULTS,
    FP8_FAULTS,
    NATIVE_SWITCHES,
    Fp8MutantKernel,
    MutantKernel,
    Severity,
    fault,
    native_triton_mutant,
)
from alibi.tiles.tile import BLOCK_FORMAT, Tile

SCHEMA = "alibi.mutants/v1"
PAPER_SEVEN = ("shared-operands", "int32-no-overflow", "lossless-fp32-entry", "exact-accumulator",
               "pow2-identity", "real-scale-tolerance", "token-level-risk")
DEFAULT_SEVERITIES = ("one", "pct", "all")

# Published detection by the seven checks (Chen 2026 follow-up, science.md §6b): observable rows
# detected / observable rows, per fault class, on 196 layers × 3 severities × 2 regimes.
PUBLISHED = {
    "F1": ("scales multiplied in bf16", "0 / 439"),
    "F2": ("double rounding", "0 / 448"),
    "F3": ("scales re-associated", "0 / 205"),
    "F4": ("truncating cast", "494 / 972 (pow2 check only)"),
    "F5": ("scale folded into the reduction", "0 / 1"),
    "F6": ("int32 overflow", "always"),
    "F7": ("|acc| > 2^24 in fp32", "always"),
    "F8": ("null rewrite", "no false positive"),
    "F9": ("operand mismatch", "always"),
}


# --- the result types -----------------------------------------------------------------------------

class CheckCell(StrEnum):
    """One check on one row of the matrix: it fired on some tile, applied and stayed silent, or could not apply
    on any tile."""

    FIRED = "fired"
    SILENT = "silent"
    INAPPLICABLE = "inapplicable"


@dataclass(frozen=True)
class UnitRow:
    """One fault × severity × regime on one tile: observable there, and which checks fired or could not apply."""

    fault: str
    severity: str
    regime: Regime
    implementation: str
    tile: str
    observable: bool
    changed_elements: int
    fired: tuple[str, ...]
    inapplicable: tuple[str, ...]


@dataclass(frozen=True)
class FaultRow:
    """One row of the matrix: a fault at one severity under one scale regime, over all tiles.

    kernel: the mutant's registry name; implementation: `wrapper` or `native` (inside the Triton
    kernel); paper: the published fault class (F1–F9) or None; observable: the mutant changed an
    output bit relative to the base in some launch of some tile (`observable_tiles` of `tiles`);
    changed_elements / launched_elements: over every launch; max_ulp: largest finite ulp distance
    from the base (None when nothing finite was compared); cells: per check `fired`, `silent` or
    `inapplicable`; fired: the checks that fired, in report order; detected: any check fired.
    """

    fault: str
    severity: str
    regime: Regime
    kernel: str
    implementation: str
    paper: str | None
    observable: bool
    observable_tiles: int
    tiles: int
    changed_elements: int
    launched_elements: int
    max_ulp: int | None
    cells: Mapping[str, CheckCell]
    fired: tuple[str, ...]

    @property
    def detected(self) -> bool:
        return bool(self.fired)

    @property
    def detected_by_seven(self) -> bool:
        return any(c in PAPER_SEVEN for c in self.fired)

    def _layout_out(self, doc: dict[str, Any]) -> dict[str, Any]:
        """As stored: `detected` and `detected_by_seven` written for readers, last (`alibi.io.typed`)."""
        return {**doc, "detected": self.detected, "detected_by_seven": self.detected_by_seven}

    @classmethod
    def _layout_in(cls, doc: dict[str, Any], where: str) -> dict[str, Any]:
        doc.pop("detected", None)
        doc.pop("detected_by_seven", None)
        return doc


@dataclass(frozen=True)
class CheckSummary:
    """One check over all rows except the null mutant's (whose firings are false positives).

    hits: rows where it fired; hits_observable: of those, rows where the fault was observable;
    misses_observable: observable rows where it was applicable and silent; inapplicable_observable:
    observable rows where it could not apply; false_positives: null-mutant rows where it fired.
    """

    check: str
    hits: int
    hits_observable: int
    misses_observable: int
    inapplicable_observable: int
    false_positives: int


@dataclass(frozen=True)
class FaultClassSummary:
    """One fault class over all its rows (severities × regimes) and units (rows × tiles).

    detected_rows: observable rows where some check fired; detected_by: every check that fired in
    some row; units_observable / units_detected_seven / units_detected: units (one tile each) where
    the fault was observable, and where among those one of the paper's seven checks / any check fired.
    """

    fault: str
    paper: str | None
    implementation: str
    rows: int
    observable_rows: int
    detected_rows: int
    detected_by: tuple[str, ...]
    units: int
    units_observable: int
    units_detected_seven: int
    units_detected: int


@dataclass(frozen=True)
class NotApplicable:
    """A fault that cannot exist for this base (for example an unfused bias where none is fused)."""

    fault: str
    reason: str


@dataclass(frozen=True)
class DetectionMatrix(TypedResult):
    """The whole matrix: the base, the operands, the rows, and the summaries (schema `alibi.mutants/v1`).

    null_silent: no check fired on the null mutant; all_detected: every observable row of every
    other fault was detected by some check; undetected_classes: faults with an observable row no
    check detected (the honest blind spots).
    """

    SCHEMA = SCHEMA
    REMEDY = "re-run `alibi mutants`"
    FILE = "detection.json"

    schema: str
    created_at: str
    base: Mapping[str, Any]
    source: Mapping[str, Any]
    regimes: tuple[Regime, ...]
    severities: tuple[str, ...]
    checks: tuple[str, ...]
    faults: tuple[FaultRow, ...]
    units: tuple[UnitRow, ...]
    check_summary: tuple[CheckSummary, ...]
    classes: tuple[FaultClassSummary, ...]
    not_applicable: tuple[NotApplicable, ...]
    null_silent: bool
    all_detected: bool
    undetected_classes: tuple[str, ...]
    environment: Mapping[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 when the null mutant fired nothing and every observable fault was detected, else 1."""
        return 0 if (self.null_silent and self.all_detected) else 1


# --- running it -------------------------------------------------------------------------------------

class Recorder(Kernel):
    """Passes every call through to `inner` and keeps (tile name, output) per launch, in call order."""

    def __init__(self, inner: Kernel):
        self.inner = inner
        self.name, self.formats, self.device = inner.name, inner.formats, inner.device
        self.epilogue, self.description = inner.epilogue, inner.description
        self.launches: list[tuple[str, torch.Tensor]] = []

    def available(self) -> tuple[bool, str]:
        return self.inner.available()

    def torch_device(self) -> torch.device:
        return self.inner.torch_device()

    def epilogue_at(self, M: int):
        return self.inner.epilogue_at(M)

    def schedule_at(self, M: int, N: int, K: int):
        return self.inner.schedule_at(M, N, K)

    def evidence(self) -> dict[str, Any]:
        return self.inner.evidence()

    def run(self, tile: Tile, *, accumulator: bool = False, on_device: bool = False,
            evidence: bool = True, wait: bool = True) -> KernelOutput:
        result = self.inner.run(tile, accumulator=accumulator, on_device=on_device, evidence=evidence, wait=wait)
        self.launches.append((tile.name, result.out.cpu()))
        return result


@dataclass(frozen=True)
class Plan:
    """One row to run: which mutant kernel (built fresh per regime), under what labels."""

    fault: str
    severity: str
    implementation: str
    build: Callable[[], Kernel]


def _schedule_plans(family: str, table: Mapping[str, Any], mutant: Callable[..., Kernel], base: Kernel,
                    faults: Iterable[str] | None, levels: list[Severity], native: bool) -> list[Plan]:
    """The rows of the schedule faults of `table` (`family`: "fp8" or "block", as errors name them), each built as
    `mutant(fault, severity, base)`: the requested faults (every one when None), at every level but null's `all`."""
    names = list(dict.fromkeys(faults)) if faults is not None else list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise InputError(f"unknown {family} fault {unknown[0]!r}; {family} faults: {', '.join(table)}")
    if native:
        raise InputError("--native: native fault variants live inside the int8 'triton' kernel")
    return [Plan(name, level.label, "wrapper", lambda f=table[name], level=level: mutant(f, level, base))
            for name in names for level in (levels if name != "null" else [ALL])]


def plan_rows(base: Kernel, base_name: str, faults: Iterable[str] | None, severities: Iterable[str],
              native: bool) -> tuple[list[Plan], list[NotApplicable]]:
    """The rows for `base`: every requested fault at every severity it takes.

    faults None: every fault that exists for this base (the others are returned as NotApplicable);
    an explicitly requested fault that cannot exist for the base is an InputError. Faults without
    severities run once (as `all`). `native` adds the in-kernel Triton variants (base `triton` only).
    """
    explicit = faults is not None
    levels = [Severity.parse(s) for s in dict.fromkeys(severities)]
    if not levels:
        raise InputError("--severity: empty list; use one, pct, all or percentages such as 5%")
    if BLOCK_FORMAT in base.formats:  # a block-scaled fp8 base: faults of its block accumulation
        return _schedule_plans("block", BLOCK_FAULTS, BlockFp8MutantKernel, base, faults, levels, native), []
    if "int8" not in base.formats and "fp8_e4m3" in base.formats:  # an fp8 base: faults of its accumulation
        return _schedule_plans("fp8", FP8_FAULTS, Fp8MutantKernel, base, faults, levels, native), []
    names = list(dict.fromkeys(faults)) if explicit else list(FAULTS)
    for name in names:
        fault(name)  # unknown → InputError naming every fault
    if "int8" not in base.formats:
        raise InputError(f"base {base_name!r} handles {', '.join(base.formats)} operands; mutants wrap int8 kernels")
    plans, skipped = [], []
    for name in names:
        f = FAULTS[name]
        why = f.not_applicable(base)
        if why:
            if explicit:
                raise InputError(f"fault {name!r} does not exist for base {base_name!r}: {why}")
            skipped.append(NotApplicable(name, why))
            continue
        for level in (levels if f.severities else [ALL]):
            plans.append(Plan(name, level.label, "wrapper",
                              lambda f=f, level=level: MutantKernel(f, level, base)))
    if native:
        if base_name != "triton":
            raise InputError(f"--native: native fault variants live inside the 'triton' kernel; base is {base_name!r}")
        for name in names:
            if name in NATIVE_SWITCHES:
                plans.append(Plan(name, "all", "native", lambda name=name: native_triton_mutant(name)))
    return plans, skipped


def check_tiles(base: Kernel, base_name: str, tiles: list[Tile]) -> None:
    """InputError unless there are tiles and `base` handles their one format (int8, or fp8 for the fp8 faults)."""
    if not tiles:
        raise InputError("no tiles to run the mutants on")
    formats = sorted({t.fmt for t in tiles})
    if len(formats) > 1 or formats[0] not in base.formats:
        raise InputError(f"base {base_name!r} handles {', '.join(base.formats)} tiles; these tiles are "
                         f"{', '.join(formats)}: give tiles of one format the base takes")


def _unit_rows(plan: Plan, regime: str, report: Report, base: Recorder, mutant: Recorder
               ) -> tuple[list[UnitRow], dict[str, Any]]:
    """Per-tile rows from a conform report and the recorded launches, plus the row's aggregates."""
    by_tile_base: dict[str, list[torch.Tensor]] = {}
    by_tile_mut: dict[str, list[torch.Tensor]] = {}
    for name, out in base.launches:
        by_tile_base.setdefault(name, []).append(out)
    for name, out in mutant.launches:
        by_tile_mut.setdefault(name, []).append(out)
    units, changed_total, launched, ulps = [], 0, 0, []
    for u in report.tiles:
        outs_b, outs_m = by_tile_base[u.tile], by_tile_mut[u.tile]
        if len(outs_b) != len(outs_m):
            raise RuntimeError(f"tile {u.tile}: {len(outs_b)} base launches but {len(outs_m)} mutant launches")
        changed = 0
        for ob, om in zip(outs_b, outs_m, strict=True):
            n = int(bitwise_differ_mask(ob, om).sum())
            changed += n
            launched += ob.numel()
            ulp = max_ulp_distance(ob, om) if n else (0 if bool(torch.isfinite(ob).any()) else None)
            if ulp is not None:
                ulps.append(ulp)
        changed_total += changed
        units.append(UnitRow(plan.fault, plan.severity, regime, plan.implementation, u.tile, changed > 0, changed,
                             tuple(c for c in CHECKS if u.verdict(c).status == "fired"),
                             tuple(c for c in CHECKS if u.verdict(c).status == "inapplicable")))
    return units, {"changed": changed_total, "launched": launched, "max_ulp": max(ulps) if ulps else None}


def _row(plan: Plan, kernel_name: str, regime: str, units: list[UnitRow], agg: dict[str, Any]) -> FaultRow:
    cells = {}
    for c in CHECKS:
        if any(c in u.fired for u in units):
            cells[c] = CheckCell.FIRED
        elif all(c in u.inapplicable for u in units):
            cells[c] = CheckCell.INAPPLICABLE
        else:
            cells[c] = CheckCell.SILENT
    return FaultRow(plan.fault, plan.severity, regime, kernel_name, plan.implementation, _paper(plan.fault),
                    any(u.observable for u in units), sum(u.observable for u in units), len(units),
                    agg["changed"], agg["launched"], agg["max_ulp"], cells,
                    tuple(c for c in CHECKS if cells[c] == "fired"))


def _paper(fault_name: str) -> str | None:
    """The published fault class (F1–F9) of an int8 fault; fp8 faults have none."""
    return FAULTS[fault_name].paper if fault_name in FAULTS else None


def summarize_checks(rows: Iterable[FaultRow]) -> tuple[CheckSummary, ...]:
    rows = list(rows)
    out = []
    for c in CHECKS:
        real = [r for r in rows if r.fault != "null"]
        obs = [r for r in real if r.observable]
        out.append(CheckSummary(c, sum(r.cells[c] == "fired" for r in real), sum(r.cells[c] == "fired" for r in obs),
                                sum(r.cells[c] == "silent" for r in obs), sum(r.cells[c] == "inapplicable" for r in obs),
                                sum(r.cells[c] == "fired" for r in rows if r.fault == "null")))
    return tuple(out)


def summarize_classes(rows: Iterable[FaultRow], units: Iterable[UnitRow]) -> tuple[FaultClassSummary, ...]:
    rows, units = list(rows), list(units)
    keys = list(dict.fromkeys((r.fault, r.implementation) for r in rows))
    out = []
    for name, impl in keys:
        rs = [r for r in rows if (r.fault, r.implementation) == (name, impl)]
        us = [u for u in units if (u.fault, u.implementation) == (name, impl)]
        obs = [u for u in us if u.observable]
        out.append(FaultClassSummary(
            name, _paper(name), impl, len(rs), sum(r.observable for r in rs),
            sum(r.observable and r.detected for r in rs),
            tuple(c for c in CHECKS if any(c in r.fired for r in rs)), len(us), len(obs),
            sum(any(c in PAPER_SEVEN for c in u.fired) for u in obs), sum(bool(u.fired) for u in obs)))
    return tuple(out)


def run_matrix(base: Kernel, base_name: str, tiles: list[Tile], *, source: Mapping[str, Any],
               faults: Iterable[str] | None = None, severities: Iterable[str] = DEFAULT_SEVERITIES,
               regimes: Iterable[str] = ("real", "pow2"), native: bool = False,
               progress: ProgressCallback | None = None) -> DetectionMatrix:
    """Run the conformance procedure of `base` against each of its mutants on `tiles`.

    Validates everything first (faults, severities, regimes, the base's availability and formats),
    so bad input fails before any kernel runs. progress: called `(done, total, label)` after each
    row of the matrix, i.e. each mutant plan under each regime (alibi.io.progress).
    """
    regimes = validate_regimes(regimes)
    base.require_available()
    check_tiles(base, base_name, tiles)
    plans, skipped = plan_rows(base, base_name, faults, severities, native)

    tile_source = TileSource(tuple(tiles), dict(source), {"name": "tiles", "digest": digest_set(tiles_sha256(tiles))})
    rows, units = [], []
    total = len(plans) * len(regimes)
    for plan in plans:
        for regime in regimes:
            rec_base, rec_mut = Recorder(base), Recorder(plan.build())
            pair = Pair(rec_base, rec_mut, f"positive control: {base_name} against {rec_mut.name}")
            report = run_conformance(pair, tile_source, [regime])
            unit_rows, agg = _unit_rows(plan, regime, report, rec_base, rec_mut)
            units += unit_rows
            rows.append(_row(plan, rec_mut.name, regime, unit_rows, agg))
            if progress:
                r = rows[-1]
                progress(len(rows), total, f"{r.kernel} [{regime}]: "
                         f"{'observable' if r.observable else 'unobservable'}, fired: {', '.join(r.fired) or 'none'}")
    null_silent = not any(r.fired for r in rows if r.fault == "null")
    undetected = tuple(dict.fromkeys(r.fault for r in rows if r.fault != "null" and r.observable and not r.detected))

    _, how = base.available()
    return DetectionMatrix(
        schema=SCHEMA, created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        base={"name": base_name, "epilogue_model": base.epilogue.name if base.epilogue else None, "how": how,
              "evidence": json.loads(json.dumps(base.evidence(), default=str))},
        source=dict(source), regimes=tuple(regimes), severities=tuple(dict.fromkeys(severities)),
        checks=tuple(CHECKS), faults=tuple(rows), units=tuple(units), check_summary=summarize_checks(rows),
        classes=summarize_classes(rows, units), not_applicable=tuple(skipped), null_silent=null_silent,
        all_detected=not undetected, undetected_classes=undetected, environment=environment())


# --- rendering ------------------------------------------------------------------------------------

CELL_MARK = {"fired": "**fired**", "silent": "·", "inapplicable": "–"}


def to_markdown(m: DetectionMatrix) -> str:
    """The matrix for people: rows × checks, the per-check and per-class summaries, the comparison."""
    checks = list(m.checks)
    out = [f"# Detection matrix: mutants of `{m.base['name']}`", "",
           f"Base `{m.base['name']}` (declares `{m.base['epilogue_model']}`), runs as: {m.base['how']}.",
           (f"Operands: {m.source.get('label', m.source)}; regimes {', '.join(m.regimes)}; "
            f"severities {', '.join(m.severities)}. Created {m.created_at}."), "",
           (f"Null mutant silent: **{'yes' if m.null_silent else 'NO'}**. Every observable row detected: "
            f"**{'yes' if m.all_detected else 'NO'}**"
            + (f" (undetected: {', '.join(m.undetected_classes)})." if m.undetected_classes else ".")), "",
           ("Cells: **fired**, · silent (applicable, did not fire), – inapplicable on every tile. "
            "*Observable*: the mutant changed an output bit relative to the base in some launch."), "",
           "## Rows", "",
           "| fault | severity | regime | impl | observable | changed | max ulp | " + " | ".join(checks) + " |",
           "|" + "---|" * (7 + len(checks))]
    for r in m.faults:
        out.append(f"| {r.fault} | {r.severity} | {r.regime} | {r.implementation} | "
                   f"{'yes' if r.observable else 'no'} ({r.observable_tiles}/{r.tiles}) | {r.changed_elements} | "
                   f"{'' if r.max_ulp is None else r.max_ulp} | " + " | ".join(CELL_MARK[r.cells[c]] for c in checks) + " |")
    out += ["", "## Per check", "",
            ("| check | hits | hits on observable rows | misses on observable rows (silent) | "
             "inapplicable on observable rows | false positives (null) |"), "|---|---|---|---|---|---|"]
    for c in m.check_summary:
        out.append(f"| {c.check} | {c.hits} | {c.hits_observable} | {c.misses_observable} | "
                   f"{c.inapplicable_observable} | {c.false_positives} |")
    out += ["", "## Per fault class", "",
            ("| fault | paper | impl | observable rows | detected rows | detected by | units observable | "
             "detected by the seven | detected by any check |"), "|---|---|---|---|---|---|---|---|---|"]
    for c in m.classes:
        out.append(f"| {c.fault} | {c.paper or ''} | {c.implementation} | {c.observable_rows}/{c.rows} | "
                   f"{c.detected_rows}/{c.observable_rows} | {', '.join(c.detected_by) or 'none'} | "
                   f"{c.units_observable}/{c.units} | {c.units_detected_seven}/{c.units_observable} | "
                   f"{c.units_detected}/{c.units_observable} |")
    out += ["", "## Beside the published rates", "",
            ("Units are tiles × severities × regimes (the published rows are layers × severities × regimes); "
             "each cell is observable units detected / observable units."), "",
            "| class | published (seven checks) | ours: the seven checks | ours: any check |", "|---|---|---|---|"]
    for cls, (label, published) in PUBLISHED.items():
        members = [c for c in m.classes if c.paper == cls and c.implementation == "wrapper"]
        if not members:
            continue
        obs = sum(c.units_observable for c in members)
        seven = sum(c.units_detected_seven for c in members)
        anyc = sum(c.units_detected for c in members)
        names = ", ".join(c.fault for c in members)
        label = label.replace("|", "\\|")  # a literal |acc| would end the table cell
        if cls == "F8":
            fp = sum(s.false_positives for s in m.check_summary)
            out.append(f"| {cls} {label} ({names}) | {published} | false positives: {fp} | false positives: {fp} |")
        else:
            out.append(f"| {cls} {label} ({names}) | {published} | {seven} / {obs} | {anyc} / {obs} |")
    if m.not_applicable:
        out += ["", "## Faults that do not exist for this base", ""]
        out += [f"- `{n.fault}`: {n.reason}" for n in m.not_applicable]
    env = m.environment
    out += ["", f"Environment: alibi {env.get('alibi')}, torch {env.get('torch')}, triton {env.get('triton')}, "
            f"Python {env.get('python')}, {env.get('platform')}" + (f", GPU {env['gpu']}" if env.get("gpu") else "")
            + ".", ""]
    return "\n".join(out)


def heatmap(m: DetectionMatrix) -> tuple[bytes, bytes]:
    """(PNG, SVG) of the matrix: one row per fault × severity × regime, one column per check plus
    `observable`; red fired, light grey silent, white inapplicable (observable: dark = yes)."""
    # deferred: keeps matplotlib out of start-up
    import matplotlib

    matplotlib.use("Agg")
    # deferred: keeps matplotlib out of start-up
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    cols = ["observable", *m.checks]
    code = {"inapplicable": 0, "silent": 1, "fired": 2}
    data = [[3 if r.observable else 4] + [code[r.cells[c]] for c in m.checks] for r in m.faults]
    cmap = ListedColormap(["#ffffff", "#d9d9d9", "#d62728", "#3b3b3b", "#f2f2f2"])
    labels = [f"{r.fault}{'' if r.severity == 'all' else '@' + r.severity}"
              f"{' (native)' if r.implementation == 'native' else ''} [{r.regime}]" for r in m.faults]
    fig, ax = plt.subplots(figsize=(2.6 + 0.55 * len(cols), 1.2 + 0.19 * len(labels)))
    ax.imshow(data, cmap=cmap, vmin=0, vmax=4, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(len(cols)), cols, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(labels)), labels, fontsize=6)
    ax.set_xticks([x - 0.5 for x in range(1, len(cols))], minor=True)
    ax.set_yticks([y - 0.5 for y in range(1, len(labels))], minor=True)
    ax.grid(which="minor", color="#999999", linewidth=0.3)
    ax.tick_params(which="minor", length=0)
    ax.set_title(f"mutants of {m.base['name']}: which checks fire", fontsize=8)
    ax.legend(handles=[Patch(color="#d62728", label="fired"), Patch(color="#d9d9d9", label="silent"),
                       Patch(facecolor="#ffffff", edgecolor="#999999", label="inapplicable"),
                       Patch(color="#3b3b3b", label="observable"), Patch(color="#f2f2f2", label="unobservable")],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=6, frameon=False)
    fig.tight_layout()
    png, svg = io.BytesIO(), io.BytesIO()
    fig.savefig(png, format="png", dpi=130, metadata={"Software": None})
    fig.savefig(svg, format="svg", metadata={"Date": None})
    plt.close(fig)
    return png.getvalue(), svg.getvalue()


MATRIX_FILES = ("detection.json", "detection.md", "detection.png", "detection.svg")


def write_matrix(m: DetectionMatrix, out: str | Path, predicate: Mapping[str, Any]) -> Path:
    """Write the four files and a manifest into `out` atomically (all of them, or nothing)."""
    png, svg = heatmap(m)
    with atomic.staged_dir(out) as stage:
        (stage / "detection.json").write_text(m.to_json(), encoding="utf-8")
        (stage / "detection.md").write_text(to_markdown(m), encoding="utf-8")
        (stage / "detection.png").write_bytes(png)
        (stage / "detection.svg").write_bytes(svg)
        write_manifest(stage, "mutants", predicate, files=list(MATRIX_FILES))
    return Path(out)


__all__ = [
    "DEFAULT_SEVERITIES",
    "PAPER_SEVEN",
    "SCHEMA",
    "CheckCell",
    "CheckSummary",
    "DetectionMatrix",
    "FaultClassSummary",
    "FaultRow",
    "NotApplicable",
    "UnitRow",
    "check_tiles",
    "heatmap",
    "plan_rows",
    "run_matrix",
    "to_markdown",
    "write_matrix",
]
