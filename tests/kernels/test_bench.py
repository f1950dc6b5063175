"""`alibi bench`: every requested kernel appears in the report — measured, or unavailable with a reason."""

from __future__ import annotations

import json

import pytest

from alibi.cli import main
from alibi.kernels.bench import INT_MM, default_cases


def test_default_cases_are_the_issue_shapes():
    shapes = [(c.M, c.N, c.K) for c in default_cases("int8")]
    assert shapes == [(1, 4096, 4096), (16, 4096, 4096), (128, 4096, 4096), (512, 4096, 4096),
                      (4096, 4096, 4096), (4096, 8192, 8192)]


@pytest.mark.parametrize("argv,message", [
    (["--shape", "16,64"], "three integers"),
    (["--shape", "0,64,64"], "positive"),
    (["--int8", "no-such-kernel"], "unknown kernel"),
    (["--rep-ms", "0"], "--rep-ms"),
])
def test_bench_bad_arguments_exit_2_and_write_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "bench.json"
    assert main(["bench", *argv, "--out", str(out), "--quiet"]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.gpu
def test_bench_on_a_gpu_measures_tops_and_ratios_in_one_process(tmp_path):
    out = tmp_path / "bench.json"
    rc = main(["bench", "--shape", "256,1024,1024", "--int8", "cutlass,cublas", "--fp8", "cublaslt-fp8",
               "--rep-ms", "20", "--out", str(out), "--quiet"])
    assert rc == 0
    rows = {(r["fmt"], r["kernel"]): r for r in json.loads(out.read_text())["results"]}
    assert rows[("int8", INT_MM)]["status"] == "ok" and rows[("int8", INT_MM)]["ratios"][INT_MM] == 1.0
    for key in [("int8", "cublas"), ("fp8_e4m3", "cublaslt-fp8")]:
        assert rows[key]["status"] == "ok" and rows[key]["tops"] > 0
    cutlass = rows[("int8", "cutlass")]
    assert cutlass["status"] in ("ok", "unavailable")
    if cutlass["status"] == "ok":
        assert cutlass["tops"] > 0 and set(cutlass["ratios"]) == {INT_MM, "cublas"}


# --- the measuring structure, on the CPU (issue 16: padding-free baseline, both timings, L2, spread) ---

def test_the_int_mm_baseline_pads_once_before_timing_and_still_gives_the_exact_accumulator(monkeypatch):
    """Guards: at M ≤ 16 the baseline's timed call included a padding kernel (F.pad inside int_mm_padded)."""
    import torch

    from alibi.exact.emulator import exact_accumulator
    from alibi.kernels.bench import prepare_int_mm

    g = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (3, 37), dtype=torch.int8, generator=g)  # M ≤ 16, K and N not multiples of 8
    w = torch.randint(-128, 128, (21, 37), dtype=torch.int8, generator=g)
    fn, detail = prepare_int_mm(a, w)
    assert (detail["pad_m"], detail["pad_k"], detail["pad_n"]) == (14, 3, 3)

    def no_padding_while_timed(*args, **kwargs):
        raise AssertionError("a padding kernel inside the timed call")

    monkeypatch.setattr(torch.nn.functional, "pad", no_padding_while_timed)
    acc = fn()
    assert acc.shape == (17, 24) and torch.equal(acc[:3, :21].to(torch.int64), exact_accumulator(a, w))
    assert not bool(acc[3:].any()) and not bool(acc[:, 21:].any())  # zero padding adds nothing


def test_cold_l2_rotates_over_copies_holding_at_least_twice_the_l2():
    from alibi.kernels.bench import rotation_count

    MiB = 2**20
    assert rotation_count(16 * MiB, 60 * MiB, "warm") == 1
    n = rotation_count(16 * MiB + 40_000, 60 * MiB, "cold")
    assert n == 8 and n * (16 * MiB + 40_000) >= 2 * 60 * MiB > (n - 1) * (16 * MiB + 40_000)
    assert rotation_count(200 * MiB, 60 * MiB, "cold") == 2  # never fewer than two copies
    with pytest.raises(ValueError, match="l2 mode"):
        rotation_count(1, 1, "lukewarm")


def test_rounds_are_interleaved_in_a_rotated_order_and_the_rotation_calls_each_copy_once():
    from alibi.kernels.bench import interleaved, rotating

    order = []
    rounds = interleaved({"a": None, "b": None, "c": None}, 3, lambda name, fn: order.append(name) or len(order))
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert rounds == {"a": [1, 6, 8], "b": [2, 4, 9], "c": [3, 5, 7]}
    seen = []
    rotating(lambda c: seen.append(c["i"]), [{"i": 0}, {"i": 1}, {"i": 2}])()
    assert seen == [0, 1, 2]


def test_the_median_and_spread_of_rounds():
    from alibi.kernels.bench import median_and_spread

    assert median_and_spread([3.0, 1.0, 2.0]) == (2.0, (1.0, 3.0))
    assert median_and_spread([4.0, 1.0, 2.0, 3.0]) == (2.5, (1.0, 4.0))
    assert median_and_spread([1.0, None]) == (None, None)  # a round that could not be captured


def test_without_cuda_every_kernel_is_listed_unavailable_in_every_l2_mode():
    import torch

    from alibi.kernels.bench import Case, format_table, run_bench

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    report = run_bench(["cublas"], [], [Case("int8", 16, 64, 64)])
    assert report["schema"] == "alibi.bench/2" and report["repeats"] == 3 and report["l2_modes"] == ["warm", "cold"]
    assert sorted((r["kernel"], r["l2"], r["status"]) for r in report["results"]) == [
        ("cublas", "cold", "unavailable"), ("cublas", "warm", "unavailable"),
        (INT_MM, "cold", "unavailable"), (INT_MM, "warm", "unavailable")]
    assert "graph TOPS" in format_table(report).splitlines()[0]


def test_the_table_shows_graph_and_eager_side_by_side_with_their_spread():
    from alibi.kernels.bench import format_table

    row = {"fmt": "int8", "M": 1, "N": 4096, "K": 4096, "l2": "cold", "kernel": "cutlass", "status": "ok",
           "reason": "", "graph_tops": 5.8, "eager_tops": 1.2, "ratios": {INT_MM: 2.14}, "graph_ms": 0.0058,
           "graph_ms_spread": [0.0057, 0.0061], "eager_ms": 0.028, "eager_ms_spread": [0.027, 0.031]}
    line = format_table({"results": [row]}).splitlines()[1]
    assert "cold" in line and "5.8" in line and "1.2" in line and "2.14" in line
    assert "5.8 (5.7-6.1)" in line and "28.0 (27.0-31.0)" in line


def test_the_measuring_loop_runs_on_cpu_kernels_with_a_fake_clock(monkeypatch):
    """The loop of `run_bench` end to end without a GPU: CPU kernels, the clock replaced by call
    counts (eager: 2 ms per timed call, graph: 1 ms), so the rows' arithmetic can be checked exactly."""
    import torch

    from alibi.kernels import bench

    calls = {"n": 0}

    def count(fn):
        calls["n"] += 1
        fn()

    monkeypatch.setattr(bench, "timer", lambda fn, rep_ms: count(fn) or 2.0)
    monkeypatch.setattr(bench, "graph_timer", lambda fn, rep_ms: count(fn) or 1.0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "l2_bytes", lambda: 4096)
    monkeypatch.setattr(bench, "environment", lambda: {"torch": torch.__version__})

    def cpu_operands(case, seed=0):
        g = torch.Generator().manual_seed(seed)
        return {"a_q": torch.randint(-127, 128, (case.M, case.K), dtype=torch.int8, generator=g),
                "s_a": torch.rand(case.M, generator=g) + 0.1,
                "w_q": torch.randint(-127, 128, (case.N, case.K), dtype=torch.int8, generator=g),
                "s_w": torch.rand(case.N, generator=g) + 0.1}

    monkeypatch.setattr(bench, "operands", cpu_operands)
    case = bench.Case("int8", 4, 24, 32)
    report = bench.run_bench(["torch-cpu", "emulator:w_then_a", "triton-fp8"], [], [case], repeats=3)
    rows = {(r["kernel"], r["l2"]): r for r in report["results"]}
    assert calls["n"] == 2 * 3 * 3 * 2  # (eager + graph) × 3 rounds × 3 timed kernels × 2 L2 modes
    assert rows[("triton-fp8", "warm")]["status"] == "unavailable"
    warm, cold = rows[("torch-cpu", "warm")], rows[("torch-cpu", "cold")]
    copies = cold["detail"]["l2_rotation"]["copies"]
    operand_bytes = 4 * 32 + 24 * 32 + 4 * 4 + 24 * 4
    assert copies == -(-2 * 4096 // operand_bytes) and "l2_rotation" not in warm["detail"]
    assert (warm["eager_ms"], warm["graph_ms"], warm["eager_ms_spread"]) == (2.0, 1.0, (2.0, 2.0))
    assert (cold["eager_ms"], cold["graph_ms"]) == (2.0 / copies, 1.0 / copies)  # per call, not per rotation
    assert warm["graph_tops"] == case.ops / 1e-3 / 1e12 and warm["eager_tops"] == case.ops / 2e-3 / 1e12
    assert warm["ratios"] == {INT_MM: 1.0} and warm["ratios_eager"] == {INT_MM: 1.0}
    assert rows[(INT_MM, "warm")]["detail"]["pad_m"] == 13


@pytest.mark.parametrize("flags, message", [(["--repeats", "0"], "--repeats must be at least 1"),
                                            (["--l2", "hot"], "--l2 'hot': expected warm, cold")])
def test_bench_refuses_bad_repeats_and_l2_modes_before_anything_runs(flags, message, capsys, tmp_path):
    from alibi.cli import main

    assert main(["bench", *flags, "--out", str(tmp_path / "b.json")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "b.json").exists()
