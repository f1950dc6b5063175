"""Sweep records: JSON round trips with the schema checked, and the CSV reader's refusals."""

from __future__ import annotations

import json

import pytest
import torch

from alibi.errors import InputError
from alibi.sweep.arms import resolve_pair
from alibi.sweep.depth import DepthPlan, run_depth_sweep
from alibi.sweep.records import DepthSweep, read_depth_csv, read_depth_input


@pytest.fixture(scope="module")
def small_sweep() -> DepthSweep:
    plan = DepthPlan("torch-cpu", "emulator:a_then_w", "int8", Ks=(64, 128), M=16, N=32, seeds=2).validate()
    return run_depth_sweep(plan, resolve_pair(plan.kernel_a, plan.kernel_b, "int8", tensorwise_ok=True),
                           torch.device("cpu"))


def test_depth_sweep_json_round_trips_exactly(small_sweep):
    text = small_sweep.to_json()
    assert DepthSweep.from_json(text, "depth.json") == small_sweep
    assert json.loads(text)["schema"] == "alibi-depth-sweep/v1"


def test_a_json_of_another_schema_or_with_a_wrong_type_is_refused(small_sweep):
    doc = json.loads(small_sweep.to_json())
    with pytest.raises(InputError, match="schema is 'alibi-rows-sweep/v1', expected 'alibi-depth-sweep/v1'"):
        DepthSweep.from_json(json.dumps({**doc, "schema": "alibi-rows-sweep/v1"}), "x.json")
    doc["records"][1]["n_differing"] = "3"
    with pytest.raises(InputError, match=r"x.json.records\[1\].n_differing: expected an integer"):
        DepthSweep.from_json(json.dumps(doc), "x.json")


def test_the_csv_holds_one_row_per_record_and_reads_back_as_the_same_rows(small_sweep, tmp_path):
    path = tmp_path / "depth.csv"
    path.write_text(small_sweep.to_csv())
    data = read_depth_csv(path)
    assert data == small_sweep.data()
    assert small_sweep.to_csv().splitlines()[0].startswith("seed,K,n,n_differing,frac_differ,")


def test_a_foreign_csv_with_only_the_required_columns_is_accepted(tmp_path):
    path = tmp_path / "paper.csv"
    path.write_text("K,seed,frac_differ,note\n512,0,0.082,a\n1024,0,0.11,b\n512,1,0.08,c\n")
    got = read_depth_input(path)
    assert got.sweep is None and got.label == "paper"
    assert got.data.K == (512, 1024, 512) and got.data.seed == (0, 0, 1) and got.data.n is None


MALFORMED = {
    "empty": ("", "empty file"),
    "missing column": ("seed,K\n0,512\n", "header lacks column(s) frac_differ"),
    "header only": ("seed,K,frac_differ\n", "header only, no data rows"),
    "not a number": ("seed,K,frac_differ\n0,512,abc\n", "line 2, column frac_differ: 'abc' is not a number"),
    "nan": ("seed,K,frac_differ\n0,512,nan\n", "line 2, column frac_differ: 'nan' is not finite"),
    "above one": ("seed,K,frac_differ\n0,512,1.5\n", "line 2, column frac_differ: 1.5 is outside"),
    "zero K": ("seed,K,frac_differ\n0,0,0.1\n", "line 2, column K: 0 is below 1"),
    "fractional seed": ("seed,K,frac_differ\n1.5,512,0.1\n", "line 2, column seed: '1.5' is not an integer"),
    "negative seed": ("seed,K,frac_differ\n-1,512,0.1\n", "line 2, column seed: -1 is below 0"),
    "duplicate": ("seed,K,frac_differ\n0,512,0.1\n0,512,0.2\n", "line 3: seed 0 and K 512 appear twice"),
    "short row": ("seed,K,frac_differ\n0,512\n", "line 2 has 2 fields, the header has 3"),
    "one count": ("seed,K,frac_differ,n\n0,512,0.1,10\n", "column n without n_differing"),
    "count above n": ("seed,K,frac_differ,n,n_differing\n0,512,1.0,10,11\n", "n_differing 11 exceeds n 10"),
    "inconsistent": ("seed,K,frac_differ,n,n_differing\n0,512,0.5,10,1\n", "frac_differ 0.5 is not n_differing/n"),
    "repeated header": ("seed,K,K,frac_differ\n0,512,512,0.1\n", "column(s) K appear more than once"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_the_csv_reader_refuses_malformed_files_naming_the_problem(case, tmp_path):
    text, message = MALFORMED[case]
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        read_depth_csv(path)
    assert message in str(info.value) and str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_an_input_that_is_neither_a_sweep_nor_a_csv_is_refused(tmp_path):
    path = tmp_path / "fits.txt"
    path.write_text("x")
    with pytest.raises(InputError, match="not a depth-sweep folder, .json or .csv"):
        read_depth_input(path)
