"""Model quality on a pinned prompt set: perplexity, and greedy continuations.

Perplexity of a window of T tokens is `exp(mean NLL)` of tokens 2..T given their prefixes, from one
prefill forward pass; the set's perplexity is `exp` of the mean NLL over all predicted tokens of
all windows (each window counts T−1 tokens). Log-softmax is taken in fp32 from the model's logits.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from alibi.model.prompts import PromptSet
from alibi.model.runner import LoadedModel

# Called after each window with (windows done, windows in all, seconds since the start).
Progress = Callable[[int, int, float], None]


@dataclass(frozen=True)
class Perplexity:
    """perplexity: over all windows; per_window: each window's perplexity; tokens: tokens scored;
    mean_nll: mean negative log-likelihood (nats); seconds: wall time of the forward passes."""

    perplexity: float
    mean_nll: float
    per_window: tuple[float, ...]
    tokens: int
    seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


def window_nll(lm: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    """Per-token NLL [T−1] (fp32, CPU) of one window of token ids [T]."""
    logits = lm.logits(ids.reshape(1, -1))[0, :-1]
    target = ids.reshape(-1)[1:].to(logits.device)
    return torch.nn.functional.cross_entropy(logits, target, reduction="none").cpu()


def perplexity(lm: LoadedModel, prompts: PromptSet, windows: int | None = None,
               progress: Progress | None = None) -> Perplexity:
    """Perplexity of `lm` on the first `windows` windows of `prompts` (all by default)."""
    n = prompts.windows if windows is None else min(windows, prompts.windows)
    start = time.perf_counter()
    nlls = []
    for i in range(n):
        nlls.append(window_nll(lm, prompts.input_ids[i]))
        if progress:
            progress(i + 1, n, time.perf_counter() - start)
    seconds = time.perf_counter() - start
    allnll = torch.cat(nlls).double()
    mean = float(allnll.mean())
    return Perplexity(math.exp(mean), mean, tuple(math.exp(float(x.double().mean())) for x in nlls),
                      int(allnll.numel()), seconds)


@dataclass(frozen=True)
class Continuation:
    """One greedy continuation: the window index, the prompt's token count, the chosen ids."""

    window: int
    prompt_tokens: int
    ids: tuple[int, ...]


def greedy_continuations(lm: LoadedModel, prompts: PromptSet, prompt_tokens: int, new_tokens: int,
                         windows: int | None = None, progress: Progress | None = None) -> list[Continuation]:
    """Greedy `new_tokens` after the first `prompt_tokens` tokens of each window."""
    n = prompts.windows if windows is None else min(windows, prompts.windows)
    start = time.perf_counter()
    out = []
    for i in range(n):
        ids = lm.greedy(prompts.input_ids[i, :prompt_tokens], new_tokens)
        out.append(Continuation(i, prompt_tokens, tuple(ids.tolist())))
        if progress:
            progress(i + 1, n, time.perf_counter() - start)
    return out
