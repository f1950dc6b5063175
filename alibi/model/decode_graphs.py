"""Greedy decoding with CUDA graphs: one captured decode step per batch size and cache bucket.

At decode shapes the runner is bound by launches, not by arithmetic: each eager GEMM call costs about
15 µs of host time whoever implements it, and a decode step of SmolLM2 at batch 64 is a few ms of GPU
work inside tens of ms of Python. A CUDA graph records one step's launches once and replays them with
one call. `GraphDecoder.greedy` is `LoadedModel.greedy_batch` done so, with the same tokens and the
same logits bit for bit in the deterministic mode:

- **The KV cache is static**: transformers' `StaticCache` of `bucket` positions (the next power of two
  at or above prompt + new tokens, at least `MIN_BUCKET`), so the step's tensors keep their addresses.
  Key position j sits at index j, as in the dynamic cache.
- **The step sees an explicit causal mask**, built inside the graph from the step's position (keys at
  or before it). The deterministic attention visits a row's keys in fixed blocks from position 0 up to
  its last allowed key and zeroes the rest (`alibi.model.invariant`), so the empty slots past the
  position change no bit: the logits are those of the dynamic cache. The prefill runs eagerly into the
  same cache (transformers passes it no mask; `alibi.model.execution` reads that as causal from the
  first key, as SDPA does).
- **One graph per (batch, bucket)**, captured at the first step that needs it: that step runs eagerly
  on a side stream (it compiles Triton kernels and sets up libraries; its result is the step's result),
  then the next steps replay the graph. Graphs share one memory pool and are kept for later calls.

In the native mode (`--nondeterministic`) the static cache hands SDPA another key length than the
dynamic one, so native graphs promise nothing against native eager decoding; both modes record which
decoding ran (`ExecutionMode.decode`), so arms decoded differently fail the identity contract.

A kernel that cannot be captured (it synchronizes with the host, or allocates outside the graph's pool)
is found when the model loads: `GraphDecoder.probe` captures one decode step, and the runner decodes eagerly,
naming the kernel and the error (`ExecutionMode.graphs_refused`). Traced executions (`alibi variations`,
`--trace`) stay eager: module hooks run when a graph is captured, not when it replays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from alibi.kernels.graphs import release_generator
from alibi.model.trace import row_digests

MIN_BUCKET = 64
"""The smallest cache a graph is captured for: short prompts share one graph per batch size."""


def cache_bucket(tokens: int) -> int:
    """Cache positions for a sequence of `tokens` (prompt + new tokens): a power of two ≥ max(tokens, MIN_BUCKET)."""
    return max(MIN_BUCKET, 1 << max(tokens - 1, 0).bit_length())


@dataclass
class DecodeStep:
    """One (batch, bucket): the static cache, the step's input buffers, and its graph once captured.

    ids [B, 1]: the tokens the step reads; position [1, 1]: their position; logits [B, V] float32: what the
    step wrote (the graph's output tensor once captured)."""

    cache: object
    ids: torch.Tensor
    position: torch.Tensor
    key_positions: torch.Tensor
    logits: torch.Tensor | None = None
    graph: torch.cuda.CUDAGraph | None = None


@dataclass
class GraphDecoder:
    """Greedy decoding of a loaded model (`alibi.model.runner.LoadedModel`) with CUDA graphs (module docstring).

    capture: False runs the same static-cache steps eagerly (the CPU, and the tests that check that path)."""

    model: torch.nn.Module
    device: torch.device
    capture: bool = True
    steps: dict[tuple[int, int], DecodeStep] = field(default_factory=dict)
    pool: object = None

    def _step_state(self, batch: int, bucket: int) -> DecodeStep:
        key = (batch, bucket)
        if key not in self.steps:
            # deferred: keeps transformers out of start-up
            from transformers import StaticCache

            self.steps[key] = DecodeStep(
                cache=StaticCache(config=self.model.config, max_cache_len=bucket),
                ids=torch.zeros(batch, 1, dtype=torch.long, device=self.device),
                position=torch.zeros(1, 1, dtype=torch.long, device=self.device),
                key_positions=torch.arange(bucket, device=self.device))
        return self.steps[key]

    def _forward(self, state: DecodeStep) -> torch.Tensor:
        """One decode step from the state's buffers → float32 logits [B, V] (what the graph records)."""
        allowed = (state.key_positions <= state.position[0, 0])[None, None, None, :]
        out = self.model(input_ids=state.ids, position_ids=state.position, attention_mask=allowed,
                         past_key_values=state.cache, use_cache=True)
        return out.logits[:, -1].float()

    def _run_step(self, state: DecodeStep) -> torch.Tensor:
        if not self.capture:
            return self._forward(state)
        if state.graph is not None:
            state.graph.replay()
            return state.logits
        # The first step runs eagerly on a side stream (torch's recipe before a capture: lazy initialisation
        # and Triton's compilation happen outside the graph); then the graph records the step without running it.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            logits = self._forward(state)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                state.logits = self._forward(state)
        except BaseException:
            release_generator(self.device)
            raise
        state.graph = graph
        return logits

    def probe(self) -> str | None:
        """None if a decode step of the model can be captured (its graph for batch 1 is kept), else why not (one
        line; the decoder is left empty)."""
        try:
            self.greedy(torch.zeros(1, 1, dtype=torch.long), 3)
        except Exception as exc:  # noqa: BLE001 - any failure in a capture (a kernel's own code): decode eagerly
            self.steps.clear()
            self.pool = None
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return f"{type(exc).__name__}: {first}"[:300]
        return None

    @torch.inference_mode()
    def greedy(self, input_ids: torch.Tensor, new_tokens: int,
               logit_digests: list[torch.Tensor] | None = None) -> torch.Tensor:
        """`LoadedModel.greedy_batch`'s contract: token ids [B, T] → chosen ids [B, new_tokens] (on the CPU)."""
        batch, prompt = input_ids.shape
        state = self._step_state(batch, cache_bucket(prompt + new_tokens))
        state.cache.reset()
        out = self.model(input_ids=input_ids.to(self.device), past_key_values=state.cache, use_cache=True)

        def step(nxt: torch.Tensor, position: int) -> torch.Tensor:
            state.ids.copy_(nxt)
            state.position.fill_(position)
            return self._run_step(state)

        return greedy_loop(out.logits[:, -1].float(), prompt, new_tokens, step, logit_digests)


def greedy_loop(last: torch.Tensor, prompt: int, new_tokens: int, step: Callable[[torch.Tensor, int], torch.Tensor],
                logit_digests: list[torch.Tensor] | None = None) -> torch.Tensor:
    """Greedy decisions after a prefill of `prompt` tokens whose last fp32 logits are `last` [B, V]: each row's argmax,
    fed to `step(tokens [B, 1], their position)`, which returns the next fp32 logits, until `new_tokens` are chosen →
    [B, new_tokens] on the CPU. logit_digests: when a list, each decision appends the digests of the rows it read
    (`alibi.model.trace.row_digests`)."""
    chosen: list[torch.Tensor] = []
    while True:
        if logit_digests is not None:
            logit_digests.append(row_digests(last[:, None])[:, 0])
        nxt = last.argmax(dim=-1, keepdim=True)
        chosen.append(nxt)
        if len(chosen) == new_tokens:
            return torch.cat(chosen, dim=1).cpu()
        last = step(nxt, prompt + len(chosen) - 1)


__all__ = ["MIN_BUCKET", "DecodeStep", "GraphDecoder", "cache_bucket", "greedy_loop"]
