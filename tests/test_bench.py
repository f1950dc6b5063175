"""`alibi bench`: every requested kernel appears in the report — measured, or unavailable with a reason."""

from __future__ import annotations

import json

import pytest

from alibi.bench import INT_MM, default_cases
from alibi.cli import main


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
