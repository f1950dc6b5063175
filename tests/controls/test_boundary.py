"""The boundary suite: its probes separate what they claim to, the facts hold on correct CPU kernels and
fail on mutants built to break them."""

import json

import numpy as np
import pytest
import torch

from alibi.cli import main
from alibi.controls.boundary import (
    ROUND_TRIP_VALUES,
    SCHEMA,
    BoundaryReport,
    _bf16_out,
    expected_midpoint_rounding,
    midpoint_cases,
    run_boundary,
    separating_scale,
    target_operands,
)
from alibi.exact.emulator import exact_accumulator
from alibi.exact.numerics import bits


def facts(report: BoundaryReport, kernel: str) -> dict[str, bool]:
    k = next(k for k in report.kernels if k.kernel == kernel)
    return {f"{f.group}:{f.fact}": f.holds for f in k.facts}


# --- the probes ----------------------------------------------------------------------------------------

def test_target_operands_give_exactly_the_requested_accumulators_in_every_column():
    targets = [s * v for v in ROUND_TRIP_VALUES for s in (1, -1)] + [s * (m * 2**15 + d) for s, m, d in midpoint_cases()]
    a, w = target_operands(targets, N=3)
    acc = exact_accumulator(a, w)
    assert torch.equal(acc, torch.tensor(targets, dtype=torch.int64)[:, None].expand(-1, 3))


def test_fp32_itself_rounds_2_pow_24_plus_1_to_even_and_keeps_its_neighbours():
    assert [float(np.float32(v)) == v for v in ROUND_TRIP_VALUES] == [True, True, False, True]
    assert float(np.float32(2**24 + 1)) == 2**24


@pytest.mark.parametrize("value", [2**24 - 1, 2**24, 2**24 + 2, -(2**24)])
def test_each_probe_scale_puts_a_bf16_rounding_midpoint_between_a_value_and_its_fp32_neighbour(value):
    f = float(np.float32(value))
    for toward in (-np.inf, np.inf):
        nb = float(np.nextafter(np.float32(f), np.float32(toward)))
        s = separating_scale(f, nb)
        assert _bf16_out(f, s) != _bf16_out(nb, s)


def test_midpoint_expectations_agree_with_torch_s_nearest_even_cast():
    """The integer reasoning of `expected_midpoint_rounding` against torch's own fp32 → bf16 cast."""
    for s, m, d in midpoint_cases():
        for k in (-100, 0, 50):
            y = torch.tensor([s * (m * 2**15 + d) * 2.0**k], dtype=torch.float64).float()  # exact in fp32
            want = torch.tensor([expected_midpoint_rounding(s, m, d, k)], dtype=torch.float64).to(torch.bfloat16)
            assert int(bits(y.to(torch.bfloat16))) == int(bits(want)), (s, m, d, k)


# --- the facts on correct kernels, and on mutants that break them ---------------------------------------

@pytest.fixture(scope="module")
def cpu_report():
    return run_boundary(["emulator:w_then_a", "triton", "torch-cpu"])


def test_every_fact_holds_for_the_exact_emulator_and_the_triton_kernel_under_the_interpreter(cpu_report):
    for kernel in ("emulator:w_then_a", "triton"):
        held = facts(cpu_report, kernel)
        assert len(held) == 8 + 6 + 3 + 3 and all(held.values()), {k: v for k, v in held.items() if not v}


def test_every_fact_holds_for_torch_int_mm_on_the_cpu_including_a_one_element_reduction(cpu_report):
    """Guards the fix in alibi/kernels/cpu.py: torch 2.13's CPU _int_mm misread the (1, 1) strides that
    `w_q.T.contiguous()` keeps for N×1 weights and returned garbage at K = 1."""
    held = facts(cpu_report, "torch-cpu")
    assert held["exact-accumulation:random:K=1"] and all(held.values()), {k: v for k, v in held.items() if not v}


def test_the_report_is_stamped_with_its_environment_and_round_trips_through_json(cpu_report):
    doc = json.loads(cpu_report.to_json())
    assert doc["schema"] == SCHEMA and doc["environment"]["cpu"] and doc["toolkit"]["version"]
    assert BoundaryReport.from_json(cpu_report.to_json()) == cpu_report


def test_a_truncating_cast_breaks_the_midpoint_facts_and_the_round_trip_probes():
    held = facts(run_boundary(["mutant:truncate-cast:torch-cpu"]), "mutant:truncate-cast:torch-cpu")
    assert not held["bf16-midpoint:tie-to-even"] and not held["bf16-midpoint:one-ulp-above"]
    assert held["bf16-midpoint:one-ulp-below"]  # below a midpoint, truncation and nearest agree
    assert not any(v for k, v in held.items() if k.startswith("round-trip:"))  # the probes sit on midpoints too


def test_saturating_16_bit_pairs_break_exact_accumulation_on_random_operands():
    held = facts(run_boundary(["mutant:sat16-pairs:emulator:w_then_a"]), "mutant:sat16-pairs:emulator:w_then_a")
    assert not held["exact-accumulation:random:K=32768"]


def test_flushing_subnormal_outputs_breaks_the_subnormal_fact_but_not_commutation_for_normal_values():
    name = "mutant:flush-subnormal:emulator:a_then_w"
    held = facts(run_boundary([name]), name)
    assert not held["pow2-commutation:subnormal-failure"] and held["pow2-commutation:normal"]


# --- the command --------------------------------------------------------------------------------------

def test_the_command_exits_0_when_every_fact_holds_and_writes_the_report(tmp_path, capsys):
    out = tmp_path / "boundary.json"
    assert main(["boundary", "--kernel", "emulator:a_then_w", "--out", str(out), "--quiet"]) == 0
    report = BoundaryReport.from_json(out.read_text())
    assert report.all_hold and [k.kernel for k in report.kernels] == ["emulator:a_then_w"]
    assert "all facts hold" in capsys.readouterr().out


def test_the_command_exits_1_when_a_fact_fails(tmp_path):
    assert main(["boundary", "--kernel", "mutant:truncate-cast:emulator:a_then_w", "--quiet"]) == 1


def test_an_unavailable_kernel_exits_3_and_an_fp8_kernel_exits_2(tmp_path, capsys):
    if not torch.cuda.is_available():
        assert main(["boundary", "--kernel", "cutlass", "--out", str(tmp_path / "b.json"), "--quiet"]) == 3
    assert main(["boundary", "--kernel", "triton-fp8", "--out", str(tmp_path / "b.json"), "--quiet"]) == 2
    assert "int8" in capsys.readouterr().err and list(tmp_path.iterdir()) == []
