"""The deterministic runner, its execution variations and the first-divergence locator.

Facts asserted: the fixed-order reductions are padding- and shape-independent bit for bit; the
deterministic runner passes every variation on the tiny Llama; the libraries' own CPU attention
does not, and the locator names it; planted faults (a nondeterministic norm, a batch-variant norm,
a kernel that is not M-invariant) are named as the first diverging module at the first call where
they act.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from tokens.conftest import UlpUpAtDecode, needs_model_extra

from alibi.exact.numerics import bits
from alibi.model.invariant import attention, causal_allowed, exp_nonpositive, tree_sum

KERNEL = "emulator:a_then_w"  # exact accumulator, elementwise epilogue: M-invariant by construction


def _pairwise_reference(x: np.ndarray) -> np.float32:
    """The halving tree of `tree_sum` computed independently in numpy float32."""
    n = 1 << max(len(x) - 1, 0).bit_length()
    v = np.concatenate([x.astype(np.float32), np.full(n - len(x), -0.0, dtype=np.float32)])
    while len(v) > 1:
        v = (v[: len(v) // 2] + v[len(v) // 2:]).astype(np.float32)
    return v[0]


@pytest.mark.parametrize("n", [1, 3, 64, 100, 576])
def test_tree_sum_equals_the_numpy_halving_tree_and_ignores_trailing_negative_zero_padding(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(5, n, generator=g) * torch.logspace(-20, 20, n)
    got = tree_sum(x, dim=-1)[:, 0]
    want = torch.tensor([_pairwise_reference(row) for row in x.numpy()])
    assert torch.equal(bits(got), bits(want))
    padded = torch.cat([x, torch.full((5, 3 * n + 7), -0.0)], dim=1)
    assert torch.equal(bits(tree_sum(padded, dim=-1)[:, 0]), bits(got))


def test_tree_sum_of_negative_zeros_keeps_the_sign():
    assert bits(tree_sum(torch.full((1, 5), -0.0), dim=-1)).item() == bits(torch.tensor(-0.0)).item()


def test_exp_nonpositive_is_within_two_ulps_of_exp_and_the_same_bits_wherever_an_element_sits():
    """Measured: at most 1.21 ulp over a million points in [-87, 0] (the Horner steps round)."""
    x = -torch.rand(100_003, generator=torch.Generator().manual_seed(0)) * 80
    x[:3] = torch.tensor([0.0, -1e-30, -float("inf")])
    got = exp_nonpositive(x)
    exact = torch.exp(x.double())
    ulp = (exact.float().nextafter(torch.tensor(float("inf"))) - exact.float()).double()
    assert ((got.double() - exact).abs() <= 2 * ulp).all()
    assert got[2].item() == 0.0 and got[0].item() == 1.0
    for start, length in ((1, 9), (17, 1), (99_990, 13)):  # tails and offsets of other lengths
        assert torch.equal(bits(exp_nonpositive(x[start:start + length].clone())), bits(got[start:start + length]))


def test_invariant_attention_agrees_with_a_float64_softmax_reference():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 6, 16, generator=g) for _ in range(3))
    k, v = k[:, :2], v[:, :2]
    allowed = causal_allowed(6, 6, q.device)
    got = attention(q, k, v, allowed, 0.25)
    kr, vr = k.repeat_interleave(2, dim=1).double(), v.repeat_interleave(2, dim=1).double()
    s = (q.double() @ kr.transpose(-1, -2)) * 0.25
    want = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1) @ vr
    assert (got.double() - want).abs().max().item() < 1e-5


def test_one_query_row_gets_the_same_bits_in_a_prefill_a_chunk_and_a_decode_step():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 3, 40, 8, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(1, 3, 40, 8, generator=g).to(torch.bfloat16) for _ in range(2))
    prefill = attention(q, k, v, causal_allowed(40, 40, q.device), 0.35)
    for t in (0, 7, 31, 39):
        decode = attention(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1], causal_allowed(1, t + 1, q.device), 0.35)
        assert torch.equal(bits(decode[:, :, 0]), bits(prefill[:, :, t]))
    chunk = attention(q[:, :, 24:32], k[:, :, :32], v[:, :, :32], causal_allowed(8, 32, q.device), 0.35)
    assert torch.equal(bits(chunk), bits(prefill[:, :, 24:32]))


# --- the runner on the tiny Llama ---------------------------------------------------------------------


def _ids(n: int = 4, length: int = 20) -> torch.Tensor:
    return torch.randint(3, 300, (n, length), generator=torch.Generator().manual_seed(0))


@needs_model_extra
def test_the_deterministic_runner_passes_every_default_variation_on_the_tiny_llama(tiny):
    """The default protocol on the CPU for 4 prompts: batches of 2, 4 and 6 (prompt 0 at rows 0, 2, 5), the
    batch of 6 three times; every row of a batch compared with its prompt alone."""
    from alibi.model.runner import load_model
    from alibi.tokens.variations import certify_variations

    lm = load_model(tiny / "w8a8", KERNEL)
    assert lm.execution.deterministic and lm.execution.attention == "alibi_invariant:tree"
    results = {r.name: r for r in certify_variations(lm, _ids(), (0, 1, 2, 3), 12, chunk=5)}
    assert list(results) == ["repeat", "batch-size-2", "batch-size-4", "batch-size-6", "batch-composition",
                             "chunked-prefill", "prefill-vs-decode", "kv-cache-vs-recompute"]
    assert all(r.holds and r.positions_identical == r.positions_compared for r in results.values())
    rows = {name: r.positions_compared // 8 for name, r in results.items()}  # 8 scored positions a row
    assert rows == {"repeat": 2 * 6, "batch-size-2": 4, "batch-size-4": 4, "batch-size-6": 6, "batch-composition": 6,
                    "chunked-prefill": 4, "prefill-vs-decode": 4, "kv-cache-vs-recompute": 4}
    assert results["batch-size-6"].needle_rows == (0, 2, 5) and results["repeat"].runs == 2


@needs_model_extra
def test_the_native_cpu_attention_breaks_chunked_prefill_and_the_locator_names_the_attention_core(tiny):
    from alibi.model.runner import load_model
    from alibi.tokens.variations import certify_variations

    lm = load_model(tiny / "w8a8", KERNEL, deterministic=False)
    assert lm.execution.attention == "sdpa" and not lm.execution.deterministic_algorithms
    results = {r.name: r for r in certify_variations(lm, _ids(), (0, 1, 2, 3), 12, (2,), 5)}
    chunked = results["chunked-prefill"]
    assert not chunked.holds and chunked.first_divergence["kind"] == "attention-core"
    assert chunked.kernel_variant is False
    load_model(tiny / "w8a8", KERNEL)  # the process-wide torch flags back to the deterministic mode


class _TimeSeededPerturbation:
    """A forward hook adding one to the bit pattern of one output element chosen by the clock."""

    def __call__(self, module, inputs, output):
        flat = output.reshape(-1)
        i = time.perf_counter_ns() % flat.numel()
        flat[i] = (bits(flat[i:i + 1]) + 1).view(output.dtype)[0]
        return output


@needs_model_extra
def test_a_norm_made_nondeterministic_is_named_at_the_first_call(tiny):
    from alibi.model.runner import load_model
    from alibi.tokens.variations import compare, run_execution

    lm = load_model(tiny / "w8a8", KERNEL)
    name = "model.layers.1.input_layernorm"
    handle = lm.model.get_submodule(name).register_forward_hook(_TimeSeededPerturbation())
    try:
        a, b = (run_execution(lm, _ids(), (0, 1, 2, 3), "decode", 12, batch=4) for _ in range(2))
    finally:
        handle.remove()
    result = compare("rerun", "the same execution twice", a, b)
    assert not result.holds
    assert result.first_divergence["module"] == name and result.first_divergence["kind"] == "norm"
    assert result.first_divergence["call_a"] == result.first_divergence["call_b"] == 0


@needs_model_extra
def test_a_batch_variant_norm_is_named_and_not_blamed_on_the_kernel(tiny):
    from alibi.model.runner import load_model
    from alibi.tokens.variations import certify_variations

    lm = load_model(tiny / "w8a8", KERNEL)
    name = "model.layers.1.post_attention_layernorm"

    def batch_variant(module, inputs, output):  # one ulp more on every element whenever B > 1
        return (bits(output) + 1).view(output.dtype) if output.shape[0] > 1 else output

    handle = lm.model.get_submodule(name).register_forward_hook(batch_variant)
    try:
        results = {r.name: r for r in certify_variations(lm, _ids(), (0, 1, 2, 3), 12, (2,), 5)}
    finally:
        handle.remove()
    batch = results["batch-size-2"]
    assert not batch.holds and batch.kernel_variant is False
    assert batch.first_divergence["module"] == name and batch.first_divergence["position"] == 0
    assert batch.first_divergence["call_b"] == 0  # the batch's prefill, the first call where B > 1
    assert results["prefill-vs-decode"].holds and results["chunked-prefill"].holds  # batch 1 throughout


@needs_model_extra
def test_a_kernel_that_is_not_m_invariant_is_named_as_the_kernel(tiny):
    from alibi.model.runner import load_model
    from alibi.tokens.variations import certify_variations

    lm = load_model(tiny / "w8a8", UlpUpAtDecode.name)  # one ulp off at M = 1 only
    results = {r.name: r for r in certify_variations(lm, _ids(), (0, 1, 2, 3), 12, (2,), 5)}
    batch = results["batch-size-2"]
    assert not batch.holds and batch.kernel_variant is True
    assert batch.first_divergence["module"] == "model.layers.0.self_attn.q_proj"
    assert batch.first_divergence["position"] == 12  # the first decode step: M = 1 alone, M = 2 batched


# --- the commands ---------------------------------------------------------------------------------


@needs_model_extra
def test_locate_names_the_module_that_made_two_traced_greedy_runs_part(tiny, tmp_path, monkeypatch):
    from alibi.cli import main
    from alibi.tokens import greedy
    from alibi.tokens.locate import LocateResult

    runs = []
    for i in (1, 2):
        runs.append(tmp_path / f"run-{i}")
        greedy.run_greedy_arm(tiny / "w8a8", tiny / "set", runs[-1], kernel=KERNEL, prompt_tokens=10, new_tokens=6,
                              batch_size=3 if i == 1 else 1, trace=True)
    assert main(["locate", str(runs[0]), str(runs[1]), "--out", str(tmp_path / "loc")]) == 0
    same = LocateResult.from_json((tmp_path / "loc" / "locate.json").read_text())
    assert same.identical and same.logit_rows_identical == same.logit_rows_compared == 3 * 6
    assert same.batch_size_a == 3 and same.batch_size_b == 1

    real_load = greedy.load_model

    def perturbed(*args, **kwargs):
        lm = real_load(*args, **kwargs)
        lm.model.get_submodule("model.layers.0.mlp.act_fn").register_forward_hook(_TimeSeededPerturbation())
        return lm

    monkeypatch.setattr(greedy, "load_model", perturbed)
    greedy.run_greedy_arm(tiny / "w8a8", tiny / "set", tmp_path / "run-3", kernel=KERNEL, prompt_tokens=10,
                          new_tokens=6, batch_size=3, trace=True)
    assert main(["locate", str(runs[0]), str(tmp_path / "run-3")]) == 1
    from alibi.tokens.locate import locate

    r = locate(runs[0], tmp_path / "run-3")
    assert r.first_divergence["module"] == "model.layers.0.mlp.act_fn" and r.first_divergence["kind"] == "activation"


@needs_model_extra
def test_runs_in_different_execution_modes_break_the_identity_contract(tiny, tmp_path):
    from alibi.governance.identity import IdentityViolation, require_identity
    from alibi.tokens import greedy

    for mode in (True, False):
        greedy.run_greedy_arm(tiny / "w8a8", tiny / "set", tmp_path / str(mode), kernel=KERNEL, prompt_tokens=8,
                              new_tokens=2, windows=1, deterministic=mode)
    manifest = json.loads((tmp_path / "False" / "manifest.json").read_text())
    assert manifest["predicate"]["parameters"]["execution"]["attention"] == "sdpa"
    with pytest.raises(IdentityViolation, match="execution"):
        require_identity(tmp_path / "True", tmp_path / "False", ("none",))


@pytest.mark.parametrize("option, value", [("--batch-sizes", "2,100000"), ("--repeats", "1000000")])
def test_an_absurd_batch_or_repeat_count_is_refused_before_any_model_loads(tmp_path, capsys, option, value):
    """A batch may exceed the windows (its rows are filled by repeating them), so only a limit bounds it."""
    from alibi.cli import main

    code = main(["variations", "--model", str(tmp_path / "no-model"), "--prompts", "experiments/prompts/wikipedia-8x512",
                 "--windows", "2", option, value, "--out", str(tmp_path / "v")])
    err = capsys.readouterr().err
    assert code == 2 and option in err and "over the limit" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "v").exists()


@needs_model_extra
def test_variations_overwrite_refuses_a_folder_holding_a_file_the_user_added(tiny, tmp_path, capsys):
    """Issue 36 #2. Guards: `--overwrite` replaced an earlier variations folder whole (its manifest was of
    kind replay), deleting the file the user had added to it."""
    from alibi.cli import main

    out = tmp_path / "v"
    argv = ["variations", "--model", str(tiny / "w8a8"), "--kernel", KERNEL, "--prompts", str(tiny / "set"),
            "--windows", "2", "--context", "8", "--positions", "4", "--batch-sizes", "2", "--chunk", "4",
            "--no-restart", "--quiet", "--out", str(out)]
    assert main(argv) in (0, 1)
    (out / "mine.txt").write_text("notes")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert main([*argv, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "holds 'mine.txt', which alibi did not write" in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v"]


@pytest.mark.gpu
@needs_model_extra
def test_the_deterministic_runner_passes_every_default_variation_on_cuda_with_the_triton_kernel(tiny):
    """The default protocol on CUDA: batches of 2, 4 and 64 (prompt 0 at rows 0, 31, 63), the 64 three times."""
    from alibi.model.runner import load_model
    from alibi.tokens.variations import certify_variations

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    lm = load_model(tiny / "w8a8", "triton", "cuda")
    assert lm.execution.cublas_workspace is not None and lm.execution.attention == "alibi_invariant:triton-rows"
    results = certify_variations(lm, _ids(), (0, 1, 2, 3), 12, chunk=5)
    assert all(r.holds for r in results), [(r.name, r.first_divergence) for r in results if not r.holds]
    large = next(r for r in results if r.name == "batch-size-64")
    assert large.needle_rows == (0, 31, 63) and large.positions_compared == 64 * 8
