"""Greedy agreement: does swapping the kernel change what the model generates?

Each arm generates greedily (argmax of the fp32 logits, KV cache, `LoadedModel.greedy_batch`) from
the first T tokens of each window of a pinned prompt set. Every run of every arm is a fresh
process (a cold restart: model loaded, kernels compiled or loaded from their caches, nothing
carried over), run `runs` times per arm (default 2) so that each arm is shown to reproduce itself
before the arms are compared: a difference between arms means something only if neither arm
differs from itself.

Batching. All windows of a prompt set are equally long, so B prompts batch without padding: a
batch changes only M of the GEMMs (B·T at prefill, B per decode step), identically for both arms.
The batch size is recorded; the last batch may be smaller when B does not divide the prompt count.

One run is a folder `run.json` (`GreedyRun`, schema `alibi-greedy-run/v2`; v1, without logit digests, is
read too) + `manifest.json` (kind `replay`). A comparison is a folder:

    greedy.json       `GreedyAgreement` (schema `alibi-greedy/v2`; v1 is read too)
    runs/a-1, a-2, b-1, b-2, ...   one run folder each
    manifest.json     both arms' treatments, the inputs, the parameters
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from alibi.errors import InputError, one_line
from alibi.governance.identity import require_identity
from alibi.governance.manifest import read_manifest, write_manifest
from alibi.io import atomic
from alibi.io.progress import Progress
from alibi.io.typed import TypedResult
from alibi.model.checkpoint import read_config
from alibi.model.runner import load_model
from alibi.model.trace import ModuleTrace
from alibi.tokens.records import window_sha256
from alibi.tokens.setup import (
    check_output,
    combined_predicate,
    load_prompts,
    open_inputs,
    replay_predicate,
    resolve_windows,
)
from alibi.tokens.teacher_forced import StepFailed, alibi_command, run_child
from alibi.tokens.variations import Execution, save_execution

RUN_SCHEMA = "alibi-greedy-run/v2"
SCHEMA = "alibi-greedy/v2"
TRACE_FILE = "trace.pt"
RUN_FILE = "run.json"
RESULT_FILE = "greedy.json"


@dataclass(frozen=True)
class GreedyRun(TypedResult):
    """One run of one arm.

    kernel: registry name (None for a dense model); arm: its label; run: which run of the arm
    (1, 2, ...); prompt_tokens: T; new_tokens: G; batch_size: B; windows: the window indices,
    in order; prompt_sha256: `window_sha256` of each prompt's T token ids; sequences: the G chosen
    ids per prompt; seconds: wall time of the generation alone (model load excluded);
    logit_digests: per prompt, the digest (16 hex digits, `alibi.model.trace.row_digests`) of the
    fp32 logit row each token was chosen from, so two runs compare bit for bit at every step (None
    in a v1 file).
    """

    SCHEMA = RUN_SCHEMA
    READS = ("alibi-greedy-run/v1",)  # without logit_digests
    JSON_SORT_KEYS = True
    REMEDY = "re-run it"
    FILE = RUN_FILE

    kernel: str | None
    arm: str
    run: int
    prompt_tokens: int
    new_tokens: int
    batch_size: int
    windows: tuple[int, ...]
    prompt_sha256: tuple[str, ...]
    sequences: tuple[tuple[int, ...], ...]
    seconds: float
    schema: str = RUN_SCHEMA
    logit_digests: tuple[tuple[str, ...], ...] | None = None

    @classmethod
    def from_dict(cls, doc: Any, where: str = "") -> GreedyRun:
        run = super().from_dict(doc, where)
        where = one_line(where or RUN_FILE)
        if run.logit_digests is not None and [len(d) for d in run.logit_digests] != [len(q) for q in run.sequences]:
            raise InputError(f"{where}: logit digests do not match the sequences; the file is damaged: re-run it")
        if len(run.sequences) != len(run.windows) or any(len(s) != run.new_tokens for s in run.sequences):
            raise InputError(f"{where}: {len(run.sequences)} sequences for {len(run.windows)} windows, or a sequence "
                             f"not of {run.new_tokens} tokens; the file is truncated: re-run it")
        return run


def first_divergence(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    """Index of the first generated token at which two sequences differ; None when identical.

    Sequences of different lengths that agree on the shorter one diverge at its length."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass(frozen=True)
class GreedyAgreement(TypedResult):
    """Two arms' greedy runs compared.

    kernel_a, kernel_b: the arms' kernels; prompt_tokens, new_tokens, batch_size, windows: as in
    each run; runs_per_arm: fresh-process runs of each arm; sequences_a, sequences_b: per run (in
    run order) the sequences per prompt; arm_a_reproduces, arm_b_reproduces: every run of the arm
    gave the same sequences as its first; self_first_divergence_a/_b: per prompt, the first
    divergence of any later run from run 1 (None when all runs agree); n_prompts; identical_sequences:
    prompts whose run-1 sequences are identical across the arms; first_divergence: per prompt,
    the first generated index where arm a's and arm b's run-1 sequences differ (None when
    identical); status: `compared`, or a sentence saying which arm failed to reproduce itself (the
    comparison across arms is then not attributable to the kernel); identity: the identity-contract
    records (`alibi.governance.IdentityRecord.as_dict`) between the runs, by pair name;
    logits_reproduce_a / _b: every run of the arm chose every token from a logit row bitwise equal to
    run 1's (None when a run has no logit digests); logit_rows_identical / logit_rows_compared: over
    prompts and steps of the run-1 pair, logit rows bitwise equal across the arms, and rows compared
    (both arms' rows exist up to the first token where the sequences part).
    """

    SCHEMA = SCHEMA
    READS = ("alibi-greedy/v1",)  # without the logit-row fields
    JSON_SORT_KEYS = True
    REMEDY = "re-run it"
    FILE = RESULT_FILE

    kernel_a: str | None
    kernel_b: str | None
    prompt_tokens: int
    new_tokens: int
    batch_size: int
    windows: tuple[int, ...]
    runs_per_arm: int
    sequences_a: tuple[tuple[tuple[int, ...], ...], ...]
    sequences_b: tuple[tuple[tuple[int, ...], ...], ...]
    arm_a_reproduces: bool
    arm_b_reproduces: bool
    self_first_divergence_a: tuple[int | None, ...]
    self_first_divergence_b: tuple[int | None, ...]
    n_prompts: int
    identical_sequences: int
    first_divergence: tuple[int | None, ...]
    status: str
    identity: dict[str, Any]
    schema: str = SCHEMA
    logits_reproduce_a: bool | None = None
    logits_reproduce_b: bool | None = None
    logit_rows_identical: int | None = None
    logit_rows_compared: int | None = None


def compare_runs(runs_a: list[GreedyRun], runs_b: list[GreedyRun], identity: dict[str, Any]) -> GreedyAgreement:
    """Compare the runs of two arms (each list in run order, at least one run each)."""
    first_a, first_b = runs_a[0], runs_b[0]
    for r in (*runs_a, *runs_b):
        same = (r.prompt_tokens, r.new_tokens, r.batch_size, r.windows, r.prompt_sha256)
        if same != (first_a.prompt_tokens, first_a.new_tokens, first_a.batch_size, first_a.windows,
                    first_a.prompt_sha256):
            raise InputError(f"greedy run {r.arm}-{r.run} was made with other prompts or settings than run "
                             f"{first_a.arm}-{first_a.run}; compare runs of one request only")

    def self_divergence(runs: list[GreedyRun]) -> tuple[int | None, ...]:
        out = []
        for i, seq in enumerate(runs[0].sequences):
            later = [first_divergence(seq, r.sequences[i]) for r in runs[1:]]
            hits = [d for d in later if d is not None]
            out.append(min(hits) if hits else None)
        return tuple(out)

    self_a, self_b = self_divergence(runs_a), self_divergence(runs_b)
    repro_a, repro_b = all(d is None for d in self_a), all(d is None for d in self_b)
    across = tuple(first_divergence(x, y) for x, y in zip(first_a.sequences, first_b.sequences))
    broken = [f"arm {label} ({r[0].kernel}) does not reproduce itself across fresh processes"
              for label, r, ok in (("a", runs_a, repro_a), ("b", runs_b, repro_b)) if not ok]

    def logits_reproduce(runs: list[GreedyRun]) -> bool | None:
        if any(r.logit_digests is None for r in runs):
            return None
        return all(r.logit_digests == runs[0].logit_digests for r in runs[1:])

    rows = logit_row_agreement(first_a, first_b)
    return GreedyAgreement(
        kernel_a=first_a.kernel, kernel_b=first_b.kernel, prompt_tokens=first_a.prompt_tokens,
        new_tokens=first_a.new_tokens, batch_size=first_a.batch_size, windows=first_a.windows,
        runs_per_arm=min(len(runs_a), len(runs_b)),
        sequences_a=tuple(r.sequences for r in runs_a), sequences_b=tuple(r.sequences for r in runs_b),
        arm_a_reproduces=repro_a, arm_b_reproduces=repro_b, self_first_divergence_a=self_a,
        self_first_divergence_b=self_b, n_prompts=len(across), identical_sequences=sum(d is None for d in across),
        first_divergence=across, status="; ".join(broken) if broken else "compared", identity=identity,
        logits_reproduce_a=logits_reproduce(runs_a), logits_reproduce_b=logits_reproduce(runs_b),
        logit_rows_identical=None if rows is None else rows[0], logit_rows_compared=None if rows is None else rows[1])


def logit_row_agreement(a: GreedyRun, b: GreedyRun) -> tuple[int, int] | None:
    """(identical, compared) logit rows of two runs over the prompts both generated (matched by window):
    step i of a prompt is compared while the two sequences agree on tokens 0 … i−1, the steps where
    both rows were computed from the same inputs. None when either run has no logit digests."""
    if a.logit_digests is None or b.logit_digests is None:
        return None
    where_b = {w: i for i, w in enumerate(b.windows)}
    identical = compared = 0
    for i, w in enumerate(a.windows):
        if w not in where_b:
            continue
        j = where_b[w]
        for step, (da, db) in enumerate(zip(a.logit_digests[i], b.logit_digests[j])):
            compared += 1
            identical += da == db
            if a.sequences[i][step] != b.sequences[j][step]:
                break
    return identical, compared


def summary_lines(result: GreedyAgreement) -> list[str]:
    """A short human summary of a comparison (stdout of the two-arm command)."""
    diverged = [d for d in result.first_divergence if d is not None]
    lines = [(f"greedy: {result.kernel_a} (a) vs {result.kernel_b} (b), {result.n_prompts} prompts × "
              f"{result.new_tokens} new tokens after {result.prompt_tokens}, batch {result.batch_size}, "
              f"{result.runs_per_arm} fresh-process runs per arm"),
             f"  arm a reproduces itself: {result.arm_a_reproduces}; arm b: {result.arm_b_reproduces}",
             f"  identical sequences across arms: {result.identical_sequences}/{result.n_prompts}"]
    if result.logits_reproduce_a is not None:
        lines.append(f"  every logit row reproduces: arm a {result.logits_reproduce_a}, arm b {result.logits_reproduce_b}; "
                     f"identical across arms: {result.logit_rows_identical}/{result.logit_rows_compared} rows")
    if diverged:
        lines.append(f"  first divergence (generated token index): min {min(diverged)}, "
                     f"median {sorted(diverged)[len(diverged) // 2]}, max {max(diverged)}")
    if result.status != "compared":
        lines.append(f"  WARNING: {result.status}")
    return lines


# --- one run of one arm, in this process -------------------------------------------------------


def resolve_greedy(prompts, prompt_tokens: int, new_tokens: int, windows: int | None, batch_size: int,
                   where: str, max_positions: int | None) -> tuple[int, ...]:
    """Validate a greedy request; the window indices."""
    if not 1 <= prompt_tokens <= prompts.tokens:
        raise InputError(f"--prompt-tokens {prompt_tokens}: must be in 1..{prompts.tokens} (the window length of {where})")
    if new_tokens < 1:
        raise InputError(f"--new-tokens {new_tokens}: must be at least 1")
    if batch_size < 1:
        raise InputError(f"--batch-size {batch_size}: must be at least 1")
    if max_positions is not None and prompt_tokens + new_tokens > max_positions:
        raise InputError(f"--prompt-tokens {prompt_tokens} + --new-tokens {new_tokens} exceeds the model's "
                         f"max_position_embeddings {max_positions}; generate fewer tokens")
    return resolve_windows(prompts, windows, where)


def _max_positions(model_dir: Path) -> int | None:
    value = read_config(model_dir).get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


def generate(lm, input_ids: torch.Tensor, windows: tuple[int, ...], prompt_tokens: int, new_tokens: int,
             batch_size: int, progress: Progress | None = None) -> tuple[tuple[int, ...], ...]:
    """Greedy sequences for `windows` of the prompt ids [N,L], `batch_size` prompts at a time."""
    out, digests = generate_with_digests(lm, input_ids, windows, prompt_tokens, new_tokens, batch_size, progress)
    return out


def generate_with_digests(lm, input_ids: torch.Tensor, windows: tuple[int, ...], prompt_tokens: int, new_tokens: int,
                          batch_size: int, progress: Progress | None = None, trace=None):
    """As `generate`, also the logit-row digests (hex) per prompt and step; `trace`: a ModuleTrace to
    tell which prompts each batch holds."""
    out: list[tuple[int, ...]] = []
    digests: list[tuple[str, ...]] = []
    for start in range(0, len(windows), batch_size):
        batch = list(windows[start : start + batch_size])
        ids = input_ids[batch, :prompt_tokens]
        if trace is not None:
            trace.prompts = batch
        steps: list[torch.Tensor] = []
        out += [tuple(row) for row in lm.greedy_batch(ids, new_tokens, logit_digests=steps).tolist()]
        per_prompt = torch.stack(steps, dim=1).tolist()
        digests += [tuple(f"{d & 0xFFFFFFFFFFFFFFFF:016x}" for d in row) for row in per_prompt]
        if progress:
            progress(len(out), len(windows), f"prompts {batch[0]}..{batch[-1]}: {new_tokens} tokens each")
    return tuple(out), tuple(digests)


DECODINGS = ("auto", "eager", "cuda-graphs")
"""How greedy decoding runs: auto replays CUDA graphs on a CUDA device (eager on the CPU and with --trace)."""


def graphs_for(decode: str, trace: bool) -> bool | None:
    """`load_model`'s cuda_graphs for a --decode choice (None: graphs where the model runs on CUDA); refuses a
    choice it does not know and --trace with cuda-graphs, in one line."""
    if decode not in DECODINGS:
        raise InputError(f"--decode {decode}: choose one of {', '.join(DECODINGS)}")
    if trace and decode == "cuda-graphs":
        raise InputError("--trace and --decode cuda-graphs: a trace records every module's output as it runs, and a "
                         "replayed graph runs no module code; drop one of them (--decode auto traces eagerly)")
    if decode == "auto":
        return False if trace else None
    return decode == "cuda-graphs"


def refuse_mixed_decoding(run_a: Path, run_b: Path) -> None:
    """Under --decode auto each arm decodes with CUDA graphs unless its kernel cannot be captured; arms that ended
    up decoding differently would break the identity contract at the end, so the first pair of runs stops the
    study here, in one line naming the arm that could not be captured."""
    execution = {arm: read_manifest(run).statement["predicate"]["parameters"].get("execution") or {}
                 for arm, run in (("a", run_a), ("b", run_b))}
    decoding = {arm: e.get("decode", "eager") for arm, e in execution.items()}
    if decoding["a"] != decoding["b"]:
        eager = "a" if decoding["a"] == "eager" else "b"
        why = execution[eager].get("graphs_refused") or "it decoded eagerly"
        raise InputError(f"--decode auto: arm {eager} decoded eagerly ({why}) and the other arm with CUDA graphs; "
                         "the arms must decode alike: pass --decode eager")


def run_greedy_arm(model_dir: str | os.PathLike, prompts_dir: str | os.PathLike, out: str | os.PathLike, *,
                   kernel: str | None, prompt_tokens: int, new_tokens: int, windows: int | None = None,
                   batch_size: int = 1, arm: str | None = None, run_index: int = 1, device: str | None = None,
                   overwrite: bool = False, progress: Progress | None = None, deterministic: bool = True,
                   trace: bool = False, decode: str = "auto") -> GreedyRun:
    """One run of one arm into the folder `out` (run.json + manifest.json, atomically; with `trace`
    also trace.pt, every module's output digests for `alibi locate`; `decode` one of DECODINGS: with CUDA graphs
    the decode steps replay them, `alibi.model.decode_graphs`, and the manifest's execution mode says so)."""
    model_dir = Path(model_dir)
    prompts = load_prompts(prompts_dir)
    if run_index < 1:
        raise InputError(f"--run-index {run_index}: must be at least 1")
    chosen = resolve_greedy(prompts, prompt_tokens, new_tokens, windows, batch_size, str(prompts_dir),
                            _max_positions(model_dir))
    cuda_graphs = graphs_for(decode, trace)
    check_output(out, {"--model": model_dir, "--prompts": prompts_dir}, overwrite)
    inputs = open_inputs(model_dir, prompts)
    lm = load_model(model_dir, kernel, device, deterministic=deterministic, cuda_graphs=cuda_graphs)
    name = lm.kernel.name if lm.kernel is not None else None
    label = arm or name or "dense"
    if progress:
        progress.note(f"greedy run {label}-{run_index}: {name or 'dense'} on {lm.device}, {len(chosen)} prompts, "
                      f"batch {batch_size}, {lm.execution.decode} decoding")
        if lm.execution.graphs_refused:
            progress.note(f"greedy: {lm.execution.graphs_refused}")

    start = time.perf_counter()
    with ModuleTrace(lm) if trace else nullcontext() as recorder:
        sequences, digests = generate_with_digests(lm, prompts.input_ids, chosen, prompt_tokens, new_tokens,
                                                   batch_size, progress, recorder)
    seconds = time.perf_counter() - start
    run = GreedyRun(kernel=name, arm=label, run=run_index, prompt_tokens=prompt_tokens, new_tokens=new_tokens,
                    batch_size=batch_size, windows=chosen,
                    prompt_sha256=tuple(window_sha256(prompts.input_ids[w, :prompt_tokens]) for w in chosen),
                    sequences=sequences, seconds=round(seconds, 3), logit_digests=digests)
    with atomic.staged_dir(out) as stage:
        atomic.write_text(stage / RUN_FILE, run.to_json())
        if trace:
            save_execution(Execution("greedy", {}, recorder), stage / TRACE_FILE)
        write_manifest(stage, "replay", replay_predicate(inputs, lm, label, {
            "replay": "greedy", "windows": list(chosen), "prompt_tokens": prompt_tokens,
            "new_tokens": new_tokens, "batch_size": batch_size, "decoding": "argmax of fp32 logits, KV cache",
            "trace": trace}))
    return run


def read_run(folder: str | os.PathLike) -> GreedyRun:
    path = Path(folder) / RUN_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read the greedy run ({exc.strerror})") from None
    return GreedyRun.from_json(text, str(path))


# --- two arms, every run in a fresh process -----------------------------------------------------


def run_agreement(model_dir: str | os.PathLike, prompts_dir: str | os.PathLike, out: str | os.PathLike, *,
                  kernel_a: str, kernel_b: str, prompt_tokens: int, new_tokens: int, windows: int | None = None,
                  batch_size: int = 1, runs: int = 2, device: str | None = None, overwrite: bool = False,
                  quiet: bool = False, deterministic: bool = True, trace: bool = False,
                  decode: str = "auto") -> GreedyAgreement | int:
    """Every run of both arms in a fresh process (a-1, b-1, a-2, b-2, … interleaved, so a drift of the
    machine over time cannot pass for a kernel difference), then the comparison. Returns the
    result, or the exit code of the run that failed (nothing is written then)."""
    model_dir, prompts_dir = Path(model_dir).resolve(), Path(prompts_dir).resolve()
    if runs < 1:
        raise InputError(f"--runs {runs}: must be at least 1 (2 shows that each arm reproduces itself)")
    graphs_for(decode, trace)
    prompts = load_prompts(prompts_dir)
    chosen = resolve_greedy(prompts, prompt_tokens, new_tokens, windows, batch_size, str(prompts_dir),
                            _max_positions(model_dir))
    check_output(out, {"--model": model_dir, "--prompts": prompts_dir}, overwrite)
    common = ["--model", str(model_dir), "--prompts", str(prompts_dir), "--prompt-tokens", str(prompt_tokens),
              "--new-tokens", str(new_tokens), "--batch-size", str(batch_size), "--windows", str(len(chosen))]
    if device is not None:
        common += ["--device", device]
    if quiet:
        common.append("--quiet")
    if not deterministic:
        common.append("--nondeterministic")
    if trace:
        common.append("--trace")
    common += ["--decode", decode]
    try:
        with atomic.staged_dir(out) as stage:
            folders: dict[str, list[Path]] = {"a": [], "b": []}
            for i in range(1, runs + 1):
                for label, kernel in (("a", kernel_a), ("b", kernel_b)):
                    folder = stage / "runs" / f"{label}-{i}"
                    code = run_child(alibi_command("replay", "greedy", *common, "--kernel", kernel, "--arm", label,
                                                   "--run-index", str(i), "--out", str(folder)),
                                     f"greedy run {label}-{i} ({kernel})")
                    if code:
                        raise StepFailed(code)
                    folders[label].append(folder)
                if i == 1 and decode == "auto":
                    refuse_mixed_decoding(folders["a"][0], folders["b"][0])
            identity = {"a-1 vs b-1": require_identity(folders["a"][0], folders["b"][0], ("kernel",)).as_dict()}
            for label in ("a", "b"):
                for j, folder in enumerate(folders[label][1:], start=2):
                    identity[f"{label}-1 vs {label}-{j}"] = require_identity(folders[label][0], folder,
                                                                             ("none",)).as_dict()
            for record in identity.values():  # paths relative to the result folder, not the staging folder
                for side in ("a", "b"):
                    record[side]["manifest"] = str(Path(record[side]["manifest"]).relative_to(stage))
            result = compare_runs([read_run(f) for f in folders["a"]], [read_run(f) for f in folders["b"]], identity)
            atomic.write_text(stage / RESULT_FILE, result.to_json())
            write_manifest(stage, "replay", combined_predicate(
                {"a": folders["a"][0], "b": folders["b"][0]},
                {"replay": "greedy-agreement", "windows": list(chosen), "prompt_tokens": prompt_tokens,
                 "new_tokens": new_tokens, "batch_size": batch_size, "runs_per_arm": runs,
                 "runs": "each run a fresh process, interleaved a-1, b-1, a-2, b-2, ..."}))
    except StepFailed as failed:
        return failed.code
    return result
