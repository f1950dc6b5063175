"""Execution variations: does a token get the same logits however the runner schedules it?

The specification (as vLLM and SGLang state their deterministic modes): under a fixed model,
kernel and configuration, the same prompt gives bitwise-identical logits at corresponding
positions across executions that vary batch composition, prompt chunking, prefill versus decode
and KV-cache reuse. `certify_variations` runs one model and kernel through pairs of executions
that differ in exactly one of these, compares the fp32 logit rows of positions T … T+P−1 of every
prompt bit for bit, and, for a pair that differs, names the first diverging module from the two
runs' traces (`alibi.model.trace.first_divergence`) and whether it is a W8A8 Linear — a kernel
that is not M-invariant — or the runner's own arithmetic.

Executions (each over the first T+P tokens of N prompt windows, teacher-forced, every row traced):

    prefill          each prompt alone, one forward of T+P tokens, no cache
    decode@B         B prompts at once: a prefill of T tokens, then P single-token steps with the cache
    decode@B~        as decode@B with the prompts in reverse order (other neighbours, other rows)
    chunked@C        each prompt alone, fed in chunks of C tokens with the cache
    recompute        each prompt alone, position t computed by a fresh prefill of tokens 0 … t
    decode@B, fresh  decode@B in a new process (a cold restart: model loaded and kernels built anew)

Variations (pairs):

    cold-restart         decode@Bmax   vs decode@Bmax in a fresh process
    batch-size-B         decode@1      vs decode@B, for each B > 1
    batch-composition    decode@Bmax   vs decode@Bmax~
    chunked-prefill      prefill       vs chunked@C
    prefill-vs-decode    prefill       vs decode@1
    kv-cache-vs-recompute  decode@1    vs recompute
"""

from __future__ import annotations

import io
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from alibi.errors import InputError
from alibi.governance.manifest import write_manifest
from alibi.io import atomic
from alibi.io.progress import Progress
from alibi.io.typed import TypedResult
from alibi.model.runner import load_model
from alibi.model.trace import Call, Divergence, ModuleTrace, first_divergence, read_trace_file, row_digests
from alibi.tokens.setup import check_output, load_prompts, open_inputs, replay_predicate, resolve_span
from alibi.tokens.teacher_forced import alibi_command, run_child

SCHEMA = "alibi-variations/v1"
RESULT_FILE = "variations.json"
REPORT_FILE = "report.md"
DEFAULT_BATCH_SIZES = (2, 4)
DEFAULT_CHUNK = 16


@dataclass(frozen=True)
class VariationResult:
    """One variation: two executions that differ in one respect.

    name, description; execution_a, execution_b: which executions were compared; positions_compared:
    (prompt, position) rows of positions T … T+P−1 compared; positions_identical: of those, rows whose
    fp32 logits are bitwise equal; first_divergence: the first (prompt, position, module) whose
    output differs between the two traces (None when none does; it may lie in the context
    positions); kernel_variant: the first diverging module is a W8A8 Linear, i.e. the kernel is not
    M-invariant (None when nothing diverged); holds: every compared row identical."""

    name: str
    description: str
    execution_a: str
    execution_b: str
    positions_compared: int
    positions_identical: int
    first_divergence: dict[str, Any] | None
    kernel_variant: bool | None
    holds: bool


@dataclass(frozen=True)
class VariationsReport(TypedResult):
    """`alibi variations` (schema `alibi-variations/v1`).

    kernel: the W8A8 Linears' kernel (None for a dense model); execution: the runner's mode
    (`alibi.model.execution.ExecutionMode.as_dict`); device; windows: the prompt windows; context
    (T) and positions (P); batch_sizes; chunk (C); variations: one `VariationResult` each, in the
    order of the module docstring; holds: every variation holds; seconds: wall time, the fresh
    process included."""

    SCHEMA = SCHEMA
    JSON_SORT_KEYS = True
    REMEDY = "re-run `alibi variations`"
    FILE = RESULT_FILE

    kernel: str | None
    execution: dict[str, Any]
    device: str
    windows: tuple[int, ...]
    context: int
    positions: int
    batch_sizes: tuple[int, ...]
    chunk: int
    variations: tuple[VariationResult, ...]
    holds: bool
    seconds: float
    schema: str = SCHEMA


@dataclass
class Execution:
    """What one execution leaves: the digest of each scored logit row by (prompt, position), and its trace."""

    name: str
    logits: dict[tuple[int, int], int] = field(default_factory=dict)
    trace: ModuleTrace | None = None


def _record_logits(ex: Execution, logits: torch.Tensor, prompts: list[int], first: int, context: int) -> None:
    """logits [B, S, V] for positions first … first+S−1 of `prompts`; keep rows at positions ≥ context."""
    digests = row_digests(logits).tolist()
    for row, prompt in enumerate(prompts):
        for s, d in enumerate(digests[row]):
            if first + s >= context:
                ex.logits[(prompt, first + s)] = d


def run_execution(lm, ids: torch.Tensor, windows: tuple[int, ...], kind: str, context: int, batch: int = 1,
                  chunk: int = DEFAULT_CHUNK) -> Execution:
    """One execution (module docstring) of `kind` in prefill | decode | decode-reversed | chunked | recompute
    over the token ids [N, T+P] of `windows`, traced."""
    fed = ids.shape[1]
    ex = Execution(kind)
    order = list(windows)[::-1] if kind == "decode-reversed" else list(windows)
    step = batch if kind in ("decode", "decode-reversed") else 1
    with ModuleTrace(lm, last_token_only=kind == "recompute") as trace:
        for start in range(0, len(order), step):
            group = order[start:start + step]
            rows = ids[[windows.index(w) for w in group]]
            trace.prompts = group
            if kind == "prefill":
                _record_logits(ex, lm.logits(rows), group, 0, context)
            elif kind in ("decode", "decode-reversed"):
                _record_logits(ex, lm.chunked_logits(rows, [context] + [1] * (fed - context)), group, 0, context)
            elif kind == "chunked":
                sizes = [chunk] * (fed // chunk) + ([fed % chunk] if fed % chunk else [])
                _record_logits(ex, lm.chunked_logits(rows, sizes), group, 0, context)
            elif kind == "recompute":
                for t in range(context, fed):
                    _record_logits(ex, lm.logits(rows[:, :t + 1])[:, -1:], group, t, context)
            else:
                raise ValueError(f"unknown execution {kind!r}")
    ex.trace = trace
    return ex


# --- an execution in a fresh process (cold restart) ---------------------------------------------


def save_execution(ex: Execution, path: Path) -> None:
    """Write an execution's logit digests and trace (plain lists and tensors: `torch.load(weights_only=True)`)."""
    t = ex.trace
    doc = {"name": ex.name, "logits": [[p, q, d] for (p, q), d in sorted(ex.logits.items())],
           "order": list(t.order), "kinds": [t.kinds[n] for n in t.order],
           "calls": [[c.index, c.past, c.tokens, list(c.prompts)] for c in t.calls],
           "digests": {n: [[i, d] for i, d in t.digests[n]] for n in t.order}}
    buffer = io.BytesIO()
    torch.save(doc, buffer)
    atomic.write_bytes(path, buffer.getvalue())  # whole or absent; a full disk is one line naming `path`


def load_execution(path: Path, lm=None,
                   fix: str = "write it again (`alibi replay greedy --trace` or `alibi variations`)") -> Execution:
    """An execution saved by `save_execution`; anything else (a pickle of other objects, a missing key, a
    value of another shape) is one line naming the file and `fix` (`alibi.model.trace.read_trace_file`)."""
    doc = read_trace_file(path, fix)
    trace = ModuleTrace(lm)
    trace.order = list(doc["order"])
    trace.kinds = dict(zip(doc["order"], doc["kinds"]))
    trace.calls = [Call(int(i), int(p), int(n), tuple(pr)) for i, p, n, pr in doc["calls"]]
    trace.digests = {n: [(int(i), d) for i, d in doc["digests"][n]] for n in trace.order}
    logits = {(int(p), int(q)): int(d) for p, q, d in doc["logits"]}
    return Execution(doc["name"], logits, trace)


# --- comparing ----------------------------------------------------------------------------------


def compare(name: str, description: str, a: Execution, b: Execution) -> VariationResult:
    """The variation `name` between executions a and b: scored logit rows both hold, bit for bit,
    and the first diverging module of their traces."""
    keys = sorted(set(a.logits) & set(b.logits))
    if not keys:
        raise ValueError(f"{name}: executions {a.name} and {b.name} share no scored position")
    identical = sum(a.logits[k] == b.logits[k] for k in keys)
    div: Divergence | None = first_divergence(a.trace, b.trace)
    if div is None and identical < len(keys):
        raise RuntimeError(f"{name}: logits differ but no traced module does; a module escaped the trace")
    return VariationResult(name=name, description=description, execution_a=a.name, execution_b=b.name,
                           positions_compared=len(keys), positions_identical=identical,
                           first_divergence=None if div is None else asdict(div),
                           kernel_variant=None if div is None else div.kind == "w8a8-linear",
                           holds=identical == len(keys) and div is None)


def certify_variations(lm, ids: torch.Tensor, windows: tuple[int, ...], context: int,
                       batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES, chunk: int = DEFAULT_CHUNK,
                       restarted: Execution | None = None, progress: Progress | None = None) -> list[VariationResult]:
    """Every variation of the module docstring over the token ids [N, T+P] of `windows` (in this
    process); `restarted`: decode@Bmax from a fresh process (the cold-restart variation is left
    out when None)."""
    bmax = max((1, *batch_sizes))
    runs: dict[str, Execution] = {}
    plan = [("prefill", "prefill", 1), ("decode@1", "decode", 1),
            *[(f"decode@{b}", "decode", b) for b in batch_sizes if b > 1],
            (f"decode@{bmax}~", "decode-reversed", bmax), (f"chunked@{chunk}", "chunked", 1),
            ("recompute", "recompute", 1)]
    for i, (label, kind, batch) in enumerate(plan):
        runs[label] = run_execution(lm, ids, windows, kind, context, batch=batch, chunk=chunk)
        runs[label].name = label
        if progress:
            progress(i + 1, len(plan), f"execution {label}")
    out = []
    if restarted is not None:
        restarted.name = f"decode@{bmax} (fresh process)"
        out.append(compare("cold-restart", "the same execution in a fresh process", runs[f"decode@{bmax}"], restarted))
    for b in batch_sizes:
        if b > 1:
            out.append(compare(f"batch-size-{b}", f"each prompt alone versus in batches of {b}", runs["decode@1"],
                               runs[f"decode@{b}"]))
    out.append(compare("batch-composition", f"batches of {bmax} in reverse prompt order (other neighbours and rows)",
                       runs[f"decode@{bmax}"], runs[f"decode@{bmax}~"]))
    out.append(compare("chunked-prefill", f"one prefill versus chunks of {chunk} tokens with the KV cache",
                       runs["prefill"], runs[f"chunked@{chunk}"]))
    out.append(compare("prefill-vs-decode", "one prefill versus a prefill of T tokens and single-token decode steps",
                       runs["prefill"], runs["decode@1"]))
    out.append(compare("kv-cache-vs-recompute", "decode steps against the KV cache versus recomputing every "
                       "position without a cache", runs["decode@1"], runs["recompute"]))
    return out


# --- the command ----------------------------------------------------------------------------------


def _child_argv(model_dir: Path, prompts_dir: Path, kernel: str | None, windows: int, context: int, positions: int,
                batch: int, device: str | None, deterministic: bool, path: Path) -> list[str]:
    argv = ["variations", "--model", str(model_dir), "--prompts", str(prompts_dir), "--windows", str(windows),
            "--context", str(context), "--positions", str(positions), "--execution", f"decode@{batch}",
            "--execution-out", str(path), "--quiet"]
    if kernel is not None:
        argv += ["--kernel", kernel]
    if device is not None:
        argv += ["--device", device]
    if not deterministic:
        argv.append("--nondeterministic")
    return alibi_command(*argv)


def resolve_request(prompts, windows: int | None, context: int | None, positions: int | None,
                    batch_sizes: tuple[int, ...], chunk: int, where):
    span = resolve_span(prompts, windows, context, positions, where)
    if any(b < 2 for b in batch_sizes):
        raise InputError(f"--batch-sizes {','.join(map(str, batch_sizes))}: every size must be at least 2 "
                         "(batch 1 is the reference)")
    if max(batch_sizes, default=1) > len(span.windows):
        raise InputError(f"--batch-sizes: a batch of {max(batch_sizes)} needs at least that many windows, "
                         f"--windows gives {len(span.windows)}")
    if not 1 <= chunk < span.fed:
        raise InputError(f"--chunk {chunk}: must be in 1..{span.fed - 1} (a chunk shorter than the {span.fed} "
                         "fed tokens)")
    return span


def run_variations(model_dir: str | os.PathLike, prompts_dir: str | os.PathLike, out: str | os.PathLike, *,
                   kernel: str | None, windows: int | None = None, context: int | None = None,
                   positions: int | None = None, batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES,
                   chunk: int = DEFAULT_CHUNK, device: str | None = None, deterministic: bool = True,
                   restart: bool = True, overwrite: bool = False, progress: Progress | None = None,
                   pages: Callable[[Path], object] | None = None) -> VariationsReport:
    """Every variation into the folder `out` (variations.json, report.md, manifest.json).

    pages: called with the staged folder once variations.json and report.md are in it, before the manifest
    is written, so what it adds is covered too (`alibi variations` passes the HTML renderer: report.html)."""
    model_dir, prompts_dir = Path(model_dir).resolve(), Path(prompts_dir).resolve()
    prompts = load_prompts(prompts_dir)
    batch_sizes = tuple(sorted(set(batch_sizes)))
    span = resolve_request(prompts, windows, context, positions, batch_sizes, chunk, prompts_dir)
    check_output(out, {"--model": model_dir, "--prompts": prompts_dir}, overwrite)
    inputs = open_inputs(model_dir, prompts)
    start = time.perf_counter()
    restarted = None
    if restart:
        with tempfile.TemporaryDirectory(prefix="alibi-variations-") as tmp:
            path = Path(tmp) / "execution.pt"
            argv = _child_argv(model_dir, prompts_dir, kernel, len(span.windows), span.context, span.positions,
                               max(batch_sizes, default=1), device, deterministic, path)
            if progress:
                progress.note(f"variations: decode@{max(batch_sizes, default=1)} in a fresh process (cold restart)")
            code = run_child(argv, "the cold-restart execution")
            if code:
                raise InputError(f"the cold-restart execution failed (exit {code}, its message is above); "
                                 "fix that, or pass --no-restart to leave that variation out")
            restarted = load_execution(path)
    lm = load_model(model_dir, kernel, device, deterministic=deterministic)
    ids = prompts.input_ids[list(span.windows), : span.fed]
    if progress:
        progress.note(f"variations: {lm.kernel.name if lm.kernel else 'dense'} on {lm.device} ({lm.execution.label}), "
                      f"{len(span.windows)} windows, T={span.context}, P={span.positions}")
    results = certify_variations(lm, ids, span.windows, span.context, batch_sizes, chunk, restarted, progress)
    report = VariationsReport(kernel=lm.kernel.name if lm.kernel else None, execution=lm.execution.as_dict(),
                              device=lm.device.type, windows=span.windows, context=span.context,
                              positions=span.positions, batch_sizes=batch_sizes, chunk=chunk,
                              variations=tuple(results), holds=all(v.holds for v in results),
                              seconds=round(time.perf_counter() - start, 3))
    label = lm.kernel.name if lm.kernel is not None else "dense"
    with atomic.staged_dir(out) as stage:
        atomic.write_text(Path(stage) / RESULT_FILE, report.to_json())
        atomic.write_text(Path(stage) / REPORT_FILE, report_markdown(report))
        if pages is not None:
            pages(Path(stage))
        write_manifest(stage, "replay", replay_predicate(inputs, lm, label, {
            "replay": "variations", **span.as_dict(), "batch_sizes": list(batch_sizes), "chunk": chunk,
            "cold_restart": restart}))
    return report


def run_child_execution(model_dir, prompts_dir, path: str | os.PathLike, *, kernel: str | None, execution: str,
                        windows: int | None, context: int | None, positions: int | None, device: str | None,
                        deterministic: bool) -> Execution:
    """The cold-restart side: one `decode@B` execution in this (fresh) process, saved to `path`."""
    if not execution.startswith("decode@") or not execution[7:].isdigit() or int(execution[7:]) < 1:
        raise InputError(f"--execution {execution!r}: only decode@B (B ≥ 1) runs on its own")
    atomic.check_writable_file(path, "--execution-out")  # before the model loads, not after it ran
    prompts = load_prompts(prompts_dir)
    span = resolve_request(prompts, windows, context, positions, (), 1, prompts_dir)
    lm = load_model(model_dir, kernel, device, deterministic=deterministic)
    ids = prompts.input_ids[list(span.windows), : span.fed]
    ex = run_execution(lm, ids, span.windows, "decode", span.context, batch=int(execution[7:]))
    save_execution(ex, Path(path))
    return ex


def _where(d: dict[str, Any] | None) -> str:
    if d is None:
        return "—"
    return f"prompt {d['prompt']}, position {d['position']}: `{d['module']}` ({d['kind']})"


def report_markdown(r: VariationsReport) -> str:
    """report.md: the verdict, then one row per variation."""
    verdict = "every variation holds" if r.holds else "some variations FAIL"
    mode = r.execution
    lines = [f"# Execution variations: {r.kernel or 'dense model'} on {r.device}", "",
             f"**{verdict}.** {len(r.windows)} prompts, logits of positions {r.context}…{r.context + r.positions - 1} "
             f"compared bit for bit; runner mode `{'deterministic' if mode.get('deterministic') else 'native'}` "
             f"(attention `{mode.get('attention')}`, norms `{mode.get('norms')}`, dense Linears "
             f"`{mode.get('dense_linears')}`, torch deterministic algorithms {mode.get('deterministic_algorithms')}).",
             "", "| variation | executions | identical rows | first diverging module | kernel not M-invariant |",
             "|---|---|---|---|---|"]
    for v in r.variations:
        kernel = "—" if v.kernel_variant is None else ("yes" if v.kernel_variant else "no")
        lines.append(f"| {v.name} | {v.execution_a} vs {v.execution_b} | {v.positions_identical}/{v.positions_compared} "
                     f"| {_where(v.first_divergence)} | {kernel} |")
    lines += ["", "A variation holds when every compared logit row is bitwise identical and no traced module's "
              "output differs. The first diverging module is the first in execution order at the earliest "
              "position where the two executions' traces differ; a W8A8 Linear there means the kernel's output "
              "depends on M (the batch or chunk), anything else is the runner's own arithmetic.", ""]
    return "\n".join(lines)


def summary_lines(r: VariationsReport) -> list[str]:
    lines = [f"variations: {r.kernel or 'dense'} on {r.device}, mode {'deterministic' if r.execution.get('deterministic') else 'native'}: "
             f"{sum(v.holds for v in r.variations)}/{len(r.variations)} hold"]
    for v in r.variations:
        tail = "" if v.holds else f"; first diverging: {_where(v.first_divergence)}"
        lines.append(f"  {v.name:<24} {'holds' if v.holds else 'FAILS'} ({v.positions_identical}/{v.positions_compared} "
                     f"rows identical){tail}")
    return lines


__all__ = ["Execution", "VariationResult", "VariationsReport", "certify_variations", "compare", "run_execution",
           "run_variations", "summary_lines"]
