"""The detection matrix: rows, cells, observability per launch, summaries, files, and refusals of bad input."""

import json

import pytest
import torch
from faulty_kernels import OneUlpUp

from alibi.cli import main
from alibi.conform.checks import CHECKS
from alibi.controls.mutant_matrix import SCHEMA, DetectionMatrix, heatmap, run_matrix, to_markdown
from alibi.kernels.registry import get_kernel, register
from alibi.tiles.exposing import exposing_tile, fp32_partials_tile
from alibi.tiles.tile import save_tile


@pytest.fixture(scope="module")
def small_tiles():
    """A 24-row slice of the epilogue probe (M > 16 keeps the small-M sub-batches) and small fp32 partials."""
    probe = exposing_tile("epilogue-probe")
    return [probe.rows(torch.arange(0, 24)).replace(name="probe-24"), fp32_partials_tile(M=20, N=16)]


@pytest.fixture(scope="module")
def matrix(small_tiles):
    return run_matrix(get_kernel("torch-cpu"), "torch-cpu", small_tiles, source={"label": "test tiles"},
                      faults=["null", "truncate-cast", "fp32-accumulate", "m-dependent-order", "scale-ulp"],
                      severities=["one", "all"])


def row(m: DetectionMatrix, fault: str, severity: str, regime: str):
    return next(r for r in m.faults if (r.fault, r.severity, r.regime) == (fault, severity, regime))


def test_one_row_per_fault_severity_and_regime_with_a_cell_for_every_check(matrix):
    # null and m-dependent-order take no severity: one row each per regime.
    assert len(matrix.faults) == (1 + 2 + 2 + 1 + 2) * 2
    for r in matrix.faults:
        assert set(r.cells) == set(CHECKS) and set(r.cells.values()) <= {"fired", "silent", "inapplicable"}
        assert list(r.fired) == [c for c in CHECKS if r.cells[c] == "fired"]
    assert len(matrix.units) == len(matrix.faults) * 2  # two tiles per row


def test_the_null_mutant_fires_no_check_and_is_unobservable(matrix):
    for regime in ("real", "pow2"):
        r = row(matrix, "null", "all", regime)
        assert not r.fired and not r.observable and r.changed_elements == 0
    assert matrix.null_silent and all(c.false_positives == 0 for c in matrix.check_summary)


def test_a_truncating_cast_fires_the_pow2_check_under_pow2_scales_and_the_model_check_under_both(matrix):
    pow2, real = row(matrix, "truncate-cast", "all", "pow2"), row(matrix, "truncate-cast", "all", "real")
    assert pow2.observable and {"pow2-identity", "epilogue-model"} <= set(pow2.fired)
    assert real.observable and "epilogue-model" in real.fired
    assert real.cells["pow2-identity"] == "inapplicable"
    assert real.max_ulp == 1 and "real-scale-tolerance" not in real.fired  # within one ulp: check 6 is blind


def test_observability_counts_every_launch_so_an_m_dependent_order_is_observable_though_the_full_tile_is_not(matrix):
    r = row(matrix, "m-dependent-order", "all", "real")
    assert r.observable and r.fired == ("m-invariance",)
    assert not row(matrix, "m-dependent-order", "all", "pow2").observable  # pow2: no sub-batches, orders agree


def test_an_fp32_accumulator_is_observable_only_on_the_tile_whose_partial_sums_pass_2_pow_24(matrix):
    units = [u for u in matrix.units if u.fault == "fp32-accumulate" and u.severity == "all"]
    assert {u.tile for u in units if u.observable} == {"fp32-partials"}
    for u in units:
        if u.observable:
            assert "exact-accumulator" in u.fired and "lossless-fp32-entry" not in u.fired


def test_operand_faults_fire_check_1_even_where_no_output_bit_changed(matrix):
    r = row(matrix, "scale-ulp", "one", "pow2")
    assert "shared-operands" in r.fired


def test_summaries_count_hits_misses_on_observable_rows_and_the_classes_detected(matrix):
    by = {c.check: c for c in matrix.check_summary}
    observable = [r for r in matrix.faults if r.fault != "null" and r.observable]
    for c in CHECKS:
        s = by[c]
        assert s.hits_observable + s.misses_observable + s.inapplicable_observable == len(observable)
    assert matrix.all_detected and matrix.exit_code == 0
    classes = {c.fault: c for c in matrix.classes}
    assert classes["truncate-cast"].detected_rows == classes["truncate-cast"].observable_rows > 0
    assert "m-invariance" in classes["m-dependent-order"].detected_by


def test_the_matrix_round_trips_through_its_json_and_holds_the_documented_keys(matrix):
    text = matrix.to_json()
    assert DetectionMatrix.from_json(text) == matrix
    doc = json.loads(text)
    assert doc["schema"] == SCHEMA
    for f in doc["faults"]:
        assert {"fault", "severity", "regime", "observable", "fired"} <= set(f)
        assert isinstance(f["fired"], list)


def test_markdown_places_our_rates_beside_the_published_ones_and_the_figure_renders(matrix):
    md = to_markdown(matrix)
    assert "## Beside the published rates" in md and "494 / 972" in md and "F4 truncating cast" in md
    png, svg = heatmap(matrix)
    assert png.startswith(b"\x89PNG") and b"<svg" in svg and b"<dc:date>" not in svg


def test_a_check_firing_on_the_null_mutant_is_a_false_positive_and_exits_1(small_tiles):
    register("test-one-ulp-up", OneUlpUp)  # declares a_then_w but is off by an ulp: its own model check fires
    m = run_matrix(get_kernel("test-one-ulp-up"), "test-one-ulp-up", small_tiles[:1], source={"label": "t"},
                   faults=["null"], regimes=["real"])
    fp = {c.check: c.false_positives for c in m.check_summary}
    assert fp["epilogue-model"] == 1 and not m.null_silent and m.exit_code == 1


# --- the command --------------------------------------------------------------------------------------

def test_the_command_writes_json_markdown_figures_and_a_verifiable_manifest(tmp_path, small_tiles):
    tiles = tmp_path / "tiles"
    save_tile(small_tiles[0], tiles / "probe.safetensors")
    out = tmp_path / "m"
    rc = main(["mutants", "--base", "torch-cpu", "--tiles", str(tiles), "--faults", "null,reassociate",
               "--severity", "all", "--scales", "real", "--out", str(out), "--quiet"])
    assert rc == 0
    assert sorted(p.name for p in out.iterdir()) == ["detection.json", "detection.md", "detection.png",
                                                     "detection.svg", "manifest.json"]
    m = DetectionMatrix.from_json((out / "detection.json").read_text())
    assert [r.fault for r in m.faults] == ["null", "reassociate"]
    assert main(["manifest", "verify", str(out)]) == 0


def test_progress_lines_count_matrix_rows_on_stderr_and_leave_stdout_and_the_matrix_unchanged(
        tmp_path, small_tiles, capsys, monkeypatch):
    import re

    tiles = tmp_path / "tiles"
    save_tile(small_tiles[0], tiles / "probe.safetensors")
    argv = ["mutants", "--base", "torch-cpu", "--tiles", str(tiles), "--faults", "null,reassociate",
            "--severity", "all", "--scales", "real,pow2"]
    monkeypatch.setenv("ALIBI_PROGRESS", "lines")
    assert main([*argv, "--quiet", "--out", str(tmp_path / "quiet")]) == 0
    quiet = capsys.readouterr()
    assert quiet.err == ""
    assert main([*argv, "--out", str(tmp_path / "loud")]) == 0
    loud = capsys.readouterr()
    err = loud.err.splitlines()
    assert err[0].startswith("alibi mutants: torch-cpu on tiles in ") and len(err) == 5
    counted = [re.fullmatch(r"\[(\d)/4\] (\S+) \[(real|pow2)\]: .* \(\d+\.\d s\)", line) for line in err[1:]]
    assert [(m.group(1), m.group(3)) for m in counted] == [("1", "real"), ("2", "pow2"), ("3", "real"), ("4", "pow2")]
    assert loud.out.replace(str(tmp_path / "loud"), "OUT") == quiet.out.replace(str(tmp_path / "quiet"), "OUT")
    a, b = (DetectionMatrix.from_json((tmp_path / d / "detection.json").read_text()) for d in ("loud", "quiet"))
    assert a.faults == b.faults and a.units == b.units and a.check_summary == b.check_summary
    assert not re.search(r"^\[\d/4\]", (tmp_path / "loud" / "detection.md").read_text(), re.MULTILINE)


@pytest.mark.parametrize("args,code,message", [
    (["--base", "torch-cpu", "--faults", "bit-flip"], 2, "unknown fault 'bit-flip'"),
    (["--base", "torch-cpu", "--severity", "150%"], 2, "out of range"),
    (["--base", "torch-cpu", "--faults", "unfused-bias"], 2, "already is unfused"),
    (["--base", "triton-fp8", "--faults", "scale-bf16"], 2, "unknown fp8 fault 'scale-bf16'"),
    (["--base", "torch-cpu", "--native"], 2, "--native"),
    (["--base", "no-such-kernel"], 2, "unknown kernel"),
])
def test_bad_input_gets_one_line_an_exit_code_and_nothing_written(tmp_path, capsys, args, code, message):
    out = tmp_path / "m"
    assert main(["mutants", *args, "--out", str(out), "--quiet"]) == code
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_an_unavailable_base_exits_3_and_writes_nothing(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("cutlass is available here")
    assert main(["mutants", "--base", "cutlass", "--out", str(tmp_path / "m"), "--quiet"]) == 3
    assert "not available here" in capsys.readouterr().err and list(tmp_path.iterdir()) == []


def test_tiles_of_a_format_the_base_does_not_handle_are_refused(tmp_path, capsys, small_tiles):
    t = small_tiles[0]
    fp8 = t.replace(a_q=t.a_q.float().to(torch.float8_e4m3fn), w_q=t.w_q.float().to(torch.float8_e4m3fn))
    save_tile(fp8, tmp_path / "fp8" / "x.safetensors")
    assert main(["mutants", "--base", "torch-cpu", "--tiles", str(tmp_path / "fp8"), "--out", str(tmp_path / "m"),
                 "--quiet"]) == 2
    assert "these tiles are fp8_e4m3" in capsys.readouterr().err and not (tmp_path / "m").exists()


def test_mutants_refuses_an_out_folder_inside_its_tiles_and_changes_nothing(tmp_path, capsys):
    """issue 16: every command refuses an output that overlaps an input."""
    from alibi.cli import main
    from alibi.tiles.synthetic import synthetic_tiles
    from alibi.tiles.tile import save_tile

    tiles = tmp_path / "tiles"
    save_tile(synthetic_tiles("tiny")[0], tiles / "t.safetensors")
    before = sorted(p.name for p in tiles.iterdir())
    assert main(["mutants", "--base", "torch-cpu", "--tiles", str(tiles), "--out", str(tiles / "m")]) == 2
    assert "overlaps --tiles" in capsys.readouterr().err
    assert sorted(p.name for p in tiles.iterdir()) == before
