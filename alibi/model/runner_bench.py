"""`alibi bench runner`: what a greedy study costs, by phase (prefill, decode step), execution mode and decoding.

A benchmark, not a timed test. One process loads the model once per execution mode (deterministic, native)
and times `LoadedModel.greedy_batch` on the same [batch, prompt_tokens] token ids (a prompt set's windows,
or ids drawn from the vocabulary with a fixed seed):

- **prefill**: `greedy_batch(ids, 1)`, one forward of the whole batch with the KV cache and the argmax;
- **decode step**: (greedy with `new_tokens` − greedy with 1) / (new_tokens − 1), the two calls back to back:
  the per-step cost of eager decoding (transformers' dynamic cache) and, on CUDA, of decoding that replays
  CUDA graphs (`alibi.model.decode_graphs`; the same model with its decoder switched on and off, so both
  read the same weights).

The modes' torch flags are process-wide, so they are set again before each mode runs
(`alibi.model.execution.set_library_flags`), and the modes and decodings take turns round by round, so a
drift of the machine cannot pass for a difference between them; each reported number is the median round.
Before any timing, each decoding runs once untimed (Triton compilation, cuBLAS handles, the graphs'
capture: setup stays out of every number), and the graph decoding's tokens and logit digests are compared
with the eager decoding's (`identical_to_eager`): a decoding that changes bits is not a speed-up. Where the
time goes: the kernel launches of a few profiled decode steps per mode (`launches_per_step`: one graph replay
is one launch). The weights are read from device memory at every step unless they fit the L2 (`weight_bytes`
and `l2_bytes` are recorded beside the timings).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from alibi.errors import InputError
from alibi.governance.environment import environment_record
from alibi.io.typed import TypedResult
from alibi.model.checkpoint import read_config
from alibi.model.execution import set_library_flags
from alibi.model.prompts import load_prompt_set
from alibi.model.runner import load_model

SCHEMA = "alibi.bench-runner/v1"
MODES = ("deterministic", "native")
PROFILED_STEPS = 4
LAUNCH_EVENTS = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cudaGraphLaunch")


@dataclass(frozen=True)
class Timing:
    """One phase of one execution mode and decoding: the median seconds per call (prefill) or per decode step, the
    spread of the rounds (min, max), tokens per second at the median (batch rows per step, or the prompt tokens
    of the whole batch per prefill; None where the median step is not above zero: a step shorter than the
    timing's noise), and the kernel launches per decode step (None for a prefill, or where none are counted: the
    CPU)."""

    mode: str
    decode: str
    phase: str
    seconds: float
    spread: tuple[float, float]
    tokens_per_s: float | None
    launches_per_step: float | None


@dataclass(frozen=True)
class ModeResult:
    """One execution mode: its `ExecutionMode` as recorded in manifests, the timings, the decode speed-up of CUDA
    graphs over eager (None where graphs did not run), whether the graph decoding gave eager's tokens and
    logit bits (None where it did not run), and why graphs did not run (None when they did)."""

    mode: str
    execution: dict[str, Any]
    timings: tuple[Timing, ...]
    graphs_speedup: float | None
    identical_to_eager: bool | None
    graphs_not_run: str | None


@dataclass(frozen=True)
class RunnerBench(TypedResult):
    """`alibi bench runner`: one model and kernel, timed per execution mode (`modes`); `prompts`: the prompt set
    the token ids came from (None: drawn from the vocabulary)."""

    SCHEMA = SCHEMA
    JSON_INDENT = 2
    REMEDY = "re-run `alibi bench runner`"

    model: str
    kernel: str | None
    device: str
    prompts: str | None
    batch: int
    prompt_tokens: int
    new_tokens: int
    repeats: int
    weight_bytes: int
    l2_bytes: int | None
    modes: tuple[ModeResult, ...]
    environment: dict[str, Any]
    schema: str = SCHEMA

    @property
    def graphs_change_bits(self) -> bool:
        """Whether the deterministic runner's graph decoding gave other bits than its eager decoding."""
        return any(m.mode == "deterministic" and m.identical_to_eager is False for m in self.modes)


def _wall(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()  # greedy_batch returns its tokens on the CPU: the GPU's work is done when it returns
    return time.perf_counter() - start


def _round(lm, ids: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    """One round: (prefill seconds, seconds per decode step) from a greedy call of 1 and one of `new_tokens`."""
    one = _wall(lambda: lm.greedy_batch(ids, 1))
    full = _wall(lambda: lm.greedy_batch(ids, new_tokens))
    return one, (full - one) / (new_tokens - 1)


def _digests(lm, ids: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    steps: list[torch.Tensor] = []
    tokens = lm.greedy_batch(ids, new_tokens, logit_digests=steps)
    return tokens, torch.stack(steps).cpu()


def launches_per_step(lm, ids: torch.Tensor) -> float | None:
    """Kernel launches (a graph replay counts one) per decode step, from torch.profiler over PROFILED_STEPS steps
    (the prefill's launches, profiled alone, subtracted); None on the CPU."""
    if lm.device.type != "cuda":
        return None
    def launches(new_tokens: int) -> int:
        lm.greedy_batch(ids, new_tokens)  # any graph this length needs is captured before, not inside, the profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            lm.greedy_batch(ids, new_tokens)
        return sum(e.count for e in prof.key_averages() if e.key in LAUNCH_EVENTS)

    return (launches(PROFILED_STEPS + 1) - launches(1)) / PROFILED_STEPS


def _timing(mode: str, decode: str, phase: str, walls: list[float], tokens: int,
            launches: float | None = None) -> Timing:
    median = statistics.median(walls)
    return Timing(mode, decode, phase, median, (min(walls), max(walls)), tokens / median if median > 0 else None,
                  launches)


def bench_runner(folder: str | Path, kernel: str | None, *, device: str | None = None, prompts: Path | None = None,
                 batch: int = 64, prompt_tokens: int = 64, new_tokens: int = 32, repeats: int = 3,
                 modes: tuple[str, ...] = MODES, progress: Callable[[str], None] | None = None) -> RunnerBench:
    """Time the runner on `folder` with `kernel` (module docstring)."""
    folder = Path(folder)
    vocab = int(read_config(folder)["vocab_size"])
    if prompts is not None:
        ids = _window_ids(load_prompt_set(prompts).input_ids, batch, prompt_tokens, prompts, vocab)
    else:
        ids = torch.randint(0, vocab, (batch, prompt_tokens), generator=torch.Generator().manual_seed(0))
    models = {mode: load_model(folder, kernel, device, deterministic=mode == "deterministic", cuda_graphs=None)
              for mode in modes}
    decodings = {mode: {"eager": dataclasses.replace(lm, decoder=None),
                        **({"cuda-graphs": lm} if lm.decoder is not None else {})} for mode, lm in models.items()}
    identical: dict[str, bool | None] = {}
    launches: dict[tuple[str, str], float | None] = {}
    for mode, runs in decodings.items():
        set_library_flags(mode == "deterministic")
        if progress:
            progress(f"{mode}: warm-up, bit check and launch count ({', '.join(runs)} decoding)")
        done = {name: _digests(lm, ids, new_tokens) for name, lm in runs.items()}
        identical[mode] = None if "cuda-graphs" not in done else \
            all(torch.equal(g, e) for g, e in zip(done["cuda-graphs"], done["eager"]))
        launches.update({(mode, name): launches_per_step(lm, ids) for name, lm in runs.items()})
    rounds: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in range(repeats):
        if progress:
            progress(f"round {r + 1} of {repeats}")
        for mode, runs in decodings.items():
            set_library_flags(mode == "deterministic")
            for name, lm in runs.items():
                rounds.setdefault((mode, name), []).append(_round(lm, ids, new_tokens))
    results = []
    for mode, runs in decodings.items():
        eager = rounds[(mode, "eager")]
        timings = [_timing(mode, "eager", "prefill", [p for p, _ in eager], batch * prompt_tokens)]
        timings += [_timing(mode, name, "decode", [s for _, s in rounds[(mode, name)]], batch, launches[(mode, name)])
                    for name in runs]
        graphs = rounds.get((mode, "cuda-graphs"))
        speedup = None if graphs is None else \
            statistics.median(s for _, s in eager) / statistics.median(s for _, s in graphs)
        lm = models[mode]
        not_run = None if lm.decoder is not None else \
            (lm.execution.graphs_refused or f"CUDA graphs need a CUDA device; the model runs on {lm.device}")
        results.append(ModeResult(mode, lm.execution.as_dict(), tuple(timings), speedup, identical[mode], not_run))
    lm = next(iter(models.values()))
    weight_bytes = sum(t.numel() * t.element_size() for t in [*lm.model.parameters(), *lm.model.buffers()])
    l2 = torch.cuda.get_device_properties(lm.device).L2_cache_size if lm.device.type == "cuda" else None
    return RunnerBench(model=str(folder), kernel=lm.kernel.name if lm.kernel else None, device=str(lm.device),
                       prompts=None if prompts is None else str(prompts), batch=batch, prompt_tokens=prompt_tokens,
                       new_tokens=new_tokens, repeats=repeats, weight_bytes=weight_bytes, l2_bytes=l2,
                       modes=tuple(results), environment=environment_record())


def _window_ids(input_ids: torch.Tensor, batch: int, prompt_tokens: int, prompts: Path, vocab: int) -> torch.Tensor:
    """The first `prompt_tokens` of the set's windows, repeated in order to fill `batch` rows."""
    if prompt_tokens > input_ids.shape[1]:
        raise InputError(f"--prompt-tokens {prompt_tokens}: the windows of {prompts} hold {input_ids.shape[1]} tokens")
    if int(input_ids.max()) >= vocab:
        raise InputError(f"--prompts {prompts}: holds token id {int(input_ids.max())}, beyond the model's vocabulary of "
                         f"{vocab}; build a prompt set with the model's tokenizer (`alibi prompts build`)")
    rows = torch.arange(batch) % input_ids.shape[0]
    return input_ids[rows, :prompt_tokens]


def format_table(result: RunnerBench) -> str:
    """The timings as a text table, then one line per mode with the graphs' speed-up or why they did not run."""
    lines = [f"runner: {result.kernel or 'dense'} on {result.device}, batch {result.batch}, {result.prompt_tokens} "
             f"prompt tokens, {result.new_tokens} new tokens, median of {result.repeats} rounds",
             f"{'mode':<14}{'decoding':<13}{'phase':<9}{'ms':>10}{'min-max ms':>18}{'tokens/s':>12}{'launches':>10}"]
    for m in result.modes:
        for t in m.timings:
            spread = f"{t.spread[0] * 1e3:.2f}-{t.spread[1] * 1e3:.2f}"
            rate = "noise" if t.tokens_per_s is None else f"{t.tokens_per_s:.0f}"
            launched = "-" if t.launches_per_step is None else f"{t.launches_per_step:.0f}"
            lines.append(f"{t.mode:<14}{t.decode:<13}{t.phase:<9}{t.seconds * 1e3:>10.3f}{spread:>18}{rate:>12}"
                         f"{launched:>10}")
    for m in result.modes:
        if m.graphs_speedup is None:
            lines.append(f"{m.mode}: CUDA graphs not run: {m.graphs_not_run}")
        else:
            same = "the same tokens and logit bits as eager" if m.identical_to_eager else \
                "OTHER tokens or logit bits than eager"
            lines.append(f"{m.mode}: CUDA-graph decode steps {m.graphs_speedup:.2f}x the eager rate; {same}")
    return "\n".join(lines)


__all__ = ["LAUNCH_EVENTS", "MODES", "SCHEMA", "ModeResult", "RunnerBench", "Timing", "bench_runner", "format_table",
           "launches_per_step"]
