"""`alibi sweep depth|rows` and `alibi analyze depth` from the command line: outputs, manifests, refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from alibi.cli import main
from alibi.governance.manifest import read_manifest, verify_files
from alibi.sweep.analysis import DepthAnalysis
from alibi.sweep.records import read_depth_sweep, read_rows_sweep

DEPTH = ["sweep", "depth", "--kernel-a", "torch-cpu", "--kernel-b", "emulator:a_then_w", "--format", "int8",
         "--M", "32", "--N", "64", "--seeds", "2", "--K", "64,128,256", "--nested-prefix", "--quiet"]


def _refused(capsys, argv, message, out, code=2):
    assert main(argv + ["--out", str(out)]) == code
    err = capsys.readouterr().err.strip()
    assert message in err, err
    assert len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("change, message", [
    ({"--K": "256,128,512"}, "with --nested-prefix the K list must be strictly increasing"),
    ({"--K": "64,64,128"}, "with --nested-prefix the K list must be strictly increasing"),
    ({"--K": "512,132105"}, "K=132105 exceeds the int32 bound for int8"),
    ({"--K": "64,x"}, "--K '64,x': expected comma-separated integers"),
    ({"--M": "0"}, "--M must be a positive integer, got 0"),
    ({"--N": "-4"}, "--N must be a positive integer, got -4"),
    ({"--seeds": "0"}, "--seeds must be a positive count of seeds, got 0"),
    ({"--kernel-b": "nonesuch"}, "unknown kernel 'nonesuch'"),
    ({"--kernel-a": "triton-fp8"}, "--kernel-a 'triton-fp8' handles fp8_e4m3 operands, not int8"),
    ({"--fp8-scales": "row"}, "--fp8-scales applies to --format fp8_e4m3 only"),
    ({"--near-zero": "0"}, "--near-zero 0.0"),
])
def test_sweep_depth_refuses_bad_input_with_one_line_exit_2_and_nothing_written(capsys, tmp_path, change, message):
    argv = list(DEPTH)
    for flag, value in change.items():
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    _refused(capsys, argv, message, tmp_path / "out")


def test_sweep_depth_refuses_an_int8_kernel_for_fp8_and_k_beyond_the_exact_fp8_reference(capsys, tmp_path):
    fp8 = ["sweep", "depth", "--kernel-a", "emulator:w_then_a", "--kernel-b", "fp8-sequential:w_then_a",
           "--format", "fp8_e4m3", "--K", "64", "--quiet"]
    _refused(capsys, fp8, "--kernel-a 'emulator:w_then_a' handles int8 operands, not fp8_e4m3", tmp_path / "a")
    fp8[3] = "fp8-sequential:a_then_w"
    fp8[fp8.index("--K") + 1] = "65537"
    _refused(capsys, fp8, "K=65537 exceeds 65536", tmp_path / "b")


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the cutlass kernel may be available")
def test_sweep_depth_with_an_unavailable_kernel_exits_3_and_writes_nothing(capsys, tmp_path):
    argv = list(DEPTH)
    argv[argv.index("--kernel-a") + 1] = "cutlass"
    _refused(capsys, argv, "kernel 'cutlass' is not available here", tmp_path / "out", code=3)


@pytest.mark.parametrize("change, message", [
    ({"--M": "0,4"}, "--M must list positive integers"),
    ({"--elements": "0"}, "--elements must be a positive number"),
    ({"--elements": "2.5"}, "--elements '2.5': expected a whole number"),
    ({"--kernel-b": "fp8-sequential:a_then_w"}, "handles fp8_e4m3 operands, not int8"),
])
def test_sweep_rows_refuses_bad_input(capsys, tmp_path, change, message):
    argv = ["sweep", "rows", "--kernel-a", "torch-cpu", "--kernel-b", "emulator:a_then_w", "--K", "32", "--N", "64",
            "--elements", "1000", "--quiet"]
    for flag, value in change.items():
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    _refused(capsys, argv, message, tmp_path / "out")


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweeps")
    assert main(DEPTH + ["--out", str(root / "int8")]) == 0
    assert main(["sweep", "rows", "--kernel-a", "torch-cpu", "--kernel-b", "emulator:a_then_w", "--M", "1,8",
                 "--K", "32", "--N", "512", "--elements", "40000", "--rows-per-block", "16", "--quiet",
                 "--out", str(root / "rows")]) == 0
    foreign = root / "paper.csv"
    foreign.write_text("seed,K,frac_differ\n" + "".join(
        f"{s},{k},{(1 - 2.718281828 ** (-0.0035 * k ** 0.52)) * (1 + 0.01 * (s - 1)):.6f}\n"
        for s in range(3) for k in (512, 1024, 2048, 4096, 8192, 16384, 32768)))
    return root


def test_sweep_folders_hold_json_csv_and_a_verified_manifest(sweeps):
    for name, reader in (("int8", read_depth_sweep), ("rows", read_rows_sweep)):
        folder = sweeps / name
        assert verify_files(folder) == []
        manifest = read_manifest(folder)
        assert manifest.kind == f"{'depth' if name == 'int8' else 'rows'}-sweep"
        assert set(manifest.predicate["arms"]) == {"a", "b"}
        assert manifest.predicate["arms"]["a"]["kernel"] == "torch-cpu"
        assert manifest.predicate["environment"]["cpu"] is not None
        reader(folder)  # the typed reader accepts what the command wrote
    depth = read_depth_sweep(sweeps / "int8")
    assert depth.nested_prefix and depth.Ks == (64, 128, 256) and len(depth.records) == 6
    assert (sweeps / "int8" / "depth.csv").read_text().splitlines()[0].startswith("seed,K,n,n_differing,frac_differ")


def test_analyze_depth_fits_several_sweeps_and_draws_both_figures(sweeps, tmp_path):
    out = tmp_path / "fits"
    assert main(["analyze", "depth", str(sweeps / "int8"), str(sweeps / "paper.csv"), "--rows", str(sweeps / "rows"),
                 "--bootstrap", "50", "--quiet", "--out", str(out)]) == 0
    analysis = DepthAnalysis.from_json((out / "fits.json").read_text(), "fits.json")
    assert [a.label for a in analysis.analyses] == ["INT8 torch-cpu vs emulator:a_then_w", "paper"]
    paper = analysis.analyses[1]
    assert paper.status == "ok" and paper.selected == "gen_saturation" and paper.counts is None
    assert abs(paper.stability.alpha - 0.52) < 0.02
    assert analysis.rows is not None and [p.M for p in analysis.rows.points] == [1, 8]
    md = (out / "fits.md").read_text()
    assert "compatible with" in md and " law" not in md.lower()
    assert (out / "depth.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (out / "rows.svg").read_text().startswith("<?xml")
    assert verify_files(out) == []
    assert read_manifest(out).predicate["parameters"]["bootstrap"] == 50


def test_analyze_depth_output_is_byte_identical_on_a_rerun_apart_from_the_manifest_time(sweeps, tmp_path):
    argv = ["analyze", "depth", str(sweeps / "paper.csv"), "--bootstrap", "20", "--quiet", "--out"]
    assert main(argv + [str(tmp_path / "one")]) == 0
    assert main(argv + [str(tmp_path / "two")]) == 0
    for name in ("fits.json", "fits.md", "depth.svg"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name


def test_analyze_depth_refuses_a_malformed_csv_with_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("seed,K,frac\n0,512,0.1\n")
    _refused(capsys, ["analyze", "depth", str(bad)], "header lacks column(s) frac_differ", tmp_path / "fits")


def test_analyze_depth_refuses_an_output_inside_its_input_and_a_missing_input(capsys, sweeps, tmp_path):
    _refused(capsys, ["analyze", "depth", str(sweeps / "int8")], "--out overlaps SWEEP", sweeps / "int8" / "fits")
    _refused(capsys, ["analyze", "depth", str(tmp_path / "nope.csv")], "no such file or folder", tmp_path / "f")


@pytest.mark.parametrize(("name", "option"), [("int8", None), ("rows", "--rows")])
def test_analyze_depth_refuses_a_sweep_changed_after_it_was_written(capsys, sweeps, tmp_path, name, option):
    """Issue 36 #1: a sweep whose JSON fails its manifest is refused by name; the untouched one is read."""
    copy = Path(shutil.copytree(sweeps / name, tmp_path / name))
    argv = ["analyze", "depth", *([str(sweeps / "paper.csv"), option, str(copy)] if option else [str(copy)]),
            "--bootstrap", "20", "--quiet", "--out"]
    assert main([*argv, str(tmp_path / "untouched")]) == 0
    data = copy / f"{'depth' if name == 'int8' else 'rows'}.json"
    data.write_bytes(data.read_bytes() + b" ")  # one byte more, the document unchanged: the manifest still tells
    _refused(capsys, [*argv[:-1]], f"{data}: fails its manifest", tmp_path / "fits")


def test_analyze_depth_of_all_zero_data_writes_a_status_not_nan(tmp_path):
    csv = tmp_path / "zeros.csv"
    csv.write_text("seed,K,frac_differ,n,n_differing\n" + "".join(
        f"{s},{k},0,1000,0\n" for s in range(2) for k in (512, 1024, 2048)))
    assert main(["analyze", "depth", str(csv), "--quiet", "--out", str(tmp_path / "f")]) == 0
    text = (tmp_path / "f" / "fits.json").read_text()
    assert json.loads(text)["analyses"][0]["status"] == "all-zero"
    assert "NaN" not in text and "Infinity" not in text


PROGRESS_LINE = r"\[(\d+)/(\d+)\] .* \(\d+\.\d s\)"


def _masked(text: str, *folders) -> str:
    """Text with the run's folder and its wall-clock seconds masked: what must not depend on progress."""
    import re

    for folder in folders:
        text = text.replace(str(folder), "OUT")
    return re.sub(r"\d+\.\d+ s\b|\d+\.\d+%", "#", text)


@pytest.mark.parametrize("argv, what, units, label", [
    (DEPTH[:-1], "depth", 2, "seed {}: K 64…256, fraction differing "),
    (["sweep", "rows", "--kernel-a", "torch-cpu", "--kernel-b", "emulator:a_then_w", "--M", "1,8", "--K", "32",
      "--N", "64", "--elements", "2000", "--rows-per-block", "16"], "rows", 2, "M={}: "),
], ids=["depth", "rows"])
def test_sweep_progress_lines_go_to_stderr_one_per_unit_and_leave_stdout_and_results_unchanged(
        capsys, tmp_path, monkeypatch, argv, what, units, label):
    import re

    import pandas as pd

    monkeypatch.setenv("ALIBI_PROGRESS", "lines")
    assert main(argv + ["--quiet", "--out", str(tmp_path / "quiet")]) == 0
    quiet = capsys.readouterr()
    assert quiet.err == ""
    assert main(argv + ["--out", str(tmp_path / "loud")]) == 0
    loud = capsys.readouterr()
    err = loud.err.splitlines()
    assert err[0].startswith(f"alibi sweep {what}: torch-cpu vs emulator:a_then_w, int8, ")
    assert [tuple(map(int, re.fullmatch(PROGRESS_LINE, line).groups())) for line in err[1:]] == \
        [(i, units) for i in range(1, units + 1)]
    unit_names = ("0", "1") if what == "depth" else ("1", "8")
    assert [line.split("] ", 1)[1].startswith(label.format(u)) for line, u in zip(err[1:], unit_names)] == \
        [True] * units
    assert not re.search(r"^\[\d+/\d+\]", loud.out, re.MULTILINE)
    assert _masked(loud.out, tmp_path / "loud") == _masked(quiet.out, tmp_path / "quiet")
    # the results, less the measured seconds, are those of the quiet run, and hold no progress text
    a, b = pd.read_csv(tmp_path / "loud" / f"{what}.csv"), pd.read_csv(tmp_path / "quiet" / f"{what}.csv")
    timing = [c for c in a.columns if c.startswith("seconds")]
    pd.testing.assert_frame_equal(a.drop(columns=timing), b.drop(columns=timing))
    assert not any(f"[1/{units}]" in f.read_text() for f in (tmp_path / "loud").iterdir())
