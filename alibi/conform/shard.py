"""One conformance run spread over worker processes (one per device) or over Ray tasks, same report.

The argument the byte-identical report rests on: a run's report is assembled by `run_conformance` from its
unit results in plan order, and a unit's file (`compute_units`) is a pure function of the kernels, the tile,
the regime and the check parameters — not of the process, the device index or the order units finish in
(its JSON keeps key order; both arms run on private copies; the check device does not change the bits).
So the parent starts the units folder once (`start_units`: the plan, and the resume check), every shard
computes the units of its tiles into that folder, and `run_conformance(..., units_dir=..., resume=True)`
then reads every unit and computes none: the report it returns is the one a single process writes. The
devices are no part of the plan, so `--resume` continues a run on another number of devices.

Shards are by tile: tile i goes to shard i % n, so both regimes of a tile share one prepared tile (exact
accumulator, headroom, device copies). The schedulers are torch.multiprocessing (spawn; one worker per
device, pinned with `torch.cuda.set_device`) and Ray (one task per shard, `num_gpus=1` or `num_cpus=1`).
A shard rebuilds its kernels by registry name and its tiles from a picklable `SourceSpec`, and refuses
tiles whose digest is not the parent's. A failing shard stops the others; the units already written stay.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from alibi.conform.unit_store import UnitStore
from alibi.errors import InputError, KernelUnavailable, WorkerFailed, one_line
from alibi.io.typed import TypedResult

SHARD_RUN_SCHEMA = "alibi.shard-run/v1"
_DEVICE = re.compile(r"^(cuda|cpu):(\d+)$")


# --- what a shard needs to rebuild the run --------------------------------------------------------

@dataclass(frozen=True)
class SourceSpec:
    """How a shard rebuilds the tile source: a folder of tiles, or a synthetic preset with seed and rows.
    Picklable (a path or three scalars), unlike the tiles themselves on the way to a Ray node."""

    folder: str | None = None
    preset: str | None = None
    seed: int = 0
    rows: int | None = None

    def __post_init__(self) -> None:
        if (self.folder is None) == (self.preset is None):
            raise InputError("a shard's tile source is a folder or a synthetic preset, exactly one of them")

    def build(self):
        # deferred: keeps torch out of start-up
        from alibi.conform.pipeline import source_from_dir, source_from_preset

        if self.folder is not None:
            return source_from_dir(self.folder)
        return source_from_preset(self.preset, seed=self.seed, rows=self.rows)


@dataclass(frozen=True)
class ShardJob:
    """One shard: which worker, on which device, which tiles, and everything to rebuild the pair and source.

    kernel_a/kernel_b: registry names (None, None: the default pair, chosen by the same rule as the parent's);
    arms: the (a, b, selection) the parent's pair has — the shard refuses to compute under another pair;
    resource: the parent's tile digest — the shard refuses other tiles. threads: torch CPU threads (0: leave)."""

    worker: int
    device: str
    tile_indices: tuple[int, ...]
    kernel_a: str | None
    kernel_b: str | None
    arms: tuple[str, str, str]
    source: SourceSpec
    resource: dict[str, Any]
    regimes: tuple[str, ...]
    units_dir: str
    ulp_threshold: int
    invariance: bool
    threads: int = 0
    quiet: bool = False
    graphs: bool = True


@dataclass(frozen=True)
class ShardOutcome:
    """What a shard reports back: how many units it computed, or its error (class name, exit code, one line)."""

    worker: int
    device: str
    computed: int = 0
    error_kind: str | None = None
    exit_code: int = 0
    message: str = ""


@dataclass(frozen=True)
class ShardRun(TypedResult):
    """How a sharded run was spread, for the report folder's manifest parameters (never for report.json).

    engine: "torch.multiprocessing" or "ray"; devices: one entry per shard ("cuda:1", "cpu:0", or for Ray
    "ray:GPU"/"ray:CPU"); address: the Ray address given (None for processes); computed: units each shard
    computed (0 where it found them done); wall_s: the sharded phase's wall time (the timing field, kept
    out of the manifest by `manifest_record`)."""

    SCHEMA = SHARD_RUN_SCHEMA

    engine: str
    devices: tuple[str, ...]
    address: str | None
    computed: tuple[int, ...]
    wall_s: float = field(default=0.0, compare=False)
    schema: str = SHARD_RUN_SCHEMA

    def manifest_record(self) -> dict[str, Any]:
        """What the manifest records: engine, devices and Ray address; not the timing, nor the work split
        (both vary from run to run)."""
        return {"engine": self.engine, "devices": list(self.devices),
                **({"address": self.address} if self.address is not None else {})}



# --- devices --------------------------------------------------------------------------------------

def parse_devices(text: str) -> tuple[str, ...]:
    """`cuda:0,cuda:1`, `all` (every visible GPU) or `cpu:0,cpu:1,...` (that many CPU worker processes).

    Refused (InputError): an empty or malformed list, a repeated device, CPU and GPU mixed, a GPU not
    visible here, and GPUs of different models (the kernels' evidence names the GPU model, so units from
    two models would not assemble the report one GPU writes)."""
    # deferred: keeps torch out of start-up
    import torch

    text = text.strip()
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if text == "all":
        if visible == 0:
            raise InputError("--devices all: no GPU is visible here; give cpu:0,cpu:1,... for CPU worker processes")
        devices = tuple(f"cuda:{i}" for i in range(visible))
    else:
        devices = tuple(d.strip() for d in text.split(",") if d.strip())
        bad = [d for d in devices if not _DEVICE.match(d)]
        if not devices or bad:
            what = repr(one_line(bad[0])) if bad else "an empty list"
            raise InputError(f"--devices {one_line(text)!r}: give cuda:0,cuda:1,... or all or cpu:0,cpu:1,... "
                             f"(not {what})")
        if len(set(devices)) != len(devices):
            raise InputError(f"--devices {one_line(text)!r} names a device twice; give each once")
        if len({d.split(':')[0] for d in devices}) > 1:
            raise InputError(f"--devices {one_line(text)!r} mixes cpu and cuda workers; give one kind")
    if devices[0].startswith("cuda"):
        missing = [d for d in devices if int(d.split(":")[1]) >= visible]
        if missing:
            raise InputError(f"--devices: {missing[0]} is not visible here ({visible} GPU(s): "
                             f"{', '.join(f'cuda:{i}' for i in range(visible)) or 'none'}); give visible GPUs")
        models = {d: torch.cuda.get_device_name(int(d.split(":")[1])) for d in devices}
        if len(set(models.values())) > 1:
            raise InputError(f"--devices: {', '.join(f'{d} is a {m}' for d, m in models.items())}; a sharded run "
                             "uses GPUs of one model (its report must be the one a single GPU writes)")
    return devices


def shard_tiles(n_tiles: int, n_shards: int) -> list[tuple[int, ...]]:
    """Tile i → shard i % n: both regimes of a tile stay in one shard (one prepared tile), and neighbouring
    layers (of similar cost) spread over the shards. Shards left without a tile are dropped."""
    shards = [tuple(range(w, n_tiles, n_shards)) for w in range(n_shards)]
    return [s for s in shards if s]


# --- one shard (runs in the worker) ---------------------------------------------------------------

def _pin(device: str, threads: int):
    """The check device of this worker; `cuda:i` becomes the current GPU, so kernels that use "cuda" run on
    it too."""
    # deferred: keeps torch out of start-up
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    kind, _, index = device.partition(":")
    if kind == "cuda":
        if not torch.cuda.is_available() or int(index) >= torch.cuda.device_count():
            raise KernelUnavailable(f"{device} is not visible to this worker")
        torch.cuda.set_device(int(index))
        return torch.device(device)
    return torch.device("cpu")


def run_shard(job: ShardJob) -> int:
    """Compute the units of `job`'s tiles into its units folder (those not there yet); returns how many."""
    # deferred: keeps torch out of start-up
    from alibi.conform.pipeline import choose_pair, compute_units

    device = _pin(job.device, job.threads)
    pair = choose_pair(job.kernel_a, job.kernel_b)
    if (pair.a.name, pair.b.name, pair.selection) != job.arms:
        raise InputError(f"this worker resolves the kernels to {pair.a.name} vs {pair.b.name}, the run to "
                         f"{job.arms[0]} vs {job.arms[1]}; name both kernels (--kernel-a/--kernel-b)")
    source = job.source.build()
    if source.resource != job.resource:
        raise InputError(f"the tiles of {source.resource.get('name')} changed since the run started (digest "
                         f"{source.resource.get('digest')} here, {job.resource.get('digest')} in the plan); "
                         "leave the tiles alone while a run is going and resume")
    label = f"[worker {job.worker} {job.device}]"
    progress = None if job.quiet else (lambda line: print(f"{label} {line}", file=sys.stderr, flush=True))
    return compute_units(pair, source, job.regimes, job.units_dir, job.tile_indices, ulp_threshold=job.ulp_threshold,
                         invariance=job.invariance, device=device, progress=progress, shard=job.worker,
                         graphs=job.graphs)


def shard_outcome(job: ShardJob) -> ShardOutcome:
    """`run_shard` that never raises: the error comes back as data (one line, its exit code), so a worker
    process or a Ray task reports it the same way."""
    try:
        return ShardOutcome(job.worker, job.device, computed=run_shard(job))
    except Exception as exc:  # noqa: BLE001 - every failure is reported to the parent, which raises it
        code = exc.exit_code if isinstance(exc, (InputError, KernelUnavailable)) else WorkerFailed.exit_code
        return ShardOutcome(job.worker, job.device, error_kind=type(exc).__name__, exit_code=code,
                            message=one_line(str(exc) or type(exc).__name__))


def _worker_main(job: ShardJob, conn) -> None:
    """A worker process: one shard, its outcome sent back through the pipe."""
    outcome = shard_outcome(job)
    conn.send(outcome)
    conn.close()


def _raise_for(outcome: ShardOutcome) -> None:
    """The parent's one error for a failed shard: the same class as the worker's when it has an exit code of
    its own (InputError 2, KernelUnavailable 3), WorkerFailed (4) otherwise."""
    text = (f"worker {outcome.worker} on {outcome.device} failed ({outcome.error_kind}): {outcome.message}; the units "
            "it and the other workers finished are kept: fix the cause and run again with --resume")
    if outcome.exit_code == InputError.exit_code:
        raise InputError(text)
    if outcome.exit_code == KernelUnavailable.exit_code:
        raise KernelUnavailable(text)
    raise WorkerFailed(text)


# --- the two schedulers ---------------------------------------------------------------------------

def _run_processes(jobs: list[ShardJob]) -> list[ShardOutcome]:
    """One spawned process per job; the first failure terminates the others (their finished units stay)."""
    # deferred: keeps torch out of start-up
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")  # fork would copy a parent's CUDA context, which CUDA forbids
    running: dict[Any, tuple[ShardJob, Any, Any]] = {}
    try:
        for job in jobs:
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_worker_main, args=(job, send), name=f"alibi-shard-{job.worker}")
            proc.start()
            send.close()  # the parent's copy: the pipe reports EOF once the worker is gone
            running[recv] = (job, proc, recv)
        outcomes: list[ShardOutcome] = []
        while running:
            for recv in wait(list(running)):
                job, proc, _ = running.pop(recv)
                try:
                    outcome = recv.recv()
                except EOFError:  # the worker died before it could report (killed, out of memory, a crash)
                    proc.join()
                    outcome = ShardOutcome(job.worker, job.device, error_kind="exited", exit_code=WorkerFailed.exit_code,
                                           message=f"the worker process exited with code {proc.exitcode} "
                                                   "before reporting")
                proc.join()
                if outcome.error_kind is not None:
                    _raise_for(outcome)
                outcomes.append(outcome)
        return sorted(outcomes, key=lambda o: o.worker)
    finally:
        for _job, proc, recv in running.values():  # only left on a failure or an interrupt
            proc.terminate()
        for _job, proc, recv in running.values():
            proc.join()
            recv.close()


def require_ray():
    """The ray module; InputError naming the extra to install where it is missing (checked before a run
    creates anything)."""
    try:
        # deferred: keeps ray out of start-up
        import ray
    except ImportError:
        raise InputError("--ray needs the ray package: pip install 'integer-alibi[ray]'") from None
    return ray


def _run_ray(address: str, make_jobs: Callable[[int, str, int], list[ShardJob]], n_tiles: int,
             quiet: bool) -> tuple[list[ShardOutcome], tuple[str, ...]]:
    """The shards as Ray tasks: one per GPU of the cluster (`num_gpus=1`), or with no GPU one per CPU
    (`num_cpus=1`). `address` "local" starts a Ray on this machine for the run and stops it after."""
    ray = require_ray()
    local = address == "local"
    try:
        ray.init(**({"include_dashboard": False} if local else {"address": address}),
                 log_to_driver=not quiet, logging_level="ERROR")
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise InputError(f"--ray {one_line(address)!r}: cannot connect ({one_line(str(exc))[:200]}); give the "
                         "address of a running Ray cluster (ray start --head) or local") from None
    try:
        resources = ray.cluster_resources()
        gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 1))
        kind, count = ("cuda", gpus) if gpus else ("cpu", max(1, cpus))
        # Inside a task Ray sets CUDA_VISIBLE_DEVICES to the GPU it granted: that GPU is cuda:0 there.
        jobs = make_jobs(min(count, n_tiles), f"{kind}:0", 1 if kind == "cpu" else 0)
        task = ray.remote(shard_outcome).options(max_retries=0, **({"num_gpus": 1} if kind == "cuda" else
                                                                   {"num_cpus": 1}))
        pending = {task.remote(job): job for job in jobs}
        outcomes = []
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            job = pending.pop(done[0])
            try:
                outcome = ray.get(done[0])
            except Exception as exc:  # noqa: BLE001 - a task Ray could not run (node lost, worker died)
                outcome = ShardOutcome(job.worker, job.device, error_kind=type(exc).__name__,
                                       exit_code=WorkerFailed.exit_code, message=one_line(str(exc))[:300])
            if outcome.error_kind is not None:
                for ref in pending:
                    ray.cancel(ref, force=True)
                _raise_for(outcome)
            outcomes.append(outcome)
        return sorted(outcomes, key=lambda o: o.worker), tuple(f"ray:{'GPU' if kind == 'cuda' else 'CPU'}"
                                                               for _ in jobs)
    finally:
        ray.shutdown()  # stops the local Ray, or disconnects this driver from the cluster (which keeps running)


# --- the entry point ------------------------------------------------------------------------------

def run_sharded(kernel_a: str | None, kernel_b: str | None, source_spec: SourceSpec, regimes: Iterable[str],
                units_dir: str | Path, devices: Iterable[str] | None = None, *, ray_address: str | None = None,
                ulp_threshold: int, invariance: bool, resume: bool = False, seed: int | None = None,
                plan_parameters: dict[str, Any] | None = None, source=None, quiet: bool = False,
                graphs: bool = True) -> ShardRun:
    """Compute every unit of the run into `units_dir`, spread over `devices` (worker processes) or over Ray
    tasks (`ray_address`); then `run_conformance(..., units_dir=units_dir, resume=True)` with the same
    arguments assembles the report, computing nothing.

    kernel_a/kernel_b: registry names, or both None for the default pair. source: the parent's TileSource
    when it has built one already (else built from `source_spec`); each shard rebuilds it from the spec and
    checks the digest. resume/seed/plan_parameters: as for `run_conformance`, which this plan must match. graphs:
    each shard replays its GPU arms' launches from CUDA graphs (`alibi.conform.launches`).
    Raises InputError / KernelUnavailable / WorkerFailed naming the failed worker; finished units stay.
    """
    # deferred: keeps torch out of start-up
    from alibi.conform.exercised import within_declarations
    from alibi.conform.pipeline import choose_pair, start_units, unit_id, validate_regimes

    if (devices is None) == (ray_address is None):
        raise InputError("give devices (worker processes) or a Ray address, exactly one of them")
    regimes = tuple(validate_regimes(regimes))
    source = source_spec.build() if source is None else source
    if not source.tiles:
        raise InputError("no tiles to check")
    pair = choose_pair(kernel_a, kernel_b)
    source = within_declarations(source, (pair.a, pair.b))  # the tiles the shards' indices count (compute_units)
    if ray_address is not None:
        require_ray()  # before the units folder is created
    start_units(units_dir, pair, source, regimes, resume=resume, seed=seed, ulp_threshold=ulp_threshold,
                invariance=invariance, plan_parameters=plan_parameters)
    units_dir = Path(units_dir)
    arms = (pair.a.name, pair.b.name, pair.selection)

    def make_jobs(n: int, device_of: Callable[[int], str] | str, threads: int) -> list[ShardJob]:
        jobs = [ShardJob(w, device_of if isinstance(device_of, str) else device_of(w), tiles, kernel_a, kernel_b,
                         arms, source_spec, source.resource, regimes, str(units_dir), ulp_threshold, invariance,
                         threads, quiet, graphs)
                for w, tiles in enumerate(shard_tiles(len(source.tiles), n))]
        # before any shard starts: the run's ledger says which units each shard's ledger may vouch for
        UnitStore(units_dir).assign({j.worker: [unit_id(i, source.tiles[i].name, r) for i in j.tile_indices
                                                for r in regimes] for j in jobs})
        return jobs

    start = time.perf_counter()
    if ray_address is not None:
        outcomes, used = _run_ray(ray_address, make_jobs, len(source.tiles), quiet)
        engine = "ray"
    else:
        devices = tuple(devices)
        # CPU workers share the cores: each gets its part, so n workers do not oversubscribe the machine.
        threads = max(1, (os.cpu_count() or 1) // len(devices)) if devices[0].startswith("cpu") else 0
        jobs = make_jobs(len(devices), lambda w: devices[w], threads)
        outcomes, used, engine = _run_processes(jobs), tuple(j.device for j in jobs), "torch.multiprocessing"
    missing = [uid for i, t in enumerate(source.tiles) for r in regimes
               if not (units_dir / f"{(uid := unit_id(i, t.name, r))}.json").is_file()]
    if missing:
        # A Ray node writing into a folder the parent does not see (no shared file system) ends here.
        raise InputError(f"{one_line(str(units_dir))}: {len(missing)} unit(s) the shards reported done are not "
                         f"there (first {missing[0]}); put --out on a file system every worker shares")
    by_worker = {o.worker: o.computed for o in outcomes}
    return ShardRun(engine, tuple(used), ray_address, tuple(by_worker.get(w, 0) for w in range(len(outcomes))),
                    wall_s=time.perf_counter() - start)


__all__ = ["SHARD_RUN_SCHEMA", "ShardJob", "ShardOutcome", "ShardRun", "SourceSpec", "parse_devices", "require_ray",
           "run_sharded", "run_shard", "shard_outcome", "shard_tiles"]
