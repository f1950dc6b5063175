"""`alibi bench conform`: the wall of plain runs, the staged runs' wall split by stage, the same results on every check
device."""

from __future__ import annotations

import json

import pytest
import torch

from alibi.cli import main
from alibi.conform.bench import ConformBench, bench_conform, covered_seconds, format_table
from alibi.conform.pipeline import Pair, StageTimer, run_conformance, source_from_preset
from alibi.io.typed import to_plain
from alibi.kernels.registry import get_kernel


def test_the_stage_split_adds_up_to_no_more_than_the_staged_wall_and_every_stage_ran():
    pair = Pair(get_kernel("torch-cpu"), get_kernel("emulator:a_then_w"), "bench test")
    result = bench_conform(pair, source_from_preset("smollm2-135m-bias", rows=8), devices=["cpu"], repeats=2)
    (t,) = result.timings
    assert set(t.stage_seconds) == set(StageTimer.STAGES) and all(v > 0 for v in t.stage_seconds.values())
    assert sum(t.stage_seconds.values()) <= t.staged.seconds * 1.05  # the stages are parts of the run
    assert t.warmup_seconds > 0
    for w in (t.wall, t.staged):
        assert w.spread[0] <= w.seconds <= w.spread[1]
        assert w.elements_per_s == pytest.approx(result.output_elements / w.seconds)
    tiles = source_from_preset("smollm2-135m-bias", rows=8).tiles
    assert result.units == 2 * len(tiles) and result.output_elements == 2 * sum(t.M * t.N for t in tiles)
    assert result.identical_results and result.verdict == "pass"
    assert t.device_busy_seconds is None and t.device_busy is None  # no separate device on the CPU


def test_timing_the_pipeline_does_not_change_its_report():
    pair = Pair(get_kernel("torch-cpu"), get_kernel("emulator:a_then_w"), "bench test")
    source = source_from_preset("tiny")
    plain = run_conformance(pair, source, created_at=None)
    timed = run_conformance(pair, source, created_at=None, timer=StageTimer())
    assert timed.to_json() == plain.to_json()


V1_TIMING = {"check_device": "cuda", "reference_path": "fp64 GEMM on the GPU", "repeats": 3,
             "stage_seconds": {"kernels": 0.02, "reference": 0.006, "checks": 0.03, "io": 0.01},
             "total_seconds": 0.066, "total_spread": [0.065, 0.07], "elements_per_s": 317.7e6}


def test_a_v1_result_reads_with_its_single_timing_as_the_staged_wall_and_no_plain_wall_and_writes_back_as_v1():
    result = bench_conform(Pair(get_kernel("torch-cpu"), get_kernel("emulator:a_then_w"), "bench test"),
                           source_from_preset("tiny"), devices=["cpu"], repeats=1)
    doc = {**json.loads(result.to_json()), "schema": "alibi.bench-conform/v1", "timings": [V1_TIMING]}
    old = ConformBench.from_json(json.dumps(doc, indent=2) + "\n")
    (t,) = old.timings
    assert old.schema == "alibi.bench-conform/v1" and t.wall is None and t.warmup_seconds is None
    assert (t.staged.seconds, t.staged.spread, t.staged.elements_per_s) == (0.066, (0.065, 0.07), 317.7e6)
    assert json.loads(old.to_json())["timings"] == [V1_TIMING]
    assert "–" in format_table(old)  # no plain wall to show


def test_the_cli_writes_a_result_that_reads_back_and_refuses_cuda_without_a_gpu(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "conform", "--kernel-a", "torch-cpu", "--kernel-b", "emulator:a_then_w", "--synthetic",
                 "tiny", "--repeats", "1", "--check-devices", "cpu", "--quiet", "--out", str(out)]) == 0
    result = ConformBench.from_json(out.read_text())
    assert result.kernel_a == "torch-cpu" and result.timings[0].check_device == "cpu"
    assert "M elem/s" in capsys.readouterr().out
    import torch

    if not torch.cuda.is_available():
        again = tmp_path / "c.json"
        assert main(["bench", "conform", "--kernel-a", "torch-cpu", "--kernel-b", "emulator:a_then_w",
                     "--synthetic", "tiny", "--check-devices", "cuda", "--out", str(again)]) == 3
        assert not again.exists()


@pytest.mark.parametrize("flag, value", [("--repeats", "0"), ("--check-devices", "tpu")])
def test_bad_flags_are_refused_with_exit_2_and_nothing_written(tmp_path, flag, value):
    out = tmp_path / "b.json"
    assert main(["bench", "conform", "--synthetic", "tiny", flag, value, "--out", str(out)]) == 2
    assert not out.exists()


def test_device_spans_count_once_where_they_overlap_and_gaps_do_not_count():
    # microseconds: [0, 10] and [5, 20] overlap (20 covered), [30, 31] apart, [31, 35] touching it, [32, 33] inside
    assert covered_seconds([(30, 31), (0, 10), (5, 20), (31, 35), (32, 33)]) == pytest.approx(25e-6)
    assert covered_seconds([]) == 0.0


def test_a_cpu_result_has_no_gpu_busy_field_reads_back_with_none_and_shows_a_dash():
    result = bench_conform(Pair(get_kernel("torch-cpu"), get_kernel("emulator:a_then_w"), "bench test"),
                           source_from_preset("tiny"), devices=["cpu"], repeats=1)
    doc = json.loads(result.to_json())
    assert "device_busy_seconds" not in doc["timings"][0]  # as in the v2 results written before it was measured
    back = ConformBench.from_json(result.to_json())
    assert back == result and back.timings[0].device_busy_seconds is None
    assert format_table(result).splitlines()[2].endswith("–")


@pytest.mark.gpu
def test_on_the_gpu_the_busy_share_of_a_host_bound_run_is_measured_and_below_one():
    result = bench_conform(Pair(get_kernel("cublas"), get_kernel("triton"), "bench test"), source_from_preset("tiny"),
                           devices=["cuda"], repeats=1)
    (t,) = result.timings
    assert 0 < t.device_busy < 1  # the tiny preset's launches hold the host far longer than the GPU
    assert "%" in format_table(result)


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["tiny", "smollm2-135m-bias"])
def test_on_the_gpu_a_run_checked_on_the_device_gives_the_results_of_one_checked_on_the_cpu(preset):
    """The judge queued on the GPU with the next batch prepared alongside gives every unit's numbers of the CPU
    path: the same report results, unit by unit."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pair = Pair(get_kernel("cutlass"), get_kernel("triton"), "bench test")
    source = source_from_preset(preset)
    on_gpu = run_conformance(pair, source, device="cuda", created_at=None)
    on_cpu = run_conformance(pair, source, device="cpu", created_at=None)
    assert json.dumps(to_plain(on_gpu.units())) == json.dumps(to_plain(on_cpu.units()))
    assert on_gpu.verdict == on_cpu.verdict


def test_a_result_of_replayed_launches_says_so_and_one_without_keeps_the_earlier_layout(tmp_path, capsys):
    out = tmp_path / "g.json"
    assert main(["bench", "conform", "--kernel-a", "torch-cpu", "--kernel-b", "emulator:a_then_w", "--synthetic",
                 "tiny", "--repeats", "1", "--check-devices", "cpu", "--quiet", "--out", str(out)]) == 0  # the default
    assert json.loads(out.read_text())["cuda_graphs"] is True
    assert ConformBench.from_json(out.read_text()).cuda_graphs is True
    assert "launches replayed from CUDA graphs" in capsys.readouterr().out
    plain = bench_conform(Pair(get_kernel("torch-cpu"), get_kernel("emulator:a_then_w"), "bench test"),
                          source_from_preset("tiny"), devices=["cpu"], repeats=1, graphs=False)
    assert "cuda_graphs" not in json.loads(plain.to_json())  # as every result written before the option
    assert ConformBench.from_json(plain.to_json()).cuda_graphs is False
