"""What a variation's numbers and a pass of `alibi variations` / `alibi locate` rest on (issue 36, item 6).

- `positions_identical` counts the compared (prompt, position) logit rows that are bitwise equal: checked against a
  count made here, row by row on the logits themselves (not through the digests `compare` uses), on a variation
  that fails at some positions only.
- A pass means *both* that every compared logit row is bitwise equal *and* that every traced module output is: two
  executions whose logits agree while a module inside differs do not hold (`variations`) and are not identical
  (`locate`), and the module is named. The planted difference is in the last layer's MLP at a context position: the
  MLP is position-wise and no later layer reads that position, so no scored logit row can see it.
"""

from __future__ import annotations

import pytest
import torch
from tokens.conftest import needs_model_extra

from alibi.exact.numerics import bits

KERNEL = "emulator:a_then_w"
LAST_MLP = "model.layers.1.mlp.act_fn"  # the tiny Llama has two layers
CONTEXT, FED, WINDOWS = 12, 18, (0, 1, 2, 3)


def _ids() -> torch.Tensor:
    return torch.randint(3, 300, (len(WINDOWS), FED), generator=torch.Generator().manual_seed(0))


class PerturbDecodeSteps:
    """Adds one to the last MLP's activations of batch row 0 at the decode steps `steps` (0 = the first step
    after each prefill): the logit rows of those positions of that row's prompts change, no other."""

    def __init__(self, steps: set[int]):
        self.steps, self.step = steps, -1

    def __call__(self, module, inputs, output):
        if output.shape[1] > 1:  # a prefill: the decode steps of a new batch follow
            self.step = -1
            return output
        self.step += 1
        if self.step not in self.steps:
            return output
        out = output.clone()
        out[0] += 1
        return out


def perturb_position_zero_in_prefill(module, inputs, output):
    """Adds one to the last MLP's activations at position 0 of every prefill: a context position, whose change no
    scored logit row sees."""
    if output.shape[1] == 1:
        return output
    out = output.clone()
    out[:, 0] += 1
    return out


def _hooked(lm, hook):
    return lm.model.get_submodule(LAST_MLP).register_forward_hook(hook)


@pytest.fixture(scope="module")
def lm(tiny):
    from alibi.model.runner import load_model

    return load_model(tiny / "w8a8", KERNEL)


@needs_model_extra
def test_a_variation_failing_at_some_positions_only_counts_exactly_the_rows_whose_logits_are_bitwise_equal(lm):
    from alibi.tokens.variations import compare, run_execution

    ids, batch = _ids(), 2
    clean = run_execution(lm, ids, WINDOWS, "decode", CONTEXT, batch=batch)
    handle = _hooked(lm, PerturbDecodeSteps({1, 3}))
    try:
        perturbed = run_execution(lm, ids, WINDOWS, "decode", CONTEXT, batch=batch)
    finally:
        handle.remove()
    result = compare("planted", "decode steps 1 and 3 of batch row 0 perturbed", clean, perturbed)

    # the independent count: the same schedule run here, every scored row compared bit for bit on the logits
    identical = compared = 0
    for start in range(0, len(WINDOWS), batch):
        rows = ids[start:start + batch]
        chunks = [CONTEXT] + [1] * (FED - CONTEXT)
        a = lm.chunked_logits(rows, chunks)
        handle = _hooked(lm, PerturbDecodeSteps({1, 3}))
        try:
            b = lm.chunked_logits(rows, chunks)
        finally:
            handle.remove()
        for r in range(rows.shape[0]):
            for t in range(CONTEXT, FED):
                compared += 1
                identical += torch.equal(bits(a[r, t]), bits(b[r, t]))
    assert compared == len(WINDOWS) * (FED - CONTEXT) == result.positions_compared
    assert 0 < identical < compared  # fails at some positions only: 2 prompts × 2 steps
    assert result.positions_identical == identical == compared - 4
    assert not result.holds and result.kernel_variant is False
    d = result.first_divergence
    assert (d["prompt"], d["position"], d["module"]) == (0, CONTEXT + 1, LAST_MLP)


@needs_model_extra
def test_executions_whose_logits_agree_while_a_module_inside_differs_do_not_hold_and_name_the_module(lm):
    from alibi.tokens.variations import compare, run_execution

    ids = _ids()
    clean = run_execution(lm, ids, WINDOWS, "decode", CONTEXT, batch=2)
    handle = _hooked(lm, perturb_position_zero_in_prefill)
    try:
        perturbed = run_execution(lm, ids, WINDOWS, "decode", CONTEXT, batch=2)
    finally:
        handle.remove()
    result = compare("inside", "a context position of the last MLP perturbed", clean, perturbed)
    assert result.positions_identical == result.positions_compared == len(WINDOWS) * (FED - CONTEXT)  # logits agree
    assert not result.holds  # a pass certifies every traced module too
    assert result.first_divergence["module"] == LAST_MLP and result.first_divergence["position"] == 0
    assert compare("same", "the same execution twice", clean, run_execution(lm, ids, WINDOWS, "decode", CONTEXT,
                                                                             batch=2)).holds


@needs_model_extra
def test_locate_calls_runs_whose_logits_and_tokens_agree_but_a_module_differs_not_identical(tiny, tmp_path,
                                                                                            monkeypatch, capsys):
    from alibi.cli import main
    from alibi.tokens import greedy
    from alibi.tokens.locate import locate

    greedy.run_greedy_arm(tiny / "w8a8", tiny / "set", tmp_path / "a", kernel=KERNEL, prompt_tokens=10, new_tokens=6,
                          batch_size=3, trace=True)
    real_load = greedy.load_model

    def perturbed(*args, **kwargs):
        lm = real_load(*args, **kwargs)
        _hooked(lm, perturb_position_zero_in_prefill)
        return lm

    monkeypatch.setattr(greedy, "load_model", perturbed)
    greedy.run_greedy_arm(tiny / "w8a8", tiny / "set", tmp_path / "b", kernel=KERNEL, prompt_tokens=10, new_tokens=6,
                          batch_size=3, trace=True)
    r = locate(tmp_path / "a", tmp_path / "b")
    assert r.identical_sequences == r.prompts_compared == 3
    assert r.logit_rows_identical == r.logit_rows_compared == 3 * 6
    assert not r.identical
    assert r.first_divergence["module"] == LAST_MLP and r.first_divergence["position"] == 0
    assert main(["locate", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    assert "first diverging: prompt" in capsys.readouterr().out
