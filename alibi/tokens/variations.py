"""Execution variations: does a token get the same logits however the runner schedules it?

The specification (as vLLM and SGLang state their deterministic modes): under a fixed model,
kernel and configuration, the same prompt gives bitwise-identical logits at corresponding
positions across executions that vary batch size, batch composition, prompt chunking, prefill
versus decode, KV-cache reuse, repetition and restarts. `certify_variations` runs one model and
kernel through pairs of executions that differ in exactly one of these, compares the fp32 logit
rows of positions T … T+P−1 bit for bit, every row of a batch against the same prompt in the
other execution, and, for a pair that differs, names the first diverging module from the two
runs' traces (`alibi.model.trace.first_divergence_paired`) and whether it is a W8A8 Linear — a
kernel that is not M-invariant — or the runner's own arithmetic.

Executions (each over the first T+P tokens of N prompt windows, teacher-forced, every row traced):

    prefill          each prompt alone, one forward of T+P tokens, no cache
    decode@B         a prefill of T tokens, then P single-token steps with the cache, B rows a forward:
                     for B < N the prompts in consecutive groups of B; for B ≥ N one batch of B rows
                     (`batch_rows`): the first prompt at the "needle" rows 0, B−1 and (B−1)//2 (as
                     many as leave a row for every other prompt) and the other prompts in order in the
                     rest, repeated as needed
    decode@B~        decode@B with its rows reversed (groups: the prompts in reverse order)
    decode@B #k      decode@B again in the same process (the k-th run)
    chunked@C        each prompt alone, fed in chunks of C tokens with the cache
    recompute        each prompt alone, position t computed by a fresh prefill of tokens 0 … t
    decode@B, fresh  decode@B in a new process (a cold restart: model loaded and kernels built anew)

Variations (pairs; Bmax the largest batch, R the repeats):

    cold-restart         decode@Bmax   vs decode@Bmax in a fresh process
    repeat               decode@Bmax   vs decode@Bmax #2 … #R (left out when R = 1)
    batch-size-B         decode@1      vs decode@B, for each B > 1
    batch-composition    decode@Bmax   vs decode@Bmax~
    chunked-prefill      prefill       vs chunked@C
    prefill-vs-decode    prefill       vs decode@1
    kv-cache-vs-recompute  decode@1    vs recompute

The default sizes (`default_batch_sizes`, `DEFAULT_REPEATS`): batches of 2, 4 and N+2 rows — every
prompt once and the first prompt again at the middle and last rows — and on CUDA at least 64 rows;
decode@Bmax three times in one process and once more in a fresh one. Why: on the H200 the native
runner's decode attention (cuDNN) made two runs of a batch of 64 differ and prompt 0 alone differ
from row 0 of 64, while batches of 2, 4 and 8 held on restart, size and composition
(`analysis/results/h200/determinism/b5db8e0/variations/variations-native`). A defect that shows
only in a large batch, at some rows, or in some runs is caught only by a large batch holding one
prompt at several rows, run more than once.
"""

from __future__ import annotations

import io
import itertools
import os
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from alibi.errors import InputError
from alibi.governance.manifest import write_manifest
from alibi.io import atomic
from alibi.io.limits import check_count
from alibi.io.progress import Progress
from alibi.io.typed import TypedResult
from alibi.kernels.registry import get_kernel
from alibi.model.runner import load_model, model_device
from alibi.model.trace import Call, ModuleTrace, first_divergence_paired, read_trace_file, row_digests
from alibi.tokens.setup import check_output, load_prompts, open_inputs, replay_predicate, resolve_span
from alibi.tokens.teacher_forced import alibi_command, run_child

SCHEMA = "alibi-variations/v2"
SCHEMA_V1 = "alibi-variations/v1"  # without sizes per variation, needle rows, repeats (still read)
RESULT_FILE = "variations.json"
REPORT_FILE = "report.md"
SMALL_BATCHES = (2, 4)
NEEDLE_EXTRA = 2  # rows beyond one per prompt: the first prompt again at the middle and last rows
CUDA_LARGE_BATCH = 64  # where the native runner's decode attention was seen to diverge on the H200
DEFAULT_REPEATS = 3
DEFAULT_CHUNK = 16
MAX_BATCH = 4096  # rows of one forward; a larger request is refused before any work
MAX_REPEATS = 100


def default_batch_sizes(windows: int, device_type: str) -> tuple[int, ...]:
    """2, 4 and the large batch: `windows` + 2 rows (every prompt once, the first again at the middle
    and last rows), at least `CUDA_LARGE_BATCH` rows on CUDA."""
    large = windows + NEEDLE_EXTRA
    if device_type == "cuda":
        large = max(large, CUDA_LARGE_BATCH)
    return tuple(sorted({*SMALL_BATCHES, large}))


def batch_rows(n: int, batch: int) -> tuple[int, ...] | None:
    """The prompt (0 … n−1) of each row of one batch of `batch` rows over n prompts; None when
    batch < n (the prompts then run in consecutive groups of `batch`).

    Prompt 0 takes the needle rows 0, batch−1 and (batch−1)//2, in that order as many as leave a row
    for every other prompt; the other rows hold prompts 1 … n−1 in order, repeated as needed. So
    batch = n is the n prompts in order, and batch ≥ n+2 puts prompt 0 at the first, middle and
    last rows."""
    if batch < n:
        return None
    needles = set(list(dict.fromkeys((0, batch - 1, (batch - 1) // 2)))[: batch - n + 1])
    others = itertools.cycle(range(1, n)) if n > 1 else itertools.repeat(0)
    return tuple(0 if r in needles else next(others) for r in range(batch))


def batch_windows(windows: Sequence[int], batch: int) -> tuple[int, ...] | None:
    """The window of each row of one batch of `batch` rows over `windows` (`batch_rows`); None for groups."""
    layout = batch_rows(len(windows), batch)
    return None if layout is None else tuple(windows[i] for i in layout)


def _needles(rows: Sequence[int]) -> tuple[int, ...]:
    """The rows of one batch (each row's window) that hold its first row's window; empty for no rows."""
    return tuple(r for r, w in enumerate(rows) if w == rows[0])


@dataclass(frozen=True)
class VariationResult:
    """One variation: two executions that differ in one respect.

    name, description; execution_a, execution_b: which executions were compared (execution_b lists
    the repeats of a `repeat`); batch_a, batch_b: rows per forward of each; runs: executions compared
    with a (R−1 for `repeat`, else 1); needle_rows: the rows of execution b's single batch holding its
    first prompt (empty for groups or one prompt a forward); certifies: what a pass certifies, sizes
    included; positions_compared: (row, position) pairs of positions T … T+P−1 compared, every row of
    a batch against the same prompt in a, over all runs; positions_identical: of those, pairs whose
    fp32 logits are bitwise equal; first_divergence: the first (prompt, position, module) whose output
    differs between the two traces (None when none does; it may lie in the context positions), with
    its kind, each execution's forward call and the row in that call's batch (`row_a`, `row_b`);
    kernel_variant: the first diverging module is a W8A8 Linear, i.e. the kernel is not M-invariant
    (None when nothing diverged); holds: every compared row identical and no traced module differs."""

    name: str
    description: str
    execution_a: str
    execution_b: str
    batch_a: int
    batch_b: int
    runs: int
    needle_rows: tuple[int, ...]
    certifies: str
    positions_compared: int
    positions_identical: int
    first_divergence: dict[str, Any] | None
    kernel_variant: bool | None
    holds: bool


@dataclass(frozen=True)
class VariationsReport(TypedResult):
    """`alibi variations` (schema `alibi-variations/v2`; reads v1).

    kernel: the W8A8 Linears' kernel (None for a dense model); execution: the runner's mode
    (`alibi.model.execution.ExecutionMode.as_dict`); device; windows: the prompt windows; context
    (T) and positions (P); batch_sizes; chunk (C); large_batch: Bmax; batch_rows: the window of each
    row of decode@Bmax when it is one batch (empty when Bmax < N: groups); needle_rows: the rows of
    that batch holding the first window; repeats: runs of decode@Bmax in this process (R);
    restart_batch: the batch of the cold-restart execution (None when left out); variations: one
    `VariationResult` each, in the order of the module docstring; holds: every variation holds;
    seconds: wall time, the fresh process included."""

    SCHEMA = SCHEMA
    READS = (SCHEMA_V1,)
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
    large_batch: int
    batch_rows: tuple[int, ...]
    needle_rows: tuple[int, ...]
    repeats: int
    restart_batch: int | None
    variations: tuple[VariationResult, ...]
    holds: bool
    seconds: float
    schema: str = SCHEMA

    @property
    def certifies(self) -> str:
        """What a pass of the whole run certifies, sizes included (`protocol_text`)."""
        return protocol_text(self)

    @classmethod
    def _layout_in(cls, doc: dict[str, Any], where: str) -> dict[str, Any]:
        """A v1 document upgraded: its batches were groups of B prompts (B ≤ N, no needle rows), one run
        of each execution; each variation's batches are read from its executions' names."""
        if doc.get("schema") != SCHEMA_V1:
            return doc
        sizes = doc.get("batch_sizes")
        large = max(sizes) if isinstance(sizes, list) and sizes and all(type(b) is int for b in sizes) else 1
        variations = doc.get("variations")
        if isinstance(variations, list):
            doc["variations"] = [v if not isinstance(v, dict) else
                                 {"batch_a": _v1_batch(v.get("execution_a")),
                                  "batch_b": _v1_batch(v.get("execution_b")), "runs": 1, "needle_rows": [],
                                  "certifies": v.get("description"), **v}
                                 for v in variations]
            restarted = any(isinstance(v, dict) and v.get("name") == "cold-restart" for v in variations)
        else:
            restarted = False
        return {"large_batch": large, "batch_rows": [], "needle_rows": [], "repeats": 1,
                "restart_batch": large if restarted else None, **doc}


def _v1_batch(name: Any) -> int:
    """Rows per forward of a v1 execution, from its name (decode@B, decode@B~, decode@B (fresh process))."""
    found = re.match(r"decode@(\d+)", name) if isinstance(name, str) else None
    return int(found.group(1)) if found else 1


@dataclass
class Execution:
    """What one execution leaves: the digest of each scored logit row by (row label, position), and its
    trace. A row is labelled by its prompt's window, except in one batch that holds prompts at several
    rows (`batch_rows`): there the label is the row, and `rows` gives each row's window. batch: rows a
    forward."""

    name: str
    logits: dict[tuple[int, int], int] = field(default_factory=dict)
    trace: ModuleTrace | None = None
    rows: tuple[int, ...] | None = None
    batch: int = 1

    def window(self, label: int) -> int:
        return label if self.rows is None else self.rows[label]

    @property
    def needle_rows(self) -> tuple[int, ...]:
        """Rows of this execution's single batch holding its first row's window (empty for groups)."""
        return () if self.rows is None else _needles(self.rows)


def _record_logits(ex: Execution, logits: torch.Tensor, labels: Sequence[int], first: int, context: int) -> None:
    """logits [B, S, V] for positions first … first+S−1 of the rows `labels`; keep rows at positions ≥ context."""
    digests = row_digests(logits).tolist()
    for row, label in enumerate(labels):
        for s, d in enumerate(digests[row]):
            if first + s >= context:
                ex.logits[(label, first + s)] = d


KINDS = ("prefill", "decode", "decode-reversed", "chunked", "recompute")


def run_execution(lm, ids: torch.Tensor, windows: tuple[int, ...], kind: str, context: int, batch: int = 1,
                  chunk: int = DEFAULT_CHUNK) -> Execution:
    """One execution (module docstring) of `kind` in `KINDS` over the token ids [N, T+P] of `windows`, traced."""
    if kind not in KINDS:
        raise ValueError(f"unknown execution {kind!r}")
    fed = ids.shape[1]
    decode = kind in ("decode", "decode-reversed")
    rows = batch_windows(windows, batch) if decode else None
    if rows is not None:
        rows = rows[:: -1 if kind == "decode-reversed" else 1]
        groups = [(tuple(range(batch)), rows)]
    else:
        order = tuple(windows)[::-1] if kind == "decode-reversed" else tuple(windows)
        step = batch if decode else 1
        groups = [(order[i:i + step], order[i:i + step]) for i in range(0, len(order), step)]
    ex = Execution(kind, rows=rows, batch=batch if decode else 1)
    with ModuleTrace(lm, last_token_only=kind == "recompute") as trace:
        for labels, group in groups:
            x = ids[[windows.index(w) for w in group]]
            trace.prompts = labels
            if kind == "prefill":
                _record_logits(ex, lm.logits(x), labels, 0, context)
            elif decode:
                _record_logits(ex, lm.chunked_logits(x, [context] + [1] * (fed - context)), labels, 0, context)
            elif kind == "chunked":
                sizes = [chunk] * (fed // chunk) + ([fed % chunk] if fed % chunk else [])
                _record_logits(ex, lm.chunked_logits(x, sizes), labels, 0, context)
            else:  # recompute
                for t in range(context, fed):
                    _record_logits(ex, lm.logits(x[:, :t + 1])[:, -1:], labels, t, context)
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


def _row_pairs(a: Execution, b: Execution) -> list[tuple[int, int]]:
    """(label in a, label in b) of the rows compared: rows holding the same window. A window at one row
    of one execution pairs with each of its rows in the other (a prompt alone against every row of a
    batch that holds it); a window at several rows of both pairs them in row order."""
    def by_window(ex: Execution) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for label in sorted({label for label, _ in ex.logits}):
            out.setdefault(ex.window(label), []).append(label)
        return out

    in_a, in_b = by_window(a), by_window(b)
    pairs: list[tuple[int, int]] = []
    for w in sorted(in_a.keys() & in_b.keys()):
        xs, ys = in_a[w], in_b[w]
        pairs += [(x, y) for x in xs for y in ys] if len(xs) == 1 or len(ys) == 1 else list(zip(xs, ys))
    return pairs


def _row_of(ex: Execution, call: int, label: int) -> int:
    return -1 if call < 0 else ex.trace.calls[call].prompts.index(label)


def _measure(name: str, a: Execution, b: Execution) -> tuple[int, int, dict[str, Any] | None]:
    """(row positions compared, of those bitwise identical, first divergence) of execution b against a."""
    pairs = _row_pairs(a, b)
    scored: dict[int, list[int]] = {}
    for label, p in a.logits:
        scored.setdefault(label, []).append(p)
    keys = [((la, p), (lb, p)) for la, lb in pairs for p in scored[la] if (lb, p) in b.logits]
    if not keys:
        raise ValueError(f"{name}: executions {a.name} and {b.name} share no scored position")
    identical = sum(a.logits[ka] == b.logits[kb] for ka, kb in keys)
    found = first_divergence_paired(a.trace, b.trace, pairs)
    if found is None:
        if identical < len(keys):
            raise RuntimeError(f"{name}: logits differ but no traced module does; a module escaped the trace")
        return len(keys), identical, None
    div, label_b = found
    return len(keys), identical, {**asdict(div), "prompt": a.window(div.prompt),
                                  "row_a": _row_of(a, div.call_a, div.prompt),
                                  "row_b": _row_of(b, div.call_b, label_b)}


def compare(name: str, description: str, a: Execution, *runs: Execution,
            certifies: str | None = None) -> VariationResult:
    """The variation `name` between execution a and each of `runs` (one execution, or the repeats of
    a): every scored logit row both hold, each row against the same prompt in a (`_row_pairs`), bit for
    bit, and the first diverging module of the traces (of the first run that has one)."""
    compared = identical = 0
    first = None
    for b in runs:
        n, same, div = _measure(name, a, b)
        compared, identical, first = compared + n, identical + same, first or div
    return VariationResult(name=name, description=description, execution_a=a.name,
                           execution_b=", ".join(b.name for b in runs), batch_a=a.batch,
                           batch_b=max(b.batch for b in runs), runs=len(runs), needle_rows=runs[0].needle_rows,
                           certifies=certifies or description, positions_compared=compared,
                           positions_identical=identical, first_divergence=first,
                           kernel_variant=None if first is None else first["kind"] == "w8a8-linear",
                           holds=identical == compared and first is None)


def _prompts_text(windows: Sequence[int]) -> str:
    w = sorted(set(windows))
    if len(w) == 1:
        return f"prompt {w[0]}"
    return f"prompts {w[0]}–{w[-1]}" if w == list(range(w[0], w[-1] + 1)) else "prompts " + ", ".join(map(str, w))


def rows_text(rows: Sequence[int]) -> str:
    """One batch's rows in words: its first prompt's (needle) rows, and what fills the rest."""
    needles = _needles(rows)
    text = f"one batch of {len(rows)} rows with prompt {rows[0]} at row{'s' if len(needles) > 1 else ''} " + \
        ", ".join(map(str, needles))
    others = [w for w in rows if w != rows[0]]
    if others:
        repeated = " (repeated)" if len(others) > len(set(others)) else ""
        rest = "row" if len(others) == 1 else f"{len(others)} rows"
        text += f" and {_prompts_text(others)}{repeated} in the other {rest}"
    return text


def batch_text(ex: Execution) -> str:
    """How an execution places its prompts, in words: each prompt alone, groups, or one batch's rows."""
    if ex.batch == 1:
        return "each prompt alone"
    return f"batches of {ex.batch} consecutive prompts" if ex.rows is None else rows_text(ex.rows)


def certify_variations(lm, ids: torch.Tensor, windows: tuple[int, ...], context: int,
                       batch_sizes: tuple[int, ...] | None = None, chunk: int = DEFAULT_CHUNK,
                       restarted: Execution | None = None, progress: Progress | None = None,
                       repeats: int = DEFAULT_REPEATS) -> list[VariationResult]:
    """Every variation of the module docstring over the token ids [N, T+P] of `windows` (in this
    process); batch_sizes: default `default_batch_sizes` for the model's device; `restarted`:
    decode@Bmax from a fresh process (the cold-restart variation is left out when None); repeats: runs
    of decode@Bmax here (the repeat variation is left out when 1)."""
    if batch_sizes is None:
        batch_sizes = default_batch_sizes(len(windows), lm.device.type)
    bmax = max((1, *batch_sizes))
    fed = ids.shape[1]
    runs: dict[str, Execution] = {}
    plan = [("prefill", "prefill", 1), ("decode@1", "decode", 1),
            *[(f"decode@{b}", "decode", b) for b in batch_sizes if b > 1],
            *[(f"decode@{bmax} #{k}", "decode", bmax) for k in range(2, repeats + 1)],
            (f"decode@{bmax}~", "decode-reversed", bmax), (f"chunked@{chunk}", "chunked", 1),
            ("recompute", "recompute", 1)]
    for i, (label, kind, batch) in enumerate(plan):
        runs[label] = run_execution(lm, ids, windows, kind, context, batch=batch, chunk=chunk)
        runs[label].name = label
        if progress:
            progress(i + 1, len(plan), f"execution {label}")
    large = runs[f"decode@{bmax}"]
    where = batch_text(large)
    same = "get bitwise-identical logits"
    out = []
    if restarted is not None:
        restarted.name, restarted.rows, restarted.batch = f"decode@{bmax} (fresh process)", large.rows, large.batch
        out.append(compare("cold-restart", "the same execution in a fresh process", large, restarted,
                           certifies=f"decode in {where} and the same in a fresh process {same}"))
    if repeats > 1:
        again = [runs[f"decode@{bmax} #{k}"] for k in range(2, repeats + 1)]
        out.append(compare("repeat", f"the same execution {repeats} times in one process", large, *again,
                           certifies=f"decode in {where}, run {repeats} times in one process, {same} every time"))
    for b in batch_sizes:
        if b > 1:
            batched = runs[f"decode@{b}"]
            out.append(compare(f"batch-size-{b}", f"each prompt alone versus in batches of {b}", runs["decode@1"],
                               batched, certifies=f"each prompt alone and in {batch_text(batched)} {same} (every "
                               "row against its prompt alone)"))
    out.append(compare("batch-composition", f"batches of {bmax} in reverse row order (other neighbours and rows)",
                       large, runs[f"decode@{bmax}~"],
                       certifies=f"{where} and the same rows in reverse order (other neighbours, other rows) {same}"))
    out.append(compare("chunked-prefill", f"one prefill versus chunks of {chunk} tokens with the KV cache",
                       runs["prefill"], runs[f"chunked@{chunk}"],
                       certifies=f"one prefill of {fed} tokens and chunks of {chunk} against the KV cache {same}"))
    out.append(compare("prefill-vs-decode", "one prefill versus a prefill of T tokens and single-token decode steps",
                       runs["prefill"], runs["decode@1"],
                       certifies=f"one prefill of {fed} tokens and a prefill of {context} followed by {fed - context} "
                       f"single-token decode steps {same}"))
    out.append(compare("kv-cache-vs-recompute", "decode steps against the KV cache versus recomputing every "
                       "position without a cache", runs["decode@1"], runs["recompute"],
                       certifies=f"{fed - context} decode steps against the KV cache and each position recomputed by "
                       f"a fresh prefill {same}"))
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


def model_device_type(kernel: str | None, device: str | None) -> str:
    """The device type the model will run on (as `load_model` chooses it), known before it loads."""
    return model_device(None if kernel is None or device else get_kernel(kernel), device).type


def resolve_request(prompts, windows: int | None, context: int | None, positions: int | None,
                    batch_sizes: tuple[int, ...], chunk: int, where, repeats: int = 1):
    span = resolve_span(prompts, windows, context, positions, where)
    if any(b < 2 for b in batch_sizes):
        raise InputError(f"--batch-sizes {','.join(map(str, batch_sizes))}: every size must be at least 2 "
                         "(batch 1 is the reference)")
    check_count(max(batch_sizes, default=1), "--batch-sizes", MAX_BATCH, "rows a forward")
    if repeats < 1:
        raise InputError(f"--repeats {repeats}: must be at least 1 (1 leaves the repeat variation out)")
    check_count(repeats, "--repeats", MAX_REPEATS, "runs")
    if not 1 <= chunk < span.fed:
        raise InputError(f"--chunk {chunk}: must be in 1..{span.fed - 1} (a chunk shorter than the {span.fed} "
                         "fed tokens)")
    return span


def run_variations(model_dir: str | os.PathLike, prompts_dir: str | os.PathLike, out: str | os.PathLike, *,
                   kernel: str | None, windows: int | None = None, context: int | None = None,
                   positions: int | None = None, batch_sizes: tuple[int, ...] | None = None,
                   chunk: int = DEFAULT_CHUNK, repeats: int = DEFAULT_REPEATS, device: str | None = None,
                   deterministic: bool = True, restart: bool = True, overwrite: bool = False,
                   progress: Progress | None = None,
                   pages: Callable[[Path], object] | None = None) -> VariationsReport:
    """Every variation into the folder `out` (variations.json, report.md, manifest.json).

    batch_sizes: default `default_batch_sizes` for the windows and the model's device.
    pages: called with the staged folder once variations.json and report.md are in it, before the manifest
    is written, so what it adds is covered too (`alibi variations` passes the HTML renderer: report.html)."""
    model_dir, prompts_dir = Path(model_dir).resolve(), Path(prompts_dir).resolve()
    prompts = load_prompts(prompts_dir)
    if batch_sizes is None:
        n = len(resolve_span(prompts, windows, context, positions, prompts_dir).windows)
        batch_sizes = default_batch_sizes(n, model_device_type(kernel, device))
    batch_sizes = tuple(sorted(set(batch_sizes)))
    span = resolve_request(prompts, windows, context, positions, batch_sizes, chunk, prompts_dir, repeats)
    check_output(out, {"--model": model_dir, "--prompts": prompts_dir}, overwrite)
    inputs = open_inputs(model_dir, prompts)
    bmax = max(batch_sizes, default=1)
    start = time.perf_counter()
    restarted = None
    if restart:
        with tempfile.TemporaryDirectory(prefix="alibi-variations-") as tmp:
            path = Path(tmp) / "execution.pt"
            argv = _child_argv(model_dir, prompts_dir, kernel, len(span.windows), span.context, span.positions,
                               bmax, device, deterministic, path)
            if progress:
                progress.note(f"variations: decode@{bmax} in a fresh process (cold restart)")
            code = run_child(argv, "the cold-restart execution")
            if code:
                raise InputError(f"the cold-restart execution failed (exit {code}, its message is above); "
                                 "fix that, or pass --no-restart to leave that variation out")
            restarted = load_execution(path)
    lm = load_model(model_dir, kernel, device, deterministic=deterministic)
    ids = prompts.input_ids[list(span.windows), : span.fed]
    rows = batch_windows(span.windows, bmax) or ()
    if progress:
        progress.note(f"variations: {lm.kernel.name if lm.kernel else 'dense'} on {lm.device} ({lm.execution.label}), "
                      f"{len(span.windows)} windows, T={span.context}, P={span.positions}, batches "
                      f"{','.join(map(str, batch_sizes))}, {repeats} runs at {bmax}")
    results = certify_variations(lm, ids, span.windows, span.context, batch_sizes, chunk, restarted, progress,
                                 repeats)
    report = VariationsReport(kernel=lm.kernel.name if lm.kernel else None, execution=lm.execution.as_dict(),
                              device=lm.device.type, windows=span.windows, context=span.context,
                              positions=span.positions, batch_sizes=batch_sizes, chunk=chunk, large_batch=bmax,
                              batch_rows=rows, needle_rows=_needles(rows) if rows else (),
                              repeats=repeats, restart_batch=bmax if restart else None,
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
            "repeats": repeats, "cold_restart": restart}))
    return report


def run_child_execution(model_dir, prompts_dir, path: str | os.PathLike, *, kernel: str | None, execution: str,
                        windows: int | None, context: int | None, positions: int | None, device: str | None,
                        deterministic: bool) -> Execution:
    """The cold-restart side: one `decode@B` execution (the same rows as the parent's) in this (fresh)
    process, saved to `path`."""
    if not execution.startswith("decode@") or not execution[7:].isdigit() or int(execution[7:]) < 1:
        raise InputError(f"--execution {execution!r}: only decode@B (B ≥ 1) runs on its own")
    check_count(int(execution[7:]), "--execution decode@B", MAX_BATCH, "rows a forward")
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
    rows = f" (row {d['row_a']} vs row {d['row_b']})" if max(d.get("row_a", 0), d.get("row_b", 0)) > 0 else ""
    return f"prompt {d['prompt']}, position {d['position']}{rows}: `{d['module']}` ({d['kind']})"


def protocol_text(r: VariationsReport) -> str:
    """What a pass of the whole run certifies, sizes included, in one sentence."""
    sizes = ", ".join(map(str, r.batch_sizes)) or "none"
    text = (f"{len(r.windows)} prompts, logits of positions {r.context}…{r.context + r.positions - 1} bitwise "
            f"identical: batch 1 against batches of {sizes}")
    if r.batch_rows:
        text += f"; at batch {r.large_batch}: {rows_text(r.batch_rows)}"
    else:
        text += f" (batch {r.large_batch}: the prompts in groups of {r.large_batch}, no needle rows)"
    text += f"; {r.repeats} repeated decodes at batch {r.large_batch} in one process" if r.repeats > 1 else \
        "; no repeated decode"
    text += "; no cold restart" if r.restart_batch is None else f"; cold restart at batch {r.restart_batch}"
    return text + f"; chunks of {r.chunk}; prefill vs decode; KV cache vs recompute"


def report_markdown(r: VariationsReport) -> str:
    """report.md: the verdict, what a pass certifies, then one row per variation."""
    verdict = "every variation holds" if r.holds else "some variations FAIL"
    mode = r.execution
    lines = [f"# Execution variations: {r.kernel or 'dense model'} on {r.device}", "",
             f"**{verdict}.** {len(r.windows)} prompts, logits of positions {r.context}…{r.context + r.positions - 1} "
             f"compared bit for bit; runner mode `{'deterministic' if mode.get('deterministic') else 'native'}` "
             f"(attention `{mode.get('attention')}`, norms `{mode.get('norms')}`, dense Linears "
             f"`{mode.get('dense_linears')}`, torch deterministic algorithms {mode.get('deterministic_algorithms')}).",
             "", f"A pass certifies: {r.certifies}.", "",
             "| variation | executions | a pass certifies | identical rows | first diverging module "
             "| kernel not M-invariant |",
             "|---|---|---|---|---|---|"]
    for v in r.variations:
        kernel = "—" if v.kernel_variant is None else ("yes" if v.kernel_variant else "no")
        lines.append(f"| {v.name} | {v.execution_a} vs {v.execution_b} | {v.certifies} | "
                     f"{v.positions_identical}/{v.positions_compared} | {_where(v.first_divergence)} | {kernel} |")
    lines += ["", "A variation holds when every compared logit row is bitwise identical and no traced module's "
              "output differs; every row of a batch is compared with the same prompt in the other execution. The "
              "first diverging module is the first in execution order at the earliest position where the two "
              "executions' traces differ; a W8A8 Linear there means the kernel's output depends on M (the batch or "
              "chunk), anything else is the runner's own arithmetic.", ""]
    return "\n".join(lines)


def summary_lines(r: VariationsReport) -> list[str]:
    lines = [f"variations: {r.kernel or 'dense'} on {r.device}, mode {'deterministic' if r.execution.get('deterministic') else 'native'}: "
             f"{sum(v.holds for v in r.variations)}/{len(r.variations)} hold",
             f"  a pass certifies: {r.certifies}"]
    for v in r.variations:
        tail = "" if v.holds else f"; first diverging: {_where(v.first_divergence)}"
        lines.append(f"  {v.name:<24} {'holds' if v.holds else 'FAILS'} ({v.positions_identical}/{v.positions_compared} "
                     f"rows identical; {v.certifies}){tail}")
    return lines


__all__ = ["DEFAULT_REPEATS", "Execution", "VariationResult", "VariationsReport", "batch_rows", "batch_text",
           "batch_windows", "certify_variations", "compare", "default_batch_sizes", "protocol_text", "rows_text",
           "run_execution", "run_variations", "summary_lines"]
