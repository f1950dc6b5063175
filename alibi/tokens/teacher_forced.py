"""Teacher-forced replay of one arm: what the model predicts at each scored position of pinned text.

Per window of the prompt set, one prefill pass (`LoadedModel.logits`, no KV cache) over tokens
0 … T+P−1. The logit row at index p−1 has seen tokens 0 … p−1 of the pinned text and predicts
token p, so positions p = T … T+P−1 are scored from rows T−1 … T+P−2 — always on the text,
never on the model's own output (teacher forcing). Per scored position, from the fp32 logits
(`score_rows`):

- forced token: the text's token at p, and its log-probability;
- top-1: `argmax` (the first maximal index on ties), its log-probability;
- top-2: the largest logit once the top-1 index is removed (equal to the top-1 logit on a tie);
- margin: top-1 logit − top-2 logit in fp32 (0 on a tie; ≥ 0 always);
- `logits_sha256`: sha256 of the row's fp32 little-endian bytes, so two arms' logits can be
  compared bit for bit without storing them.

Log-probabilities are `torch.log_softmax` in fp32, stored as the float64 value of that fp32.

Throughput. The forward pass dominates; the scoring runs on the model's device, only the scored
rows travel to the host, and their digests are computed by a thread pool while the next window's
forward runs (sha256 releases the GIL on large buffers), so the replay costs little more than
the forward passes themselves (`analysis/bench_replay.py` measures the ratio).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

import alibi
from alibi.errors import InputError
from alibi.governance.manifest import write_manifest
from alibi.io import atomic
from alibi.io.digests import sha256_bytes
from alibi.io.progress import Progress
from alibi.model.runner import load_model
from alibi.tokens.flips import analyze_flips
from alibi.tokens.records import ArmRecords, TokenRecord, window_sha256, write_records
from alibi.tokens.setup import (
    Span,
    check_output,
    combined_predicate,
    load_prompts,
    locked_protocol,
    note_lines,
    open_inputs,
    recheck_protocol,
    replay_predicate,
    resolve_span,
)

HASH_CHUNK_ROWS = 32  # rows per hashing job: enough jobs to use the pool, few enough to keep overhead low


@dataclass(frozen=True)
class ScoredRows:
    """`score_rows` of P logit rows, each a tensor [P] on the rows' device."""

    forced_logprob: torch.Tensor
    top1_id: torch.Tensor
    top1_logprob: torch.Tensor
    top2_logprob: torch.Tensor
    margin: torch.Tensor


def score_rows(rows: torch.Tensor, forced: torch.Tensor) -> ScoredRows:
    """Score fp32 logit rows [P,V] against the forced token ids [P] (see the module docstring)."""
    if rows.dtype != torch.float32 or rows.dim() != 2:
        raise ValueError(f"score_rows takes fp32 logits [P,V], got {rows.dtype} {list(rows.shape)}")
    logp = torch.log_softmax(rows, dim=-1)
    top1 = rows.argmax(dim=-1, keepdim=True)  # the first maximal index (documented by torch)
    # The two largest *values* (equal on a tie). Which tied index topk returns is unspecified, but
    # log_softmax gives equal logits equal log-probabilities, so the gathered value is the same.
    best = rows.topk(2, dim=-1)
    forced = forced.to(rows.device).reshape(-1, 1)
    return ScoredRows(forced_logprob=logp.gather(1, forced)[:, 0], top1_id=top1[:, 0],
                      top1_logprob=logp.gather(1, top1)[:, 0], top2_logprob=logp.gather(1, best.indices[:, 1:])[:, 0],
                      margin=best.values[:, 0] - best.values[:, 1])


def _row_digests(host_rows: torch.Tensor) -> list[str]:
    """sha256 of each fp32 row's little-endian bytes (`alibi.tokens.records.logits_sha256`, without a copy)."""
    array = host_rows.numpy()
    if sys.byteorder != "little":
        array = array.astype("<f4")
    return [sha256_bytes(memoryview(row)) for row in array]


class RowHasher:
    """Digests logit rows on a thread pool while the caller computes the next window."""

    def __init__(self, workers: int | None = None):
        self._pool = ThreadPoolExecutor(max_workers=workers or min(8, os.cpu_count() or 1),
                                        thread_name_prefix="alibi-row-sha256")

    def submit(self, host_rows: torch.Tensor) -> list[Future]:
        """Queue the digests of `host_rows` [P,V] (fp32, C-contiguous, on the CPU, not modified afterwards)."""
        return [self._pool.submit(_row_digests, host_rows[i : i + HASH_CHUNK_ROWS])
                for i in range(0, host_rows.shape[0], HASH_CHUNK_ROWS)]

    @staticmethod
    def result(futures: Sequence[Future]) -> list[str]:
        return [d for f in futures for d in f.result()]

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A host copy of `t` that later device work cannot change: on CUDA an asynchronous copy into
    pinned memory, complete once an event recorded after it has completed (see `_InFlight`)."""
    if t.device.type == "cpu":
        return t.contiguous()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


@dataclass(frozen=True)
class _InFlight:
    """One window whose scoring was queued on the device; its host copies are valid after `done`."""

    window: int
    prompt_sha256: str
    forced: list[int]
    rows: torch.Tensor   # [P,V] fp32, host
    stats: torch.Tensor  # [P,4] fp32, host: forced, top-1, top-2 log-probabilities, margin
    top1: torch.Tensor   # [P] int64, host
    done: torch.cuda.Event | None

    def wait(self) -> None:
        if self.done is not None:
            self.done.synchronize()


@dataclass(frozen=True)
class _Scored:
    window: int
    prompt_sha256: str
    forced: list[int]
    stats: list[list[float]]
    top1: list[int]
    digests: list[Future]


def replay_windows(lm, input_ids: torch.Tensor, span: Span, progress: Progress | None = None,
                   hasher: RowHasher | None = None) -> tuple[TokenRecord, ...]:
    """Teacher-forced records of `lm` over `span` of the prompt ids [N,L], window-major.

    A one-window pipeline: window i's scoring and host copies are queued on the device, then
    window i+1's forward is queued before window i's results are waited for, so the device never
    idles on the host (on the CPU every step simply runs in order). Digests run on `hasher`'s pool.
    """
    own = hasher is None
    hasher = hasher or RowHasher()
    t, p = span.context, span.positions
    scored: list[_Scored] = []

    def finish(item: _InFlight) -> None:
        item.wait()
        _check_finite(item.stats, item.window, t, lm)
        scored.append(_Scored(item.window, item.prompt_sha256, item.forced, item.stats.tolist(), item.top1.tolist(),
                              hasher.submit(item.rows)))
        if progress:
            progress(len(scored), len(span.windows), f"window {item.window}: {p} positions scored")

    try:
        previous: _InFlight | None = None
        for w in span.windows:
            ids = input_ids[w]
            rows = lm.logits(ids[: span.fed].reshape(1, -1))[0, t - 1 : t + p - 1]
            forced = ids[t : t + p]
            s = score_rows(rows, forced)
            stats = torch.stack([s.forced_logprob, s.top1_logprob, s.top2_logprob, s.margin], dim=1)
            host_rows, host_stats, host_top1 = _to_host(rows), _to_host(stats), _to_host(s.top1_id)
            done = None
            if rows.device.type == "cuda":
                done = torch.cuda.Event()
                done.record()
            current = _InFlight(w, window_sha256(ids), forced.tolist(), host_rows, host_stats, host_top1, done)
            if previous is not None:
                finish(previous)
            previous = current
        if previous is not None:
            finish(previous)
        records = []
        for item in scored:
            digests = hasher.result(item.digests)
            for i in range(p):
                forced_lp, top1_lp, top2_lp, margin = item.stats[i]
                records.append(TokenRecord(window=item.window, prompt_sha256=item.prompt_sha256, position=t + i,
                                           forced_id=int(item.forced[i]), forced_logprob=forced_lp,
                                           top1_id=int(item.top1[i]), top1_logprob=top1_lp, top2_logprob=top2_lp,
                                           margin=margin, logits_sha256=digests[i]))
        return tuple(records)
    finally:
        if own:
            hasher.close()


def _check_finite(stats: torch.Tensor, window: int, context: int, lm) -> None:
    bad = (~torch.isfinite(stats)).any(dim=1).nonzero()
    if bad.numel():
        kernel = lm.kernel.name if lm.kernel is not None else "the dense model"
        raise InputError(f"window {window} position {context + int(bad[0, 0])}: {kernel} produced non-finite logits "
                         "(NaN or inf); the records hold finite values only — check the kernel with `alibi conform`")


def run_teacher_forced(model_dir: str | os.PathLike, prompts_dir: str | os.PathLike, out: str | os.PathLike, *,
                       kernel: str | None, windows: int | None = None, context: int | None = None,
                       positions: int | None = None, arm: str | None = None, device: str | None = None,
                       overwrite: bool = False, progress: Progress | None = None,
                       deterministic: bool = True, prereg: str | os.PathLike | None = None) -> ArmRecords:
    """One arm's teacher-forced replay into the folder `out` (records.json + manifest.json, atomically).

    Everything is validated before the model loads; InputError (exit 2) for bad input, with
    nothing written; KernelUnavailable (exit 3) when the kernel cannot run here. prereg: the locked
    protocol folder the replay is measured under; its lock and head hashes go into the manifest
    (`predicate.protocol`), and an amendment while the replay runs leaves nothing written.
    """
    prompts = load_prompts(prompts_dir)
    span = resolve_span(prompts, windows, context, positions, prompts_dir)
    check_output(out, {"--model": model_dir, "--prompts": prompts_dir, "--prereg": prereg}, overwrite)
    protocol = locked_protocol(prereg)
    inputs = open_inputs(model_dir, prompts)
    lm = load_model(model_dir, kernel, device, deterministic=deterministic)
    label = arm or (lm.kernel.name if lm.kernel is not None else "dense")
    if progress:
        progress.note(f"teacher-forced replay: {lm.kernel.name if lm.kernel else 'dense'} on {lm.device}, "
                      f"{len(span.windows)} windows × {span.positions} positions after {span.context} tokens of context")
    records = replay_windows(lm, prompts.input_ids, span, progress)
    result = ArmRecords(kernel=lm.kernel.name if lm.kernel is not None else None, context=span.context,
                        positions=span.positions, windows=span.windows, records=records)
    recheck_protocol(prereg, protocol)
    with atomic.staged_dir(out) as stage:
        write_records(result, stage)
        write_manifest(stage, "replay", replay_predicate(inputs, lm, label, {"replay": "teacher-forced",
                                                                           **span.as_dict()}, protocol))
    return result


# --- two arms, each in a fresh process -----------------------------------------------------------

PAIR_LAYOUT = {"arm-a": "arm a's records.json + manifest.json", "arm-b": "arm b's records.json + manifest.json",
               "flips": "alibi analyze flips arm-a arm-b"}


def alibi_command(*args: str) -> list[str]:
    """argv running `python -m alibi ARGS` with this interpreter."""
    return [sys.executable, "-m", "alibi", *args]


def child_env() -> dict[str, str]:
    """The environment of a fresh child process: this one's, with this toolkit first on PYTHONPATH
    (so the child runs the same code even from another working directory)."""
    root = str(Path(alibi.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_child(argv: list[str], what: str, cwd: str | os.PathLike | None = None) -> int:
    """Run `argv` as a fresh process (its stderr passes through, its stdout goes to our stderr); its exit code."""
    # The child's stdout (its one-line summary, naming the staging folder) goes to our stderr: the
    # parent prints its own summary, and stdout stays free of lines about temporary folders.
    done = subprocess.run(argv, env=child_env(), cwd=cwd, check=False, stdout=subprocess.PIPE, text=True)
    if done.stdout:
        print(done.stdout, end="", file=sys.stderr)
    if done.returncode != 0:
        print(f"alibi: {what} exited with code {done.returncode}", file=sys.stderr)
    return done.returncode


def run_pair(model_dir: str | os.PathLike, prompts_dir: str | os.PathLike, out: str | os.PathLike, *,
             kernel_a: str, kernel_b: str, windows: int | None = None, context: int | None = None,
             positions: int | None = None, device: str | None = None, overwrite: bool = False,
             quiet: bool = False, deterministic: bool = True, prereg: str | os.PathLike | None = None) -> int:
    """Both arms, each in a fresh process (`OUT/arm-a`, `OUT/arm-b`), then the flip analysis into
    `OUT/flips`; the whole folder appears only if every step succeeded. Returns the exit code of
    the first step that failed (0 when all succeeded). prereg: the locked protocol both arms run
    under (passed to each arm's process); every manifest of the folder records its lock and head.
    """
    model_dir, prompts_dir = Path(model_dir).resolve(), Path(prompts_dir).resolve()
    prompts = load_prompts(prompts_dir)
    span = resolve_span(prompts, windows, context, positions, prompts_dir)  # fail here, before any process starts
    check_output(out, {"--model": model_dir, "--prompts": prompts_dir, "--prereg": prereg}, overwrite)
    protocol = locked_protocol(prereg)
    common = ["--model", str(model_dir), "--prompts", str(prompts_dir)]
    if prereg is not None:
        common += ["--prereg", str(prereg)]
    for flag, value in (("--windows", windows), ("--context", context), ("--positions", positions),
                        ("--device", device)):
        if value is not None:
            common += [flag, str(value)]
    if not deterministic:
        common.append("--nondeterministic")
    if quiet:
        common.append("--quiet")
    try:
        with atomic.staged_dir(out) as stage:
            for label, kernel in (("a", kernel_a), ("b", kernel_b)):
                code = run_child(alibi_command("replay", "teacher-forced", *common, "--kernel", kernel, "--arm", label,
                                               "--out", str(stage / f"arm-{label}")), f"arm {label} ({kernel})")
                if code:
                    raise StepFailed(code)
            code = analyze_flips_in(stage, note_lines(quiet))
            if code:
                raise StepFailed(code)
            recheck_protocol(prereg, protocol)
            write_manifest(stage, "replay", combined_predicate(
                {"a": stage / "arm-a", "b": stage / "arm-b"},
                {"replay": "teacher-forced-pair", **span.as_dict(), "layout": PAIR_LAYOUT}, protocol))
    except StepFailed as failed:
        return failed.code
    return 0


class StepFailed(Exception):
    """Unwinds the staging folder (nothing is written) carrying the failed step's exit code."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def analyze_flips_in(folder: Path, progress: Callable[[str], None] | None = None) -> int:
    """The flip analysis of `folder/arm-a` against `folder/arm-b` into `folder/flips`.

    It runs with `folder` as the working directory and relative paths, so the analysis records
    the arms as `arm-a` and `arm-b` rather than by the staging folder's temporary name
    (`alibi.tokens.flips.analyze_flips`: its IdentityViolation, exit 1, and InputError, exit 2, propagate).
    """
    with contextlib.chdir(folder):
        analyze_flips("arm-a", "arm-b", "flips", progress=progress)
    return 0
