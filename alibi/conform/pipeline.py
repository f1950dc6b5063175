"""The conformance pipeline: two kernels, a tile source, two scale regimes, every check, one report.

`run_conformance` is the one procedure behind `alibi conform`, `alibi run` and
`alibi.testing.assert_interchangeable`. Per tile, once (`prepare`): the operands on the check
device, the exact accumulator and the headroom prediction — neither depends on the scales, so both
regimes share them — and each arm's exposed accumulator when a check reads it. Per unit (one tile
under one regime: real scales, or weight scales rounded to powers of two): both arms run on private
copies of the operands, each arm's declared epilogue model runs on the exact accumulator, the two
models predict where the arms must differ, and every check is applied. In the real regime each arm
also runs on row subsets (M-invariance) and a second time (run-to-run). Units are computed in batches
of tiles of one shape (`batches`): the arms of every unit of a batch run first (`run_unit`), then
`alibi.conform.judge` applies every check to the whole batch at once; a unit's results are those it
gets alone (`evaluate_unit` is a batch of one).

The check device is the GPU when there is one: the exact accumulator is then one fp64 GEMM
(cuBLAS DGEMM, exact for these integers and a different path from the int8 kernels under test) and
the epilogue models run there in IEEE fp32 (`alibi.exact.emulator`); on the CPU they run as before.

Units are kept, when a units folder is given, one file each, written atomically as they finish,
with a `plan.json` naming what the run is; `resume=True` continues a killed run from them and gives
the bytes an uninterrupted run gives (the first start's `created_at` is kept; `SOURCE_DATE_EPOCH`
fixes it for reproducible builds).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from alibi.conform import checks
from alibi.conform.exercised import exercised, unexercised, within_declarations
from alibi.conform.launches import launcher
from alibi.conform.judge import (
    Measurement,
    PreparedTile,
    ScaleFacts,
    Stage,
    UnitRun,
    judge,
    judged,
    measure,
    tile_key,
)
from alibi.conform.results import (
    Equivalence,
    KernelRecord,
    Regime,
    Report,
    ReportVerdict,
    UnitResult,
)
from alibi.conform.token_risk import ReplayEvidence
from alibi.conform.unit_store import PLAN_FILE, UnitStore, tile_sha256
from alibi.errors import InputError, one_line, shown
from alibi.exact.emulator import exact_accumulator
from alibi.exact.numerics import pow2_round
from alibi.governance.environment import environment_record
from alibi.governance.manifest import digest_set, folder_files
from alibi.io.digests import sha256_bytes, sha256_file, sha256_listing
from alibi.io.progress import Progress
from alibi.kernels.base import Kernel, device_errors_of, operands, pack, wait_for
from alibi.kernels.registry import get_kernel
from alibi.tiles.synthetic import PRESETS, synthetic_tiles
from alibi.tiles.tile import Tile, read_tile_dir, tile_bytes

REGIMES = tuple(Regime)


@dataclass(frozen=True)
class Pair:
    """The two arms under comparison, and why these two were chosen."""

    a: Kernel
    b: Kernel
    selection: str


def choose_pair(kernel_a: str | None, kernel_b: str | None) -> Pair:
    """The requested pair, or the default: `cutlass` vs `triton` with CUDA, else the best CPU pair.

    Without CUDA the default is `triton` (the real Triton kernel under the Triton interpreter)
    against `torch-cpu` (`torch._int_mm`): two different real implementations whose declared
    epilogues use the two scale orders of the vLLM kernels. Requested kernels that cannot run here
    raise KernelUnavailable (exit 3); nothing is replaced silently.
    """
    if (kernel_a is None) != (kernel_b is None):
        raise InputError("give both --kernel-a and --kernel-b, or neither (for the default pair)")
    if kernel_a is not None:
        pair = Pair(get_kernel(kernel_a), get_kernel(kernel_b), "requested")
    elif torch.cuda.is_available():
        pair = Pair(get_kernel("cutlass"), get_kernel("triton"),
                    "default with CUDA: the vLLM-order CUTLASS kernel against the vLLM-order Triton kernel")
    else:
        pair = Pair(get_kernel("torch-cpu"), get_kernel("triton"),
                    "default without CUDA: torch._int_mm on the CPU (w_then_a epilogue) against the real Triton "
                    "kernel under the Triton interpreter (a_then_w epilogue) — two different real "
                    "implementations with the two vLLM scale orders")
    pair.a.require_available()
    pair.b.require_available()
    return pair


def apply_regime(tile: Tile, regime: str) -> Tile:
    """`real`: the tile as is. `pow2`: every weight scale replaced by `2**round(log2 s_w)`."""
    if regime == "real":
        return tile
    if regime == "pow2":
        return tile.replace(s_w=pow2_round(tile.s_w, "nearest"))
    raise InputError(f"unknown scale regime {regime!r}; use real and/or pow2")


def validate_regimes(regimes: Iterable[str]) -> list[Regime]:
    regimes = list(dict.fromkeys(regimes))
    unknown = [r for r in regimes if r not in REGIMES]
    if unknown or not regimes:
        raise InputError(f"--scales: unknown or empty regime list {unknown or regimes}; use real, pow2 or real,pow2")
    return [Regime(r) for r in regimes]


# --- the tile source ------------------------------------------------------------------------------

@dataclass(frozen=True)
class TileSource:
    """The tiles of a run, how the report describes them (`record`), and the manifest resource that pins
    them (`resource`: `{"name", "digest": {"sha256"}}`), digested from the bytes the tiles were read from."""

    tiles: tuple[Tile, ...] = field(repr=False)
    record: dict[str, Any]
    resource: dict[str, Any]


def tiles_sha256(tiles: Iterable[Tile]) -> str:
    """One digest over an ordered list of tiles: the listing of each tile's serialized bytes by name."""
    return sha256_listing((t.name, sha256_bytes(tile_bytes(t))) for t in tiles)


def source_from_dir(folder: str | Path, label: str | None = None) -> TileSource:
    """The tiles of a folder; every file is digested as it is read (tiles once, through `read_tile_dir`),
    before anything runs, so the folder digest pins the bytes that were checked."""
    folder = Path(folder)
    read = read_tile_dir(folder)
    digests = [(rel, read[rel][1] if rel in read else sha256_file(folder / rel)) for rel in folder_files(folder)]
    tiles = tuple(t for t, _ in read.values())
    record = {"label": label or f"tiles in {folder}", "kind": "tiles", "path": str(folder), "n_tiles": len(tiles)}
    return TileSource(tiles, record, {"name": str(folder), "digest": digest_set(sha256_listing(digests))})


def source_from_preset(preset: str, seed: int = 0, rows: int | None = None) -> TileSource:
    """The tiles a synthetic preset draws for `seed` (`rows` overrides its M)."""
    tiles = tuple(synthetic_tiles(preset, seed=seed, M=rows))
    record = {"label": f"synthetic preset {preset} (seed {seed})", "kind": "synthetic", "preset": preset,
              "rows": tiles[0].M, "n_tiles": len(tiles)}
    if PRESETS[preset].declaration_probes:  # it claims to exercise every attribute of a declaration: checked
        record["exercises_declarations"] = True
    return TileSource(tiles, record, {"name": f"synthetic:{preset}", "digest": digest_set(tiles_sha256(tiles))})


def source_from_tiles(tiles: Iterable[Tile], label: str = "tiles given in code") -> TileSource:
    tiles = tuple(tiles)
    return TileSource(tiles, {"label": label, "kind": "tiles", "n_tiles": len(tiles)},
                      {"name": "tiles", "digest": digest_set(tiles_sha256(tiles))})


# --- one tile, prepared once ----------------------------------------------------------------------

def check_device() -> torch.device:
    """Where the exact reference, the models and the checks run: the GPU when there is one."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class StageTimer:
    """Wall seconds per pipeline stage (kernels, reference, checks, io), for `alibi bench conform`.

    Timing a GPU stage needs a synchronize at its end; the pipeline only synchronizes when a timer is
    given, so a plain run pays nothing for it."""

    STAGES = ("kernels", "reference", "checks", "io")

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(self.STAGES, 0.0)
        self.cuda = torch.cuda.is_available()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.cuda:
                torch.cuda.synchronize()
            self.seconds[name] += time.perf_counter() - t0


@contextmanager
def _untimed(_name: str) -> Iterator[None]:
    yield


def prepare_tiles(tiles: list[tuple[Tile, Iterable[str]]], device: torch.device, timer: StageTimer | None = None
                  ) -> list[PreparedTile]:
    """Each (tile, regimes) of `tiles` — a batch: one shape — on the check device under each of its regimes
    (validated), with what they share: every operand and each regime's own weight scales in one buffer per tile
    (`pack`: each arm's private copy is then one copy) and the exact accumulator. The power-of-two regime's weight
    scales and every regime's scale facts (`ScaleFacts`) are found for the whole batch at once, where the tiles lie
    (the host, for files and presets), before anything is launched."""
    stage = timer.stage if timer else _untimed
    with stage("io"):
        wanted = [[r.value for r in validate_regimes(regimes)] for _, regimes in tiles]
        pow2 = [k for k, names in enumerate(wanted) if "pow2" in names]
        # every weight scale of the batch rounded at once (elementwise: each tile's own bits, `apply_regime`)
        rounded = dict(zip(pow2, pow2_round(torch.stack([tiles[k][0].s_w for k in pow2]), "nearest"), strict=True)
                       ) if pow2 else {}
        under = [{r: tile.replace(s_w=rounded[k]) if r == "pow2" else apply_regime(tile, r) for r in wanted[k]}
                 for k, (tile, _) in enumerate(tiles)]
        facts = iter(ScaleFacts.of_units([(tile, t) for (tile, _), regimes in zip(tiles, under, strict=True)
                                          for t in regimes.values()]))
        facts_by_tile = [{r: next(facts) for r in regimes} for regimes in under]
    prepared = []
    for (tile, _), regimes, tile_facts in zip(tiles, under, facts_by_tile, strict=True):
        with stage("io"):
            present = {k: v for k, v in operands(tile).items() if v is not None}
            own = {f"s_w:{r}": t.s_w for r, t in regimes.items() if t.s_w is not tile.s_w}
            views = pack({**present, **own}, device)
            t = tile.replace(**{k: views[k] for k in present})
            placed = {r: t.replace(s_w=views[f"s_w:{r}"]) if f"s_w:{r}" in views else t for r in regimes}
        with stage("reference"):
            prepared.append(PreparedTile(t, exact_accumulator(t.a_q, t.w_q) if t.fmt == "int8" else None, placed,
                                         tile_facts))
    return prepared


def prepare(tile: Tile, device: torch.device, timer: StageTimer | None = None,
            regimes: Iterable[str] = REGIMES) -> PreparedTile:
    """`prepare_tiles` of one tile."""
    return prepare_tiles([(tile, regimes)], device, timer)[0]


# --- units ----------------------------------------------------------------------------------------

def run_unit(pair: Pair, prepared: PreparedTile, regime: str, *, invariance: bool = True, graphs: bool = False,
             timer: StageTimer | None = None) -> UnitRun:
    """Both arms on one prepared tile under one regime, each on a private copy of the operands; in the real regime
    (with invariance) also on the row subsets and a second time (`alibi.conform.launches`: eagerly, or replayed from
    a CUDA graph with `graphs`). The launches are queued, not waited for (`run_units` waits once for a batch's).
    Nothing is judged here (`alibi.conform.judge`)."""
    t = prepared.regimes[regime]
    # An exposed accumulator does not depend on the scales: each arm exposes it once per tile (but a block-scaled
    # tile's, which includes them: once per unit, `UnitRun.own_exposed`).
    scaled = t.block_layout is not None
    want = {arm: scaled or arm not in prepared.exposed for arm in ("a", "b")}
    checked = regime == "real" and invariance
    with (timer.stage if timer else _untimed)("kernels"):
        arms = {arm: launcher(k).launch(t, accumulator=want[arm], invariance=checked, graphs=graphs)
                for arm, k in (("a", pair.a), ("b", pair.b))}
    exposed = {arm: arms[arm].acc for arm in ("a", "b") if want[arm]}
    if not scaled:  # kept for the tile's other units
        prepared.exposed.update(exposed)
    a, b = arms["a"], arms["b"]
    return UnitRun(prepared, regime, t, a.out, b.out, a.operands, b.operands,
                   {"a": a.subsets, "b": b.subsets} if checked else None,
                   {"a": a.again, "b": b.again} if checked else None,
                   {"a": a.evidence, "b": b.evidence}, exposed if scaled else None)


def run_units(pair: Pair, work: list[tuple[PreparedTile, str]], *, invariance: bool = True, graphs: bool = False,
              timer: StageTimer | None = None, wait: bool = True) -> list[UnitRun]:
    """`run_unit` on every (prepared tile, regime) of `work`, then one wait for all their launches (`wait_for`: a
    synchronization per launch, or per unit, costs more than a small tile's kernels; a device error is reported
    naming the kernels and the batch's tiles). wait=False leaves them queued: the caller then queues their checks
    and waits for those in `device_errors_of(...)` (`evaluate_batches`)."""
    runs = [run_unit(pair, prepared, regime, invariance=invariance, graphs=graphs, timer=timer)
            for prepared, regime in work]
    with (timer.stage if timer else _untimed)("kernels"):
        if wait:
            wait_for([pair.a, pair.b], batch_label(runs))
    return runs


def batch_label(runs: list[UnitRun]) -> str:
    """The tiles of a batch's runs, as an error names them."""
    return " or ".join(dict.fromkeys(run.tile.name for run in runs))


def evaluate_units(pair: Pair, work: list[tuple[PreparedTile, str]], *,
                   ulp_threshold: int = checks.DEFAULT_ULP_THRESHOLD, invariance: bool = True, graphs: bool = False,
                   timer: StageTimer | None = None) -> list[tuple[UnitResult, dict[str, dict[str, Any]]]]:
    """Run both arms on every (prepared tile, regime) of `work`, then apply every check to all of them at once
    (`alibi.conform.judge`). Returns, per unit, its result and the evidence of each arm's launch that produced
    its output."""
    runs = run_units(pair, work, invariance=invariance, graphs=graphs, timer=timer)
    units = judge(pair, runs, timer.stage if timer else _untimed, ulp_threshold=ulp_threshold, invariance=invariance)
    return [(unit, run.evidence) for unit, run in zip(units, runs, strict=True)]


def evaluate_unit(pair: Pair, prepared: PreparedTile, regime: str, *,
                  ulp_threshold: int = checks.DEFAULT_ULP_THRESHOLD, invariance: bool = True, graphs: bool = False,
                  timer: StageTimer | None = None) -> tuple[UnitResult, dict[str, dict[str, Any]]]:
    """`evaluate_units` of one unit."""
    return evaluate_units(pair, [(prepared, regime)], ulp_threshold=ulp_threshold, invariance=invariance,
                          graphs=graphs, timer=timer)[0]


# Output elements (M·N summed over units) judged at once: bounds the memory of one batch (about 60 bytes per
# element at the peak, so ≈ 2 GB) while keeping a capture's tiles of one shape in a few batches.
BATCH_ELEMENTS = 2**25


def batches(tiles: list[tuple[int, Tile, list[str]]]) -> list[list[tuple[int, Tile, list[str]]]]:
    """(tile index, tile, regimes still to compute) grouped into batches of tiles of one shape, format, output
    dtype, bias presence and scale layout, at most `BATCH_ELEMENTS` output elements each (a bigger tile alone), in
    the order of each batch's first tile; a tile's regimes stay in one batch (they share its exact accumulator
    and its exposed accumulators)."""
    order: list[list[tuple[int, Tile, list[str]]]] = []
    current: dict[tuple, list[tuple[int, Tile, list[str]]]] = {}
    sizes: dict[tuple, int] = {}
    for item in tiles:
        _, t, regimes = item
        key = tile_key(t)
        size = t.M * t.N * len(regimes)
        if key not in current or sizes[key] + size > BATCH_ELEMENTS:
            current[key], sizes[key] = [], 0
            order.append(current[key])
        current[key].append(item)
        sizes[key] += size
    return order


def evaluate_batches(pair: Pair, tiles: list[tuple[int, Tile, list[str]]], device: torch.device, *,
                     ulp_threshold: int, invariance: bool, graphs: bool = False, timer: StageTimer | None = None
                     ) -> Iterator[tuple[int, str, UnitResult, dict[str, dict[str, Any]]]]:
    """Every unit of `tiles` ((tile index, tile, regimes), see `batches`), batch by batch: yields (tile index,
    regime, result, evidence) as each batch is judged.

    The host and the device overlap: the host queues a batch's launches and, without waiting for them, its checks
    (`alibi.conform.judge.measure`); while the device works on them, the host packs the next batch's operands and
    queues their transfer and exact accumulators (`prepare_tiles`); then it collects the batch's numbers and builds
    its verdicts. A device error reported meanwhile is the batch's kernels' (`device_errors_of`). A batch's kernels
    run only after every earlier unit was yielded, so a kernel that ends the process loses no finished unit. A unit's
    result does not depend on this order (each batch's tensors are its own)."""
    stage = timer.stage if timer else _untimed
    order = batches(tiles)

    def prepared(batch: list[tuple[int, Tile, list[str]]]) -> dict[int, PreparedTile]:
        return dict(zip((i for i, _, _ in batch), prepare_tiles([(tile, regimes) for _, tile, regimes in batch],
                                                                 device, timer), strict=True))
    ahead = prepared(order[0]) if order else {}
    for k, batch in enumerate(order):
        # regime by regime: a batch's real-scale units, then its power-of-two ones, each consecutive for the judge
        work = [(i, regime) for regime in REGIMES for i, _, regimes in batch if regime in regimes]
        runs = run_units(pair, [(ahead[i], regime) for i, regime in work], invariance=invariance, graphs=graphs,
                         timer=timer, wait=False)
        with device_errors_of([pair.a, pair.b], batch_label(runs)):
            measurements = measure(pair, runs, stage, ulp_threshold=ulp_threshold, invariance=invariance,
                                   graphs=graphs)
        try:
            ahead = prepared(order[k + 1]) if k + 1 < len(order) else {}
        except Exception:
            yield from _judged(pair, work, runs, measurements, stage)  # this batch's units are kept, then the error
            raise
        yield from _judged(pair, work, runs, measurements, stage)


def _judged(pair: Pair, work: list[tuple[int, str]], runs: list[UnitRun], measurements: list[Measurement],
            stage: Stage) -> Iterator[tuple[int, str, UnitResult, dict[str, dict[str, Any]]]]:
    """The units of one measured batch ((tile index, regime) each in `work`), collected (the wait for the batch's
    launches and checks) and judged."""
    with device_errors_of([pair.a, pair.b], batch_label(runs)):
        units = judged(measurements, len(runs), stage)
    for (i, regime), unit, run in zip(work, units, runs, strict=True):
        yield i, regime, unit, run.evidence


# --- the report -----------------------------------------------------------------------------------

def _required_checks(units: list[UnitResult]) -> list[str]:
    regimes = {u.regime for u in units}
    int8 = [u for u in units if u.fmt == "int8"]
    req = ["shared-operands", "epilogue-model"]
    if int8:
        req += ["int32-no-overflow", "lossless-fp32-entry"]
        # Under pow2 scales the identity is required, except on tiles where the arms declare different
        # bias handling: those rest on predicted-differences, which is then required instead.
        pow2 = [u for u in int8 if u.regime == "pow2"]
        bias_rested = [u for u in pow2 if u.verdict("pow2-identity").evidence.get("reason") in ("bias-handling",
                                                                                                "statistics")]
        if pow2 and len(bias_rested) < len(pow2):
            req.append("pow2-identity")
        if bias_rested:
            req.append("predicted-differences")
    if len(int8) < len(units) and "predicted-differences" not in req:
        # fp8: the arms are judged on the differences their declared schedules and epilogues predict; a pair
        # without that prediction (an undeclared or nondeterministic schedule) is inconclusive, never a pass
        req.append("predicted-differences")
    if "real" in regimes:
        req.append("real-scale-tolerance")
    return req


def summarize(units: list[UnitResult], pair: Pair, *, source: dict[str, Any], seed: int | None,
              regimes: Iterable[str], environment: dict[str, Any], created_at: str | None,
              evidence: dict[str, dict[str, Any]], replay: ReplayEvidence | None = None,
              not_exercised: Iterable[str] = (), graphs: bool = False, eager_because: str | None = None) -> Report:
    """Fold unit results into the report. evidence: each arm's evidence of its last producing launch.

    replay: a flip analysis of the same pair (`--replay`); check 7 is then judged on it instead of
    being inapplicable on every tile, and the report records which file it used (`replay`).
    not_exercised: for a source that claims to exercise every attribute of a declaration, the attributes it did
    not (`alibi.conform.exercised.unexercised`): a verdict that would pass is then inconclusive, naming each.
    graphs: the run asked for CUDA-graph launches; each GPU arm's record then says how it launched
    (`alibi.conform.launches.ArmLauncher.how`), eager_because: why none could be replayed (None where they could).
    """
    not_exercised = list(not_exercised)
    combined = []
    for check in checks.CHECKS:
        combined.append(replay.verdict() if replay is not None and check == "token-level-risk"
                        else checks.combine([u.verdict(check) for u in units]))
    by_name = {v.check: v for v in combined}
    required = _required_checks(units) + (["token-level-risk"] if replay is not None else [])
    if any(v.fired for v in combined):
        verdict = ReportVerdict.FAIL
    elif all(by_name[c].applicable for c in required) and not not_exercised:
        verdict = ReportVerdict.PASS
    else:
        verdict = ReportVerdict.INCONCLUSIVE
    missing = [c for c in required if not by_name[c].applicable]
    return Report(
        created_at=created_at, kernel_a=_kernel_record(pair.a, evidence["a"], graphs, eager_because),
        kernel_b=_kernel_record(pair.b, evidence["b"], graphs, eager_because), selection=pair.selection,
        verdict=verdict,
        equivalence=Equivalence.BITWISE if all(u.bitwise_equal for u in units) else Equivalence.NOT_BITWISE,
        inconclusive_because=(tuple(f"{c}: {by_name[c].detail}" for c in missing) + tuple(not_exercised)
                              if verdict == ReportVerdict.INCONCLUSIVE else ()),
        source=source, seed=seed, regimes=tuple(regimes), checks=tuple(combined), tiles=tuple(units),
        environment=environment, replay=None if replay is None else replay.as_dict())


def _kernel_record(kernel: Kernel, evidence: dict[str, Any], graphs: bool, eager_because: str | None
                   ) -> KernelRecord:
    ok, reason = kernel.available()
    launches = launcher(kernel).how(eager_because) if graphs else ""
    return KernelRecord(kernel.name, kernel.epilogue.name if kernel.epilogue else None, ok,
                        f"{reason}; {launches}" if launches else reason, evidence)


def environment() -> dict[str, Any]:
    """The environment record of this run: the one the folder's manifest carries too
    (`alibi.governance.environment.environment_record`)."""
    return environment_record()


def progress_printer(stream=None) -> Callable[[int, int, str], None]:
    """Per-unit progress on `stream` (default: sys.stderr as it is at the call, not at import): a bar on a
    terminal, `[done/total] label (s)` lines otherwise (alibi.io.progress)."""
    return Progress("conform", stream=stream)


def created_now() -> str:
    """The report's timestamp: now, or `SOURCE_DATE_EPOCH` when set (reproducible runs), UTC to the second."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch is not None:
        try:
            return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(epoch)))
        except (ValueError, OverflowError, OSError):
            raise InputError(f"SOURCE_DATE_EPOCH={one_line(epoch)!r} is not a Unix time in seconds; unset it or "
                             "give an integer") from None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def unit_id(index: int, tile_name: str, regime: str) -> str:
    """`0003-real-layers.0.v_proj`: tile position, regime, and the tile name made file-safe."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", tile_name)[:80]
    return f"{index:04d}-{regime}-{safe}"


def check_formats(pair: Pair, tiles: Iterable[Tile]) -> None:
    """InputError before anything is written unless both kernels take every tile's operand format."""
    for tile in tiles:
        for arm, kernel in (("a", pair.a), ("b", pair.b)):
            formats = tuple(getattr(kernel, "formats", ()) or ())
            if tile.fmt not in formats:
                raise InputError(f"tile {shown(tile.name)} holds {tile.fmt} operands but kernel {kernel.name!r} "
                                 f"(arm {arm}) takes {', '.join(formats) or 'no declared format'}; choose kernels for "
                                 f"{tile.fmt} tiles (see `alibi kernels`); nothing was run or written")


def run_plan(pair: Pair, source: TileSource, regimes: list[str], parameters: dict[str, Any]) -> dict[str, Any]:
    """What a run is, for `--resume` to recognise it: the pair, the tiles (digest), the regimes and parameters,
    the toolkit and the machine."""
    return {"schema": "alibi.conform-plan/v1", "kernels": [pair.a.name, pair.b.name], "selection": pair.selection,
            "source": source.record, "tiles": source.resource, "regimes": regimes, "parameters": parameters,
            "environment": environment_record()}


def _start_units(units_dir: Path, plan: dict[str, Any], resume: bool, created_at: str | None
                 ) -> tuple[UnitStore, str | None]:
    """Create the units folder with its plan (one atomic step), or (resume, and the folder has a plan) check
    that the folder continues this very plan; returns the store and the run's created_at (the first start's,
    when resuming). Resuming where no plan was written yet (a kill before it) starts afresh."""
    if resume and (units_dir / PLAN_FILE).is_file():
        return UnitStore.resume(units_dir, plan)
    return UnitStore.start(units_dir, plan, created_at), created_at


_NOW = object()


def run_conformance(pair: Pair, source: TileSource, regimes: Iterable[str] = REGIMES, *,
                    units_dir: str | Path | None = None, resume: bool = False, seed: int | None = None,
                    ulp_threshold: int = checks.DEFAULT_ULP_THRESHOLD, invariance: bool = True,
                    replay: ReplayEvidence | None = None, created_at: Any = _NOW,
                    progress: Callable[[int, int, str], None] | None = None,
                    timer: StageTimer | None = None, plan_parameters: dict[str, Any] | None = None,
                    device: torch.device | str | None = None, verify_units: bool = False,
                    computed_elsewhere: int = 0, graphs: bool = True) -> Report:
    """The whole procedure over `source` × `regimes`; returns the report.

    units_dir: keep each unit there as it finishes (atomically), with the run's plan; resume: continue
    the run a units folder holds (refused if its plan differs; a folder without a plan starts afresh).
    Every unit read back is checked (`alibi.conform.unit_store`: plan and tile digests, the ledger, the schema and
    the invariants); verify_units: also recompute each and compare the two files bit for bit.
    computed_elsewhere: how many of the stored units this run computed in other processes (the shards),
    so not read from an earlier run. When units come from disk, the report's `source` says how many
    (`units_from_disk`, of `units`, and `units_verified`). created_at: the report's timestamp
    (default: now, `created_now`; None for none). replay: the flip analysis check 7 is judged on (it
    must be of this pair). timer: collects per-stage wall time (`alibi bench conform`). device: where
    the exact reference, the models and the checks run (default `check_device()`); the bits do not
    depend on it (`alibi bench conform` runs both and compares). A source that claims every attribute is first
    narrowed to what the pair's declarations cover (`alibi.conform.exercised.within_declarations`). graphs: replay
    each GPU arm's launches from CUDA graphs where its kernel allows (`alibi.conform.launches`: the same bits; the
    report's kernel records say how each arm launched); False launches every unit eagerly.
    """
    regimes = validate_regimes(regimes)
    source = within_declarations(source, (pair.a, pair.b))
    if not source.tiles:
        raise InputError("no tiles to check")
    if replay is not None:
        replay.require_pair(pair.a.name, pair.b.name)
    check_formats(pair, source.tiles)
    created = created_now() if created_at is _NOW else created_at
    store = None
    if units_dir is not None:
        params = {"seed": seed, "ulp_threshold": ulp_threshold, "invariance": invariance, **(plan_parameters or {})}
        store, created = _start_units(Path(units_dir), run_plan(pair, source, regimes, params), resume, created)
    device = check_device() if device is None else torch.device(device)
    plan = [(i, unit_id(i, t.name, r), t, r) for i, t in enumerate(source.tiles) for r in regimes]
    recorded = store.recorded() if store is not None else {}
    digests: dict[int, str] = {}
    if store is not None:
        digests = {i: tile_sha256(t) for i, t in enumerate(source.tiles)}
    # Units kept earlier are read (and checked) first; the rest are computed batch by batch (`evaluate_batches`).
    results: dict[str, tuple[UnitResult, dict[str, dict[str, Any]]]] = {}
    stored = {uid for _, uid, _, _ in plan if store is not None and store.has(uid)}
    for i, uid, tile, regime in plan:
        if uid in stored:
            results[uid] = store.read(uid, tile, regime, digests[i], recorded)
    todo: dict[int, list[str]] = {}
    for i, uid, _, regime in plan:
        if uid not in stored or verify_units:
            todo.setdefault(i, []).append(regime)
    done = 0
    for i, uid, tile, regime in plan:  # progress in plan order for what is already there
        if uid in stored and not verify_units:
            done += 1
            if progress:
                progress(done, len(plan), f"{tile.name} [{regime}] done earlier")
    for i, regime, unit, evidence in evaluate_batches(pair, [(i, source.tiles[i], r) for i, r in todo.items()], device,
                                                      ulp_threshold=ulp_threshold, invariance=invariance, graphs=graphs,
                                                      timer=timer):
        uid = unit_id(i, source.tiles[i].name, regime)
        if uid in stored:
            if store.unit_document(unit, evidence, digests[i]) != store.path(uid).read_text("utf-8"):
                raise InputError(f"{one_line(str(store.path(uid)))}: --verify-units: the stored unit differs from "
                                 "its recomputation here; delete it and resume (it is computed again)")
            note = "done earlier, recomputed: identical"
        else:
            results[uid] = (unit, evidence)
            if store is not None:
                store.write(uid, unit, evidence, digests[i])
            note = f"{unit.n_differing} differing, max ulp {unit.max_ulp}"
        done += 1
        if progress:
            progress(done, len(plan), f"{source.tiles[i].name} [{regime}] {note}")
    units = [results[uid][0] for _, uid, _, _ in plan]
    evidence = results[plan[-1][1]][1]
    from_disk = len(stored)
    record = source.record
    earlier = from_disk - computed_elsewhere
    if earlier > 0:
        record = {**record, "units_from_disk": earlier, "units": len(plan), "units_verified": verify_units}
    not_exercised: list[str] = []
    if record.get("exercises_declarations"):  # a source that claims every attribute: account for each
        accounting = exercised(pair, source.tiles, regimes, apply_regime)
        record = {**record, "exercised": accounting}
        not_exercised = unexercised(accounting)
    return summarize(units, pair, source=record, seed=seed, regimes=regimes, environment=environment(),
                     created_at=created, evidence=evidence, replay=replay, not_exercised=not_exercised,
                     graphs=graphs, eager_because=eager_because(device))


def eager_because(device: torch.device) -> str | None:
    """Why no arm of a run asking for CUDA graphs can replay one (None where GPU arms may): tiles on the host."""
    if device.type != "cuda":
        return f"the check device is {device.type}, so the tiles lie on the host, where a CUDA graph cannot read them"
    return None


def compute_units(pair: Pair, source: TileSource, regimes: Iterable[str], units_dir: str | Path,
                  tile_indices: Iterable[int], *, ulp_threshold: int = checks.DEFAULT_ULP_THRESHOLD,
                  invariance: bool = True, device: torch.device | str | None = None,
                  progress: Callable[[str], None] | None = None, shard: int | None = None, graphs: bool = True) -> int:
    """Compute every unit of the tiles at `tile_indices` that `units_dir` does not hold yet, and keep each
    there atomically as it finishes (its digest in this process's ledger first); returns how many were
    computed. The work of one shard (a worker process, a Ray task): a unit's bytes do not depend on which
    process computed it, so `run_conformance(..., units_dir=units_dir, resume=True)` afterwards checks every
    unit and writes the report a single process writes. The caller has started the folder (`start_units`);
    this never touches its plan. shard: the worker's index (its own ledger in the folder).
    """
    regimes = validate_regimes(regimes)
    source = within_declarations(source, (pair.a, pair.b))  # the tile indices are those of the pair's source
    device = check_device() if device is None else torch.device(device)
    store = UnitStore(units_dir, shard=shard)
    todo = [(i, source.tiles[i], [r for r in regimes if not store.has(unit_id(i, source.tiles[i].name, r))])
            for i in tile_indices]
    digests: dict[int, str] = {}
    computed = 0
    for i, regime, unit, evidence in evaluate_batches(pair, [item for item in todo if item[2]], device,
                                                      ulp_threshold=ulp_threshold, invariance=invariance,
                                                      graphs=graphs):
        digests[i] = digests.get(i) or tile_sha256(source.tiles[i])
        store.write(unit_id(i, source.tiles[i].name, regime), unit, evidence, digests[i])
        computed += 1
        if progress:
            progress(f"{source.tiles[i].name} [{regime}] {unit.n_differing} differing")
    return computed


def start_units(units_dir: str | Path, pair: Pair, source: TileSource, regimes: Iterable[str], *,
                resume: bool = False, seed: int | None = None, ulp_threshold: int = checks.DEFAULT_ULP_THRESHOLD,
                invariance: bool = True, plan_parameters: dict[str, Any] | None = None,
                created_at: Any = _NOW) -> str | None:
    """Create (or, resuming, check) a units folder with the plan `run_conformance` would write for the same
    arguments; returns the run's created_at. For callers that compute the units elsewhere first."""
    source = within_declarations(source, (pair.a, pair.b))
    check_formats(pair, source.tiles)
    params = {"seed": seed, "ulp_threshold": ulp_threshold, "invariance": invariance, **(plan_parameters or {})}
    created = created_now() if created_at is _NOW else created_at
    return _start_units(Path(units_dir), run_plan(pair, source, validate_regimes(regimes), params), resume, created)[1]


def exit_code(report: Report, strict: bool = False) -> int:
    """0 when every applicable check passed (1 for inconclusive under `strict`), 1 when a check fired."""
    if report.verdict == "fail":
        return 1
    return 1 if (strict and report.verdict == ReportVerdict.INCONCLUSIVE) else 0


__all__ = ["REGIMES", "Pair", "PreparedTile", "StageTimer", "TileSource", "check_formats", "choose_pair",
           "compute_units", "eager_because", "evaluate_unit", "evaluate_units", "exit_code",
           "prepare", "prepare_tiles", "run_conformance", "run_units", "source_from_dir", "source_from_preset",
           "source_from_tiles", "start_units", "summarize", "within_declarations"]
