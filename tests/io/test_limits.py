"""The element budget and the one seed rule (alibi.io.limits), as every command applies them."""

from __future__ import annotations

import pytest
from hostile import GIB, assert_one_line_error, run_alibi

from alibi.errors import InputError
from alibi.io.limits import DEFAULT_MAX_ELEMENTS, MAX_ELEMENTS_ENV, check_gemm_size, check_seed, max_elements
from alibi.tiles.synthetic import synthetic_tiles

EMU = ["--kernel-a", "emulator:w_then_a", "--kernel-b", "emulator:a_then_w"]


def test_each_of_the_three_matrices_is_held_to_the_budget(monkeypatch):
    monkeypatch.setenv(MAX_ELEMENTS_ENV, "100")
    check_gemm_size(10, 10, 10, "x")  # 100 elements each: exactly the budget
    for shape, which in (((11, 10, 1), "a_q is M×K"), ((1, 10, 11), "w_q is N×K"), ((11, 1, 10), "the output is M×N")):
        with pytest.raises(InputError, match=which):
            check_gemm_size(*shape, "x")


def test_the_budget_defaults_to_2_to_the_28_and_a_malformed_override_is_refused(monkeypatch):
    monkeypatch.delenv(MAX_ELEMENTS_ENV, raising=False)
    assert max_elements() == DEFAULT_MAX_ELEMENTS == 2**28
    for bad in ("lots", "0", "-5"):
        monkeypatch.setenv(MAX_ELEMENTS_ENV, bad)
        with pytest.raises(InputError, match=MAX_ELEMENTS_ENV):
            max_elements()


def test_rows_of_a_billion_are_refused_before_anything_is_drawn_under_a_2_gib_limit(tmp_path):
    """Guards: `--rows 1000000000` drew 10⁹ × 576 Student-t activations (256 GB): MemoryError."""
    proc = run_alibi(["conform", *EMU, "--synthetic", "smollm2-135m", "--rows", "1000000000", "--out",
                      str(tmp_path / "r"), "--quiet"], memory_limit=2 * GIB)
    assert_one_line_error(proc, "synthetic preset smollm2-135m at M=1000000000", MAX_ELEMENTS_ENV)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("seed", [0, 1, 2**64 - 1])
def test_every_seed_from_0_to_2_to_the_64_minus_1_is_accepted(seed):
    assert check_seed(seed) == seed
    assert synthetic_tiles("tiny", seed=seed)[0].M == 8


@pytest.mark.parametrize("seed", [-1, 2**64, 2**70, True, 1.0, "3"])
def test_a_seed_outside_0_to_2_to_the_64_is_refused_by_the_one_rule(seed):
    """Guards: 2⁶⁴ reached torch's manual_seed (RuntimeError: overflow), −1 was silently accepted."""
    with pytest.raises(InputError, match="must be an integer from 0 to 2\\^64 - 1"):
        synthetic_tiles("tiny", seed=seed)


@pytest.mark.parametrize("seed", ["-1", str(2**64)])
def test_conform_refuses_the_seeds_alibi_run_refuses_with_one_line(tmp_path, seed):
    """Guards: `conform --seed -1` ran while `alibi run` refused seed −1; `--seed 2**64` was a traceback."""
    proc = run_alibi(["conform", *EMU, "--synthetic", "tiny", "--seed", seed, "--out", str(tmp_path / "r"), "--quiet"])
    assert_one_line_error(proc, "must be an integer from 0 to 2^64 - 1")
    assert not (tmp_path / "r").exists()
