import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from exact_reference import BF16, FP32, round_nearest_even
from faulty_kernels import Reference, divergent_tile
from safetensors.torch import save_file

from alibi.cli import main
from alibi.errors import InputError
from alibi.governance.manifest import build_predicate, write_manifest
from alibi.kernels.base import Kernel
from alibi.kernels.registry import register
from alibi.tiles.tile import save_tile

EMU = ["--kernel-a", "emulator:w_then_a", "--kernel-b", "emulator:a_then_w"]


def write_foreign_tiles(folder, n=3):
    """Tiles written with the plain safetensors library, as another program would."""
    folder.mkdir()
    for i in range(n):
        t = divergent_tile(seed=i)
        save_file({"a_q": t.a_q, "s_a": t.s_a, "w_q": t.w_q, "s_w": t.s_w}, str(folder / f"layer{i}.safetensors"),
                  metadata={"name": f"layer{i}"})
    return folder


def _exact_differing(t) -> int:
    """How many outputs the two scale orders give differently, computed without alibi: integer dot
    products, then `RN_bf16(RN32(s_a·RN32(s_w·acc)))` against `RN_bf16(RN32(s_w·RN32(s_a·acc)))` in
    rational arithmetic (tests/exact_reference.py). Issue 16: this used to recompute the count with
    the very emulator models the two kernels under test are, comparing a function with itself."""
    a, w = t.a_q.numpy().astype(np.int64), t.w_q.numpy().astype(np.int64)
    acc = a @ w.T
    s_a, s_w = [Fraction(float(v)) for v in t.s_a], [Fraction(float(v)) for v in t.s_w]

    def rn32(x: Fraction) -> Fraction:
        return round_nearest_even(x, FP32)

    differing = 0
    for m in range(acc.shape[0]):
        for n in range(acc.shape[1]):
            x = rn32(Fraction(int(acc[m, n])))
            w_then_a = round_nearest_even(rn32(s_a[m] * rn32(s_w[n] * x)), BF16)
            a_then_w = round_nearest_even(rn32(s_w[n] * rn32(s_a[m] * x)), BF16)
            differing += w_then_a != a_then_w
    return differing


def test_emulator_orders_report_the_exact_number_of_differing_elements_per_tile(tmp_path):
    """report.json is schema `alibi.conform/v2` since issue 12 (typed results, predicted against observed);
    a unit keeps the v1 keys and the declared models' prediction equals the exact count too."""
    tiles = write_foreign_tiles(tmp_path / "tiles")
    assert main(["conform", *EMU, "--tiles", str(tiles), "--out", str(tmp_path / "r"), "--quiet"]) == 0
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["schema"] == "alibi.conform/v2" and report["verdict"] == "pass"
    for u in report["tiles"]:
        t = divergent_tile(seed=int(u["tile"].removeprefix("layer")))
        want = _exact_differing(t)
        assert u["n_differing"] == (want if u["regime"] == "real" else 0)
        assert u["n_predicted"] == u["n_differing"] and u["explained"] is True
        assert want > 0
        for key in ("tile", "regime", "M", "K", "N", "n_elements", "max_ulp", "bitwise_equal", "max_abs_acc",
                    "headroom_bits"):
            assert key in u
    for c in report["checks"]:
        assert set(c) >= {"check", "fired", "applicable", "exact", "threshold", "detail", "evidence"}
    assert (tmp_path / "r" / "report.md").is_file() and (tmp_path / "r" / "junit.xml").is_file()


def test_a_k_beyond_the_int32_bound_fires_check_2_and_exits_1(tmp_path):
    K = 132105
    a = torch.ones((1, K), dtype=torch.int8)
    a[0, 0] = -128
    (tmp_path / "t").mkdir()
    save_tile(divergent_tile().replace(a_q=a, s_a=torch.ones(1), w_q=torch.ones((2, K), dtype=torch.int8),
                                       s_w=torch.ones(2)), tmp_path / "t" / "deep.safetensors")
    assert main(["conform", *EMU, "--tiles", str(tmp_path / "t"), "--out", str(tmp_path / "r"), "--quiet"]) == 1
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    check2 = next(c for c in report["checks"] if c["check"] == "int32-no-overflow")
    assert check2["fired"] and report["verdict"] == "fail"


def _bad_tile_dirs(tmp_path):
    t = divergent_tile()
    ok = {"a_q": t.a_q, "s_a": t.s_a, "w_q": t.w_q, "s_w": t.s_w}
    cases = {
        "wrong-dtype": {**ok, "a_q": t.a_q.to(torch.int16)},
        "mismatched-k": {**ok, "w_q": t.w_q[:, :-1].contiguous()},
        "scale-shape": {**ok, "s_w": t.s_w[:-1].contiguous()},
        "non-finite": {**ok, "s_a": torch.full_like(t.s_a, float("nan"))},
        "zero-scale": {**ok, "s_w": torch.zeros_like(t.s_w)},
        "negative-scale": {**ok, "s_w": -t.s_w},
        "missing-tensor": {k: v for k, v in ok.items() if k != "w_q"},
    }
    for name, tensors in cases.items():
        (tmp_path / name).mkdir()
        save_file(tensors, str(tmp_path / name / "x.safetensors"))
    (tmp_path / "truncated").mkdir()
    save_file(ok, str(tmp_path / "whole.safetensors"))
    (tmp_path / "truncated" / "x.safetensors").write_bytes((tmp_path / "whole.safetensors").read_bytes()[:100])
    (tmp_path / "not-safetensors").mkdir()
    (tmp_path / "not-safetensors" / "x.safetensors").write_text("{}")
    (tmp_path / "empty").mkdir()
    return [*cases, "truncated", "not-safetensors", "empty"]


def test_each_kind_of_bad_tile_input_exits_2_with_the_file_named_and_no_report(tmp_path, capsys):
    for name in _bad_tile_dirs(tmp_path):
        out = tmp_path / f"out-{name}"
        assert main(["conform", *EMU, "--tiles", str(tmp_path / name), "--out", str(out)]) == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("alibi: error: ") and str(tmp_path / name) in err[0], (name, err)
        assert not out.exists(), name


@pytest.mark.parametrize("args, message", [
    (["--kernel-a", "nope", "--kernel-b", "emulator:a_then_w"], "unknown kernel 'nope'"),
    (["--kernel-a", "emulator:w_then_a"], "give both"),
    ([*EMU, "--synthetic", "nope"], "unknown synthetic preset"),
    ([*EMU, "--scales", "real,half"], "unknown or empty regime"),
    ([*EMU, "--tiles", "/nonexistent/tiles"], "not a folder of tiles"),
])
def test_bad_usage_exits_2_with_a_one_line_error(tmp_path, capsys, args, message):
    out = tmp_path / "r"
    assert main(["conform", *args, "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_an_unwritable_out_exits_2_before_running(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert main(["conform", *EMU, "--synthetic", "tiny", "--out", str(tmp_path / "file" / "r"), "--quiet"]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    if os.geteuid() != 0:  # root can write anywhere; the read-only case only means something for users
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        assert main(["conform", *EMU, "--synthetic", "tiny", "--out", str(ro / "r"), "--quiet"]) == 2


def test_a_kernel_that_fails_mid_run_leaves_no_report(tmp_path, capsys):
    class Crashes(Reference):
        name = "crashes"
        calls = 0

        def scaled_mm(self, *a, **k):
            Crashes.calls += 1
            if Crashes.calls > 3:
                raise RuntimeError("device fault")
            return super().scaled_mm(*a, **k)

    register("test-crashes", Crashes)
    assert main(["conform", "--kernel-a", "test-crashes", "--kernel-b", "emulator:a_then_w", "--synthetic", "tiny",
                 "--out", str(tmp_path / "r"), "--quiet"]) == 4  # a kernel raised: not 1, a check fired
    assert "device fault" in capsys.readouterr().err
    assert not (tmp_path / "r" / "report.json").exists()


def test_an_unavailable_kernel_exits_3(tmp_path, capsys):
    class NotHere(Kernel):
        name = "not-here"

        def available(self):
            return False, "needs the FooAccelerator; install foo-runtime"

    register("test-not-here", NotHere)
    assert main(["conform", "--kernel-a", "test-not-here", "--kernel-b", "emulator:a_then_w", "--synthetic", "tiny",
                 "--out", str(tmp_path / "r"), "--quiet"]) == 3
    assert "FooAccelerator" in capsys.readouterr().err


def test_kernels_json_lists_name_available_and_reason(capsys):
    assert main(["kernels", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = {r["name"]: r for r in rows}
    assert {"emulator:w_then_a", "emulator:a_then_w", "emulator:product_first", "torch-cpu", "triton"} <= set(names)
    assert all({"name", "available", "reason"} <= set(r) for r in rows)
    assert names["torch-cpu"]["available"] is True


def test_the_console_script_runs_and_prints_a_summary(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "alibi", "conform", *EMU, "--synthetic", "tiny", "--out",
                           str(tmp_path / "r")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "verdict: PASS" in proc.stdout and "pow2-identity" in proc.stdout


def test_a_relative_out_folder_gets_reports_and_a_manifest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["conform", *EMU, "--synthetic", "tiny", "--out", "rel/out", "--quiet"]) == 0
    names = sorted(p.name for p in (tmp_path / "rel" / "out").iterdir())
    assert names == ["junit.xml", "manifest.json", "report.html", "report.json", "report.md"]


def test_the_triton_kernel_is_the_a_then_w_model_on_tiles_written_by_another_program(tmp_path):
    tiles = write_foreign_tiles(tmp_path / "tiles")
    out = tmp_path / "r"
    assert main(["conform", "--kernel-a", "triton", "--kernel-b", "emulator:a_then_w", "--tiles", str(tiles),
                 "--out", str(out), "--quiet"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "pass" and report["equivalence"] == "bitwise"
    assert all(u["n_differing"] == 0 for u in report["tiles"])


def test_alibi_conform_flags_a_truncating_final_cast_as_an_epilogue_model_violation(tmp_path):
    out = tmp_path / "r"
    code = main(["conform", "--kernel-a", "mutant:truncate-cast:triton", "--kernel-b", "emulator:a_then_w",
                 "--synthetic", "epilogue-probe", "--scales", "real", "--out", str(out), "--quiet"])
    assert code == 1
    report = json.loads((out / "report.json").read_text())
    by = {c["check"]: c for c in report["checks"]}
    assert by["epilogue-model"]["fired"]
    violation = report["tiles"][0]["verdicts"]["epilogue-model"]["evidence"]["violations"]
    assert list(violation) == ["a"] and violation["a"]["max_ulp"] == 1
    # the paper's tolerance check cannot see it: a truncation stays within one ulp
    assert by["real-scale-tolerance"]["status"] == "passed"


# check 7: token-level risk from a replay ------------------------------------------------------
# Ten teacher-forced positions, three of them flipped: flip rate 0.3 (see tests/tokens/builders.py).
REPLAY_MARGINS = [[0.1, 2.0, 5.0, 0.3, 1.1], [4.0, 0.2, 3.0, 6.0, 0.9]]
REPLAY_FLIPS = [[True, False, False, False, True], [False, True, False, False, False]]


def _flips_json(tmp_path, **kw):
    from tokens.builders import write_flips

    return write_flips(tmp_path / "replay", REPLAY_MARGINS, REPLAY_FLIPS, **kw)


def _token_check(out):
    report = json.loads((out / "report.json").read_text())
    return report, next(c for c in report["checks"] if c["check"] == "token-level-risk")


def test_check_7_fires_when_the_replay_flip_rate_exceeds_the_bound(tmp_path):
    flips = _flips_json(tmp_path)
    out = tmp_path / "r"
    assert main(["conform", *EMU, "--synthetic", "tiny", "--replay", str(flips), "--out", str(out), "--quiet"]) == 1
    report, check = _token_check(out)
    assert check["status"] == "fired" and check["threshold"] == 0.05 and check["evidence"]["flip_rate"] == 0.3
    assert report["verdict"] == "fail"


def test_check_7_passes_below_the_bound_and_the_report_names_the_flips_json(tmp_path):
    from alibi.governance.manifest import read_manifest, sha256_file

    flips = _flips_json(tmp_path)
    out = tmp_path / "r"
    assert main(["conform", *EMU, "--synthetic", "tiny", "--replay", str(flips), "--flip-threshold", "0.3",
                 "--out", str(out), "--quiet"]) == 0
    report, check = _token_check(out)
    assert check["status"] == "passed" and check["threshold"] == 0.3  # the bound is inclusive: 0.3 ≤ 0.3
    assert report["replay"]["path"] == str(flips) and report["replay"]["sha256"] == sha256_file(flips)
    assert check["evidence"]["sha256"] == sha256_file(flips) and check["evidence"]["n_positions"] == 10
    manifest = read_manifest(out)
    assert manifest.predicate["inputs"]["replay"]["digest"]["sha256"] == sha256_file(flips)
    assert manifest.predicate["parameters"]["flip_threshold"] == 0.3


def test_check_7_is_inapplicable_without_a_replay(tmp_path):
    out = tmp_path / "r"
    assert main(["conform", *EMU, "--synthetic", "tiny", "--out", str(out), "--quiet"]) == 0
    report, check = _token_check(out)
    assert check["status"] == "inapplicable" and "--replay" in check["detail"] and "replay" not in report


def test_a_replay_flips_json_changed_after_it_was_written_is_refused_before_check_7_reads_it(tmp_path, capsys):
    """Issue 36 #1: check 7 judged on a flip analysis whose flip rate was edited down would pass; it is refused."""
    flips = _flips_json(tmp_path)
    doc = json.loads(flips.read_text())
    doc["flip_rate"], doc["n_flips"] = 0.0, 0
    flips.write_text(json.dumps(doc, indent=1) + "\n")
    out = tmp_path / "r"
    assert main(["conform", *EMU, "--synthetic", "tiny", "--replay", str(flips), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{flips}: fails its manifest" in err[0]
    assert not out.exists()


def test_a_replay_of_another_kernel_pair_is_refused(tmp_path, capsys):
    flips = _flips_json(tmp_path, kernels=("torch-cpu", "emulator:a_then_w"))
    out = tmp_path / "r"
    assert main(["conform", *EMU, "--synthetic", "tiny", "--replay", str(flips), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "compares torch-cpu with emulator:a_then_w, not emulator:w_then_a with emulator:a_then_w" in err
    assert not out.exists()


def _file(folder, name, text, pinned=True):
    """A replay file in a folder of its own, pinned by a `flip-analysis` manifest (as a damaged writer would
    leave it: the reader's own checks must catch it) unless `pinned` is False."""
    folder = folder / name.removesuffix(".json")
    folder.mkdir()
    (folder / name).write_text(text)
    if pinned:
        write_manifest(folder, "flip-analysis", build_predicate())
    return folder / name


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.json", "no such flip analysis"),
    (lambda d: _file(d, "loose.json", '{"schema": "alibi-flips/v1"}', pinned=False), "no manifest.json covers it"),
    (lambda d: _file(d, "empty.json", ""), "not valid JSON"),
    (lambda d: _file(d, "cut.json", '{"schema": "alibi-flips/v1", "n_pos'), "not valid JSON"),
    (lambda d: _file(d, "other.json", '{"schema": "alibi.conform/v1"}'), "expected 'alibi-flips/v1'"),
    (lambda d: _file(d, "partial.json", '{"schema": "alibi-flips/v1", "n_positions": 10}'), "missing field 'arm_a'"),
])
def test_a_bad_replay_file_exits_2_naming_it_and_writes_no_report(tmp_path, capsys, make, message):
    bad = make(tmp_path)
    out = tmp_path / "r"
    assert main(["conform", *EMU, "--synthetic", "tiny", "--replay", str(bad), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and str(bad) in err[0]
    assert not out.exists()


@pytest.mark.parametrize("args, message", [
    (["--flip-threshold", "0.1"], "give --replay FLIPS.json too"),
    (["--flip-threshold", "1.5", "--replay", "x.json"], "--flip-threshold must be a flip rate between 0 and 1"),
])
def test_a_flip_threshold_without_replay_or_out_of_range_exits_2(tmp_path, capsys, args, message):
    assert main(["conform", *EMU, "--synthetic", "tiny", *args, "--out", str(tmp_path / "r"), "--quiet"]) == 2
    assert message in capsys.readouterr().err


def _fp8_tiles(folder: Path) -> Path:
    from alibi.tiles.tile import Tile, save_tile

    folder.mkdir()
    a = torch.ones((4, 16), dtype=torch.float32).to(torch.float8_e4m3fn)
    save_tile(Tile("fp8", a, torch.ones(4), a[:2].clone(), torch.ones(2)), folder / "fp8.safetensors")
    return folder


def test_a_refused_fp8_run_with_int8_only_kernels_leaves_no_folder(tmp_path, capsys):
    """Issue 26: the format refusal came after the units folder (and --out's parent) was created."""
    out = tmp_path / "out" / "report"
    assert main(["conform", *EMU, "--tiles", str(_fp8_tiles(tmp_path / "tiles")), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fp8" in err[0] and "emulator" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiles"]


def test_a_refused_ray_run_without_ray_installed_leaves_no_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError, as where it is not installed
    out = tmp_path / "out" / "report"
    assert main(["conform", *EMU, "--synthetic", "tiny", "--ray", "local", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'integer-alibi[ray]'" in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_a_fresh_run_that_fails_before_its_first_unit_removes_its_units_folder(tmp_path, monkeypatch):
    """Whatever stops a fresh run before it kept a unit (here a kernel failing at its first launch), it
    leaves neither the units folder with its plan nor the folders made on the way to --out."""
    import alibi.conform.pipeline as conform

    def broken(*a, **k):
        raise InputError("the kernel failed")

    monkeypatch.setattr(conform, "run_units", broken)
    out = tmp_path / "a" / "b" / "report"
    assert main(["conform", *EMU, "--synthetic", "tiny", "--out", str(out)]) == 2
    assert list(tmp_path.iterdir()) == []
