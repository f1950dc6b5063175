"""Every check fires on a constructed violation and stays silent on a conforming pair."""

import pytest
import torch
from faulty_kernels import (
    Bf16ScaleEpilogue,
    DependsOnM,
    Nondeterministic,
    OneUlpUp,
    Reference,
    ThreeUlpsUp,
    WritesIntoItsInputs,
    WrongAccumulator,
    divergent_tile,
)

from alibi import checks
from alibi.conform import Pair, conform, evaluate_unit
from alibi.emulator import EpilogueModel, apply_epilogue, exact_accumulator, predict
from alibi.kernels import get_kernel
from alibi.kernels.base import Kernel


def verdicts(kernel_a, kernel_b, tile, regime="real"):
    return evaluate_unit(kernel_a, kernel_b, tile, regime)["verdicts"]


def status(kernel_a, kernel_b, tile, check, regime="real"):
    return verdicts(kernel_a, kernel_b, tile, regime)[check]["status"]


@pytest.fixture(scope="module")
def tile():
    return divergent_tile()


def test_a_conforming_pair_passes_every_applicable_check(tile):
    for regime in ("real", "pow2"):
        v = verdicts(Reference(), get_kernel("emulator:a_then_w"), tile, regime)
        assert not any(x["fired"] for x in v.values()), regime
    assert verdicts(Reference(), Reference(), tile, "real")["token-level-risk"]["status"] == "inapplicable"


def test_shared_operands_fires_when_a_kernel_writes_into_its_inputs(tile):
    assert status(WritesIntoItsInputs(), Reference(), tile, "shared-operands") == "fired"
    assert status(Reference(), Reference(), tile, "shared-operands") == "passed"


def test_shared_operands_fires_on_operands_that_differ_in_one_bit():
    t = divergent_tile()
    other = {"a_q": t.a_q, "s_a": t.s_a.clone(), "w_q": t.w_q, "s_w": t.s_w, "bias": None}
    other["s_a"].view(torch.int32)[0] ^= 1
    v = checks.shared_operands({"a_q": t.a_q, "s_a": t.s_a, "w_q": t.w_q, "s_w": t.s_w, "bias": None}, other)
    assert v.fired and v.evidence["differing"] == ["s_a"]


def test_int32_no_overflow_fires_above_the_k_bound_and_not_at_it():
    for K, fired in ((132104, False), (132105, True)):
        a = torch.ones((1, K), dtype=torch.int8)
        a[0, 0] = -128
        w = torch.ones((1, K), dtype=torch.int8)
        v = checks.int32_no_overflow(predict(a, w), K)
        assert v.applicable and v.fired is fired


def test_lossless_fp32_entry_fires_above_2_pow_24():
    big = torch.full((1, 1100), 127, dtype=torch.int8)
    assert checks.lossless_fp32_entry(predict(big, big)).fired
    assert not checks.lossless_fp32_entry(predict(big[:, :1000], big[:, :1000])).fired


def test_exact_accumulator_fires_on_a_wrong_accumulator_and_is_inapplicable_when_none_is_exposed(tile):
    assert status(WrongAccumulator(), Reference(), tile, "exact-accumulator") == "fired"
    assert status(Reference(), Reference(), tile, "exact-accumulator") == "passed"
    v = checks.exact_accumulator(torch.zeros(2, 2, dtype=torch.int64), None, None)
    assert v.status == "inapplicable"


def test_pow2_identity_fires_on_any_bit_difference_and_applies_only_to_pow2_scales(tile):
    assert status(OneUlpUp(), Reference(), tile, "pow2-identity", "pow2") == "fired"
    assert status(get_kernel("emulator:w_then_a"), Reference(), tile, "pow2-identity", "pow2") == "passed"
    assert status(OneUlpUp(), Reference(), tile, "pow2-identity", "real") == "inapplicable"


def test_pow2_identity_excludes_subnormal_results():
    t = divergent_tile()
    t = t.replace(s_a=torch.full_like(t.s_a, 1.3 * 2**-126), s_w=torch.full_like(t.s_w, 2.0**-20))
    a, b = get_kernel("emulator:w_then_a"), get_kernel("emulator:a_then_w")
    unit = evaluate_unit(a, b, t, "pow2")
    v = unit["verdicts"]["pow2-identity"]
    assert v["status"] == "passed" and v["evidence"]["n_excluded_subnormal_or_overflow"] > 0


def test_real_scale_tolerance_fires_above_one_ulp_and_carries_its_threshold(tile):
    v = verdicts(ThreeUlpsUp(), Reference(), tile)["real-scale-tolerance"]
    assert v["status"] == "fired" and v["threshold"] == 1 and v["evidence"]["max_ulp"] == 3
    v = verdicts(get_kernel("emulator:w_then_a"), Reference(), tile)["real-scale-tolerance"]
    assert v["status"] == "passed" and v["evidence"]["max_ulp"] == 1
    assert not verdicts(ThreeUlpsUp(), Reference(), tile)["real-scale-tolerance"]["exact"]


def test_real_scale_tolerance_fires_when_only_one_side_is_not_finite():
    a = torch.tensor([1.0, float("inf")], dtype=torch.bfloat16)
    b = torch.tensor([1.0, 3.0e38], dtype=torch.bfloat16)
    assert checks.real_scale_tolerance(a, b, True).fired


def test_token_level_risk_fires_above_its_bound():
    assert checks.token_level_risk(0.05, 0.01).fired
    assert checks.token_level_risk(0.005, 0.01).status == "passed"
    assert checks.token_level_risk().status == "inapplicable"


def test_token_level_risk_carries_the_replay_it_was_judged_on_in_its_evidence():
    v = checks.token_level_risk(0.02, 0.05, evidence={"path": "flips.json", "sha256": "0" * 64, "n_positions": 50})
    assert v.status == "passed" and v.threshold == 0.05
    assert v.evidence == {"flip_rate": 0.02, "path": "flips.json", "sha256": "0" * 64, "n_positions": 50}


def test_epilogue_model_catches_a_bf16_weight_scale_that_the_seven_checks_miss():
    tiles = [divergent_tile(seed=s) for s in range(3)]  # fp32 weight scales (not already bf16-exact)
    pair = Pair(Bf16ScaleEpilogue(), get_kernel("emulator:a_then_w"), "test")
    report = conform(pair, tiles, ["real"], source={"label": "tiny"})
    by = {c["check"]: c for c in report["checks"]}
    paper_seven = ["shared-operands", "int32-no-overflow", "lossless-fp32-entry", "exact-accumulator",
                   "pow2-identity", "real-scale-tolerance", "token-level-risk"]
    assert not any(by[c]["fired"] for c in paper_seven)
    assert by["epilogue-model"]["fired"]


def test_epilogue_model_is_silent_when_each_arm_equals_its_declared_model(tile):
    v = verdicts(get_kernel("emulator:w_then_a"), get_kernel("emulator:a_then_w"), tile)["epilogue-model"]
    assert v["status"] == "passed"


def test_m_invariance_fires_when_a_row_depends_on_the_batch_size(tile):
    assert status(DependsOnM(), Reference(), tile, "m-invariance") == "fired"
    assert status(Reference(), Reference(), tile, "m-invariance") == "passed"


def test_run_to_run_fires_on_a_nondeterministic_kernel(tile):
    assert status(Nondeterministic(), Reference(), tile, "run-to-run") == "fired"
    assert status(Reference(), Reference(), tile, "run-to-run") == "passed"


def test_inapplicable_checks_are_never_counted_as_passes():
    vs = [checks.token_level_risk(), checks.token_level_risk()]
    combined = checks.combine(vs)
    assert combined.status == "inapplicable" and not combined.fired


def test_a_pair_with_no_declared_model_is_inconclusive_not_pass():
    """Two different kernels (the two vLLM scale orders, 1 ulp apart on this tile) that declare no
    epilogue model: every other check passes, so the verdict is inconclusive *because* of the missing
    declaration — the same two kernels declaring their models pass. (Issue 16: the test used one
    kernel as both arms, comparing a function with itself.)"""
    class Undeclared(Kernel):
        """Runs one scale order's epilogue but declares none."""

        formats, device, epilogue = ("int8",), "cpu", None

        def __init__(self, order: str):
            self.name, self._model = f"undeclared-{order}", EpilogueModel(order)

        def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
            return apply_epilogue(self._model, exact_accumulator(a_q, w_q), s_a, s_w, bias, out_dtype)

    def undeclared(order: str) -> Kernel:
        return Undeclared(order)

    tiles = [divergent_tile()]
    report = conform(Pair(undeclared("w_then_a"), undeclared("a_then_w"), "test"), tiles, ["real"],
                     source={"label": "x"})
    assert report["tiles"][0]["n_differing"] > 0  # the arms really differ
    assert report["verdict"] == "inconclusive"
    assert [why.split(":")[0] for why in report["inconclusive_because"]] == ["epilogue-model"]
    declared = conform(Pair(get_kernel("emulator:w_then_a"), get_kernel("emulator:a_then_w"), "test"), tiles,
                       ["real"], source={"label": "x"})
    assert declared["verdict"] == "pass"


# --- issue 16: branches no test reached ----------------------------------------------------------

def _tile(a: torch.Tensor, w: torch.Tensor, s_a: torch.Tensor | None = None, s_w: torch.Tensor | None = None):
    from alibi.tile import Tile

    return Tile("edge", a, torch.ones(a.shape[0]) if s_a is None else s_a, w,
                torch.ones(w.shape[0]) if s_w is None else s_w).validate()


def test_check_2_uses_the_16384_bound_exactly_when_both_operands_contain_minus_128():
    """16384·131071 < 2³¹ ≤ 16384·131072: all −128 operands at K = 131072 really wrap an int32
    (to −2³¹), so check 2 must fire there and pass one K earlier; with −128 in one operand only the
    bound is 16256 and K = 131072 is safe."""
    from alibi.emulator import int32_wrap

    K = 131072
    a = torch.full((1, K), -128, dtype=torch.int8)
    acc = exact_accumulator(a, a)
    assert int(acc) == 2**31 and int(int32_wrap(acc)) == -(2**31)
    assert checks.int32_no_overflow(predict(a, a, acc), K).status == "fired"
    assert checks.int32_no_overflow(predict(a[:, 1:], a[:, 1:]), K - 1).status == "passed"
    one_sided = torch.full((1, K), 127, dtype=torch.int8)
    p = predict(a, one_sided)
    assert (p.product_bound, p.k_limit) == (16256, 132104)
    assert checks.int32_no_overflow(p, K).status == "passed"


def test_check_3_passes_at_max_acc_exactly_2_to_the_24_and_fires_one_above():
    """2²⁴ is the last integer of the run every integer of which fp32 holds (2²⁴ + 1 rounds to 2²⁴):
    max|acc| = 2²⁴ passes with 0 bits of headroom, 2²⁴ + 1 fires."""
    a = torch.full((1, 1024), -128, dtype=torch.int8)  # 1024 · 16384 = 2^24
    at = predict(a, a)
    assert at.max_abs_acc == 2**24 and at.headroom_bits == 0.0
    assert checks.lossless_fp32_entry(at).status == "passed"
    a1 = torch.cat([a, torch.ones((1, 1), dtype=torch.int8)], dim=1)
    above = predict(a1, a1)
    assert above.max_abs_acc == 2**24 + 1 and checks.lossless_fp32_entry(above).status == "fired"
    assert float(torch.tensor(2**24 + 1, dtype=torch.float32)) == 2**24  # the rounding check 3 guards


def test_pow2_identity_excludes_overflowing_results_where_the_orders_really_differ():
    """s_a = 2¹²⁰, s_w = 2⁻¹⁰, acc = 2¹⁰: `a_then_w` overflows (2¹³⁰ → inf) while `w_then_a` gives
    2¹²⁰. The outputs differ at every element, all of them are excluded as overflowing, and the
    check passes; counting them would fire it."""
    a = torch.full((2, 1), 32, dtype=torch.int8)
    w = torch.full((3, 1), 32, dtype=torch.int8)  # acc = 1024 = 2^10
    t = _tile(a, w, torch.full((2,), 2.0**120), torch.full((3,), 2.0**-10))
    unit = evaluate_unit(get_kernel("emulator:w_then_a"), get_kernel("emulator:a_then_w"), t, "pow2",
                         invariance=False)
    v = unit["verdicts"]["pow2-identity"]
    assert unit["n_differing"] == 6
    assert v["status"] == "passed" and v["evidence"]["n_excluded_subnormal_or_overflow"] == 6


def test_real_scale_tolerance_without_a_finite_pair_is_inapplicable_unless_the_non_finite_outputs_differ():
    inf = torch.full((2, 2), float("inf")).to(torch.bfloat16)
    v = checks.real_scale_tolerance(inf, inf.clone(), True)
    assert v.status == "inapplicable" and v.evidence["max_ulp"] is None and v.threshold == 1
    nan = torch.full((2, 2), float("nan")).to(torch.bfloat16)
    v = checks.real_scale_tolerance(inf, nan, True)
    assert v.status == "fired" and v.evidence["n_nonfinite_mismatch"] == 4 and v.evidence["max_ulp"] is None
