"""Greedy decoding over a static cache, replayed as CUDA graphs: the same tokens and logit bits as eager decoding."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from alibi.errors import InputError
from alibi.model.decode_graphs import MIN_BUCKET, GraphDecoder, cache_bucket

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="needs transformers (pip install 'integer-alibi[model]')")


def _prompts(batch: int, tokens: int, seed: int) -> torch.Tensor:
    return torch.randint(3, 320, (batch, tokens), generator=torch.Generator().manual_seed(seed))


def _decode(decode, ids, new_tokens):
    digests: list[torch.Tensor] = []
    tokens = decode(ids, new_tokens, digests)
    return tokens, torch.stack(digests).cpu()


def test_cache_buckets_are_powers_of_two_from_the_minimum():
    assert [cache_bucket(n) for n in (1, MIN_BUCKET, MIN_BUCKET + 1, 200, 256, 257)] == [64, 64, 128, 256, 256, 512]


def test_static_cache_decoding_gives_the_dynamic_caches_tokens_and_logit_bits(tiny_w8a8):
    """The graph decoder's steps, run eagerly on the CPU: a static cache of 64 or 128 slots, an explicit mask and
    a prefill into the empty cache give every step's logits the bits of transformers' dynamic cache, also when
    the decoder's cache is reused for a second request (slots past the position hold the first one's keys)."""
    from alibi.model.runner import load_model

    lm = load_model(tiny_w8a8, "emulator:w_then_a")
    static = GraphDecoder(lm.model, lm.device, capture=False)
    for batch, tokens, new, seed in ((4, 9, 7, 0), (4, 5, 3, 1), (2, 60, 12, 2)):  # buckets 64, 64 reused, 128
        ids = _prompts(batch, tokens, seed)
        eager_tokens, eager_logits = _decode(lm.greedy_batch, ids, new)
        static_tokens, static_logits = _decode(static.greedy, ids, new)
        assert torch.equal(static_tokens, eager_tokens)
        assert torch.equal(static_logits, eager_logits)
    assert sorted(static.steps) == [(2, 128), (4, 64)]


def test_a_prefill_into_an_empty_static_cache_attends_causally_from_the_first_key():
    """transformers hands the attention no mask for a prefill into an empty static cache: the rows must see the
    keys up to their own position from the first key, not the empty slots that the last-query alignment would
    put before them."""
    from alibi.model.execution import invariant_attention_forward

    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g) for _ in range(3))
    slots = torch.cat([k, torch.randn(1, 2, 10, 8, generator=g)], dim=2), torch.cat([v, torch.zeros(1, 2, 10, 8)], 2)
    whole, _ = invariant_attention_forward(None, q, k, v, None)
    static, _ = invariant_attention_forward(None, q, *slots, None)
    assert torch.equal(static.view(torch.int32), whole.view(torch.int32))


def test_an_eager_modes_record_is_the_one_runs_had_before_graphs_and_asking_for_graphs_adds_the_decoding():
    import dataclasses

    from alibi.model.execution import ExecutionMode

    mode = ExecutionMode(True, "alibi_invariant:tree", "tree", "row-block:8", True, None)
    assert list(mode.as_dict()) == ["deterministic", "attention", "norms", "dense_linears", "deterministic_algorithms",
                                    "cublas_workspace"]
    assert dataclasses.replace(mode, decode="cuda-graphs").as_dict()["decode"] == "cuda-graphs"
    refused = dataclasses.replace(mode, graphs_refused="kernel k cannot be captured").as_dict()
    assert (refused["decode"], refused["graphs_refused"]) == ("eager", "kernel k cannot be captured")


def test_cuda_graphs_for_a_model_on_the_cpu_are_refused_in_one_line(tiny_w8a8):
    from alibi.model.runner import load_model

    with pytest.raises(InputError, match="--decode cuda-graphs: the model runs on cpu; CUDA graphs need a CUDA device"):
        load_model(tiny_w8a8, "emulator:w_then_a", cuda_graphs=True)


def test_a_probe_whose_capture_fails_names_the_error_in_one_line_and_keeps_no_step(tiny_w8a8):
    from alibi.model.runner import load_model

    lm = load_model(tiny_w8a8, "emulator:w_then_a")
    decoder = GraphDecoder(lm.model, lm.device)  # capturing on the CPU: there is no CUDA stream to capture
    reason = decoder.probe()
    assert reason and "\n" not in reason and len(reason) <= 300
    assert decoder.steps == {} and decoder.pool is None


# --- on the GPU ------------------------------------------------------------------------------------


def _syncing_kernel():
    from alibi.kernels.triton_int8 import TritonInt8Kernel

    class HostSyncingKernel(TritonInt8Kernel):
        """`triton` that reads a value back to the host on every call, as no CUDA graph allows."""

        name = "test:host-syncing-triton"

        def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
            if float(s_a.max()) < 0:  # a host read: illegal while a stream is being captured
                raise AssertionError("scales are positive")
            return super().scaled_mm(a_q, s_a, w_q, s_w, bias, out_dtype)

    return HostSyncingKernel()


@pytest.mark.gpu
def test_cuda_graph_decoding_gives_eager_decodings_tokens_and_logit_bits(tiny_w8a8):
    from alibi.model.runner import load_model

    eager = load_model(tiny_w8a8, "triton")
    graphs = load_model(tiny_w8a8, "triton", cuda_graphs=True)
    assert (eager.execution.decode, graphs.execution.decode, graphs.execution.graphs_refused) == \
        ("eager", "cuda-graphs", None)
    for batch, tokens, new, seed in ((8, 9, 20, 0), (8, 30, 20, 1), (64, 60, 10, 2)):
        ids = _prompts(batch, tokens, seed)
        graph_tokens, graph_logits = _decode(graphs.greedy_batch, ids, new)
        eager_tokens, eager_logits = _decode(eager.greedy_batch, ids, new)
        assert torch.equal(graph_tokens, eager_tokens) and torch.equal(graph_logits, eager_logits)
    assert sorted(graphs.decoder.steps) == [(1, 64), (8, 64), (64, 128)]  # the load-time probe's, then these
    assert all(step.graph is not None for step in graphs.decoder.steps.values())


@pytest.mark.gpu
def test_graphs_left_to_the_runner_are_used_on_a_cuda_device(tiny_w8a8):
    from alibi.model.runner import load_model

    assert load_model(tiny_w8a8, "triton", cuda_graphs=None).execution.decode == "cuda-graphs"


@pytest.mark.gpu
def test_a_kernel_that_syncs_with_the_host_decodes_eagerly_names_it_and_leaves_the_device_usable(tiny_w8a8):
    from alibi.model.runner import load_model

    torch.cuda.manual_seed(11)
    lm = load_model(tiny_w8a8, _syncing_kernel(), cuda_graphs=True)
    assert lm.decoder is None and lm.execution.decode == "eager"
    assert lm.execution.graphs_refused.startswith("kernel test:host-syncing-triton cannot be captured in a CUDA graph")
    # the failed capture left torch's default generator in capture mode until release_generator, and every random
    # op on the device raised (a model's initialisation draws from it); its seed is kept
    torch.randn(8, device="cuda")
    assert torch.cuda.initial_seed() == 11
    eager = load_model(tiny_w8a8, "triton")
    ids = _prompts(4, 9, 3)
    assert torch.equal(_decode(lm.greedy_batch, ids, 6)[1], _decode(eager.greedy_batch, ids, 6)[1])
