"""`alibi bench runner`: the runner timed per execution mode and decoding, with graph decoding checked against eager."""

from __future__ import annotations

import importlib.util

import pytest

from alibi.cli import main
from alibi.model.runner_bench import RunnerBench

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="needs transformers (pip install 'integer-alibi[model]')")


def test_bench_runner_times_both_modes_and_says_why_graphs_did_not_run_on_the_cpu(tiny_w8a8, tmp_path, capsys):
    out = tmp_path / "runner.json"
    assert main(["bench", "runner", "--model", str(tiny_w8a8), "--kernel", "emulator:w_then_a", "--batch", "2",
                 "--prompt-tokens", "6", "--new-tokens", "3", "--repeats", "1", "--quiet", "--out", str(out)]) == 0
    result = RunnerBench.from_json(out.read_text())
    assert [m.mode for m in result.modes] == ["deterministic", "native"]
    assert [m.execution["deterministic"] for m in result.modes] == [True, False]
    for m in result.modes:
        assert [(t.decode, t.phase) for t in m.timings] == [("eager", "prefill"), ("eager", "decode")]
        assert m.graphs_speedup is None and m.identical_to_eager is None
        assert m.graphs_not_run == "CUDA graphs need a CUDA device; the model runs on cpu"
        assert all(t.launches_per_step is None for t in m.timings)  # no CUDA launches to count
    assert (result.kernel, result.device, result.batch, result.l2_bytes) == ("emulator:w_then_a", "cpu", 2, None)
    assert result.weight_bytes > 0
    printed = capsys.readouterr().out
    assert "deterministic: CUDA graphs not run: CUDA graphs need a CUDA device" in printed


@pytest.mark.parametrize("flag,value", [("--new-tokens", "1"), ("--batch", "0"), ("--modes", "fast")])
def test_bench_runner_refuses_bad_sizes_before_loading_anything(tiny_w8a8, tmp_path, capsys, flag, value):
    out = tmp_path / "runner.json"
    assert main(["bench", "runner", "--model", str(tiny_w8a8), "--kernel", "emulator:w_then_a", flag, value,
                 "--quiet", "--out", str(out)]) == 2
    assert flag in capsys.readouterr().err and not out.exists()


def test_a_prompt_set_of_another_vocabulary_is_refused_in_one_line(tiny_w8a8, tmp_path, capsys):
    out = tmp_path / "runner.json"
    assert main(["bench", "runner", "--model", str(tiny_w8a8), "--kernel", "emulator:w_then_a", "--prompts",
                 "experiments/prompts/wikipedia-8x512", "--batch", "2", "--prompt-tokens", "4", "--new-tokens", "2",
                 "--quiet", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "beyond the model's vocabulary of 320" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.gpu
def test_bench_runner_on_the_gpu_times_graph_decoding_that_gives_eagers_bits(tiny_w8a8, tmp_path):
    out = tmp_path / "runner.json"
    assert main(["bench", "runner", "--model", str(tiny_w8a8), "--kernel", "triton", "--batch", "8",
                 "--prompt-tokens", "16", "--new-tokens", "8", "--repeats", "2", "--quiet", "--out", str(out)]) == 0
    result = RunnerBench.from_json(out.read_text())
    for m in result.modes:
        assert [(t.decode, t.phase) for t in m.timings] == [("eager", "prefill"), ("eager", "decode"),
                                                            ("cuda-graphs", "decode")]
        assert m.graphs_not_run is None and m.graphs_speedup > 0 and m.execution["decode"] == "cuda-graphs"
        eager, graphs = m.timings[1].launches_per_step, m.timings[2].launches_per_step
        assert graphs < eager / 4  # a replay is one launch; the argmax and the input copies stay eager
    assert result.modes[0].identical_to_eager is True
    assert result.l2_bytes > 0
