"""Every check fires on a constructed violation and stays silent on a conforming pair.

Ported to the typed pipeline of issue 12: a unit is `evaluate_unit(Pair, prepare(tile), regime)`'s
`UnitResult`, a run is `run_conformance(pair, source_from_tiles(tiles), regimes)`'s `Report`.
"""

import math

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

from alibi.conform import checks
from alibi.conform.pipeline import (
    Pair,
    check_device,
    evaluate_unit,
    prepare,
    run_conformance,
    source_from_tiles,
)
from alibi.conform.report import why_sentence
from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator, predict
from alibi.exact.numerics import bits, compare_outputs, ulp_distance
from alibi.kernels.base import Kernel
from alibi.kernels.registry import get_kernel
from alibi.tiles.tile import Tile


def unit(kernel_a, kernel_b, tile, regime="real", **kw):
    result, _evidence = evaluate_unit(Pair(kernel_a, kernel_b, "test"), prepare(tile, check_device()), regime, **kw)
    return result


def verdicts(kernel_a, kernel_b, tile, regime="real"):
    return {v.check: v for v in unit(kernel_a, kernel_b, tile, regime).verdicts}


def status(kernel_a, kernel_b, tile, check, regime="real"):
    return unit(kernel_a, kernel_b, tile, regime).verdict(check).status


def conform(pair, tiles, regimes, **kw):
    return run_conformance(pair, source_from_tiles(tiles, label="tiny"), regimes, **kw)


@pytest.fixture(scope="module")
def tile():
    return divergent_tile()


def test_a_conforming_pair_passes_every_applicable_check(tile):
    for regime in ("real", "pow2"):
        v = verdicts(Reference(), get_kernel("emulator:a_then_w"), tile, regime)
        assert set(v) == set(checks.CHECKS) and len(v) == 11, regime
        assert not any(x.fired for x in v.values()), regime
    assert verdicts(Reference(), Reference(), tile, "real")["token-level-risk"].status == "inapplicable"


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


def test_exact_accumulator_holds_an_int32_accumulator_to_the_wrapped_exact_sum_beyond_int32_range():
    """Check 4 on a tile whose exact accumulator leaves int32 (K = 132105 > the 16384-product bound, both signs):
    an int32 register holds the two's-complement wrap of the exact sum, so torch._int_mm's accumulator must pass and
    one holding any other int32 (here the exact sum saturated to the int32 range) must fire."""
    K = 132105
    a = torch.full((1, K), -128, dtype=torch.int8)
    w = torch.stack([torch.full((K,), -128, dtype=torch.int8), torch.full((K,), 127, dtype=torch.int8)])
    exact = exact_accumulator(a, w)
    assert exact.tolist() == [[16384 * K, -16256 * K]] and 16384 * K > 2**31 - 1 and -16256 * K < -(2**31)
    kernel = get_kernel("torch-cpu")
    wrapped = kernel.accumulator(a, w)
    assert wrapped.dtype == torch.int32 and wrapped.tolist() == [[16384 * K - 2**32, -16256 * K + 2**32]]
    v = checks.exact_accumulator(exact, wrapped, None)
    assert v.status == "passed" and v.evidence == {"exposed_by": ["a"]}
    saturated = exact.clamp(-(2**31), 2**31 - 1).to(torch.int32)
    v = checks.exact_accumulator(exact, wrapped, saturated)
    assert v.status == "fired" and sorted(v.evidence["mismatches"]) == ["b"]
    assert v.evidence["mismatches"]["b"] == {"n_differing": 2, "first": [0, 0], "got": 2**31 - 1,
                                             "expected": 16384 * K - 2**32}
    # the same through the pipeline: both arms expose int32 accumulators of a tile check 2 flags
    u = unit(kernel, Reference(), Tile("beyond-int32", a, torch.ones(1), w, torch.ones(2)), invariance=False)
    assert u.verdict("int32-no-overflow").status == "fired"
    assert u.verdict("exact-accumulator").status == "passed"


def test_pow2_identity_fires_on_any_bit_difference_and_applies_only_to_pow2_scales(tile):
    assert status(OneUlpUp(), Reference(), tile, "pow2-identity", "pow2") == "fired"
    assert status(get_kernel("emulator:w_then_a"), Reference(), tile, "pow2-identity", "pow2") == "passed"
    assert status(OneUlpUp(), Reference(), tile, "pow2-identity", "real") == "inapplicable"


def test_pow2_identity_excludes_subnormal_results():
    t = divergent_tile()
    t = t.replace(s_a=torch.full_like(t.s_a, 1.3 * 2**-126), s_w=torch.full_like(t.s_w, 2.0**-20))
    a, b = get_kernel("emulator:w_then_a"), get_kernel("emulator:a_then_w")
    v = unit(a, b, t, "pow2").verdict("pow2-identity")
    assert v.status == "passed" and v.evidence["n_excluded_subnormal_or_overflow"] > 0


def test_real_scale_tolerance_fires_above_one_ulp_and_carries_its_threshold(tile):
    v = verdicts(ThreeUlpsUp(), Reference(), tile)["real-scale-tolerance"]
    assert v.status == "fired" and v.threshold == 1 and v.evidence["max_ulp"] == 3
    v = verdicts(get_kernel("emulator:w_then_a"), Reference(), tile)["real-scale-tolerance"]
    assert v.status == "passed" and v.evidence["max_ulp"] == 1
    assert not verdicts(ThreeUlpsUp(), Reference(), tile)["real-scale-tolerance"].exact


def test_real_scale_tolerance_fires_when_only_one_side_is_not_finite():
    a = torch.tensor([1.0, float("inf")], dtype=torch.bfloat16)
    b = torch.tensor([1.0, 3.0e38], dtype=torch.bfloat16)
    assert checks.real_scale_tolerance(compare_outputs(a, b), True).fired


@pytest.mark.parametrize("threshold", [1, 2, 5])
def test_real_scale_tolerance_passes_at_exactly_its_threshold_and_fires_one_ulp_above(threshold):
    a = torch.tensor([1.0, -3.5, 1000.0], dtype=torch.bfloat16)

    def ulps_up(n):  # every element n ulps away from a (bf16 bit patterns of positive steps)
        return (a.view(torch.int16) + torch.tensor([n, -n, n], dtype=torch.int16)).view(torch.bfloat16)

    at = checks.real_scale_tolerance(compare_outputs(a, ulps_up(threshold)), True, threshold=threshold)
    assert ulp_distance(a, ulps_up(threshold)).tolist() == [threshold] * 3
    assert not at.fired and at.evidence["max_ulp"] == threshold and at.evidence["n_over_threshold"] == 0
    above = checks.real_scale_tolerance(compare_outputs(a, ulps_up(threshold + 1)), True, threshold=threshold)
    assert above.fired and above.evidence["n_over_threshold"] == 3


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
    report = conform(pair, tiles, ["real"])
    paper_seven = ["shared-operands", "int32-no-overflow", "lossless-fp32-entry", "exact-accumulator",
                   "pow2-identity", "real-scale-tolerance", "token-level-risk"]
    assert not any(report.check(c).fired for c in paper_seven)
    assert report.check("epilogue-model").fired


def test_epilogue_model_is_silent_when_each_arm_equals_its_declared_model(tile):
    v = verdicts(get_kernel("emulator:w_then_a"), get_kernel("emulator:a_then_w"), tile)["epilogue-model"]
    assert v.status == "passed"


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
    report = conform(Pair(undeclared("w_then_a"), undeclared("a_then_w"), "test"), tiles, ["real"])
    assert report.tiles[0].n_differing > 0  # the arms really differ
    assert report.verdict == "inconclusive"
    assert [why.split(":")[0] for why in report.inconclusive_because] == ["epilogue-model"]
    declared = conform(Pair(get_kernel("emulator:w_then_a"), get_kernel("emulator:a_then_w"), "test"), tiles,
                       ["real"])
    assert declared.verdict == "pass"


# --- issue 16: branches no test reached ----------------------------------------------------------

def _tile(a: torch.Tensor, w: torch.Tensor, s_a: torch.Tensor | None = None, s_w: torch.Tensor | None = None):
    from alibi.tiles.tile import Tile

    return Tile("edge", a, torch.ones(a.shape[0]) if s_a is None else s_a, w,
                torch.ones(w.shape[0]) if s_w is None else s_w).validate()


def test_check_2_uses_the_16384_bound_exactly_when_both_operands_contain_minus_128():
    """16384·131071 < 2³¹ ≤ 16384·131072: all −128 operands at K = 131072 really wrap an int32
    (to −2³¹), so check 2 must fire there and pass one K earlier; with −128 in one operand only the
    bound is 16256 and K = 131072 is safe."""
    from alibi.exact.emulator import int32_wrap

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
    u = unit(get_kernel("emulator:w_then_a"), get_kernel("emulator:a_then_w"), t, "pow2", invariance=False)
    v = u.verdict("pow2-identity")
    assert u.n_differing == 6
    assert v.status == "passed" and v.evidence["n_excluded_subnormal_or_overflow"] == 6


def test_real_scale_tolerance_without_a_finite_pair_is_inapplicable_unless_the_non_finite_outputs_differ():
    inf = torch.full((2, 2), float("inf")).to(torch.bfloat16)
    v = checks.real_scale_tolerance(compare_outputs(inf, inf.clone()), True)
    assert v.status == "inapplicable" and v.evidence["max_ulp"] is None and v.threshold == 1
    nan = torch.full((2, 2), float("nan")).to(torch.bfloat16)
    v = checks.real_scale_tolerance(compare_outputs(inf, nan), True)
    assert v.status == "fired" and v.evidence["n_nonfinite_mismatch"] == 4 and v.evidence["max_ulp"] is None


@pytest.mark.parametrize("threshold", [0, 1, 3])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_real_scale_tolerance_passes_a_pair_exactly_threshold_ulps_apart_and_fires_at_threshold_plus_one(threshold,
                                                                                                         dtype):
    """Check 6's boundary: `d > threshold` fires. The pairs are built on bit patterns (one ulp is one step of the
    pattern within a binade), so each distance is exactly the one named; one element stays equal."""
    out_a = torch.tensor([1.0, -3.5, 0.0, 1000.0], dtype=dtype)
    for distance, status in ((threshold, "passed"), (threshold + 1, "fired")):
        out_b = out_a.clone()
        b = bits(out_b)  # a view: writing it moves out_b
        b[0] += distance  # 1.0 up
        b[1] += distance  # -3.5 away from zero
        b[3] -= distance  # 1000 down
        assert ulp_distance(out_a, out_b).tolist() == [distance, distance, 0, distance]
        v = checks.real_scale_tolerance(compare_outputs(out_a, out_b), True, threshold)
        assert v.status == status, (distance, v.detail)
        assert v.threshold == threshold and v.evidence["max_ulp"] == distance
        assert v.evidence["n_over_threshold"] == (3 if status == "fired" else 0)


# --- issue 12: bias-aware checks, predicted against observed, near-zero elements ------------------

class OneElementOff(Reference):
    """Reference (declared a_then_w+fma), but element (0, 0) one ulp up: off its declared model at one element."""

    name = "one-element-off"

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        from alibi.exact.numerics import bits

        out = super().scaled_mm(a_q, s_a, w_q, s_w, bias, out_dtype)
        b = bits(out).clone()
        b[0, 0] += 1
        return b.view(out_dtype)


def _probe_bias_tile():
    """The `epilogue-probe-bias` tile: fp32 scales searched so the orders disagree often, and an fp32 bias
    that cancels one row per column (values near zero), so the bias modes tell apart."""
    from alibi.tiles.synthetic import synthetic_tiles

    (t,) = synthetic_tiles("epilogue-probe-bias", seed=0)
    assert t.bias is not None
    return t


def test_pow2_identity_is_inapplicable_naming_the_bias_handling_when_the_declared_bias_modes_differ():
    """Issue 12 item 3: a fused bias (`fma`) and a bias added after the output cast round differently
    whatever the scales, so under power-of-two scales the two correct arms still differ (thousands of
    elements here) — the old check fired on that with a wrong reason. Now it is inapplicable, naming
    the bias handling, and the pair's verdict rests on predicted-differences, which applies and passes:
    every element where they differ is one where their declared models differ."""
    t = _probe_bias_tile()
    pair = Pair(get_kernel("emulator:a_then_w"), get_kernel("emulator:a_then_w+add_after_cast"), "test")
    report = conform(pair, [t], ["pow2"])
    (u,) = report.tiles
    assert u.bias and u.n_differing > 0  # the old pow2-identity would have fired here
    v = u.verdict("pow2-identity")
    assert v.status == "inapplicable" and v.evidence["reason"] == "bias-handling"
    assert v.evidence["bias_modes"] == ["fma", "add_after_cast"] and "fma vs add_after_cast" in v.detail
    pd = u.verdict("predicted-differences")
    assert pd.status == "passed" and pd.evidence["n_predicted"] == pd.evidence["n_observed"] == u.n_differing
    assert u.explained is True and u.cause == "bias mode"
    assert report.check("pow2-identity").status == "inapplicable"
    assert report.check("predicted-differences").status == "passed"
    assert report.verdict == "pass" and report.inconclusive_because == ()
    # Same bias handling on both arms: the identity applies again (and holds, the orders being pow2-exact).
    same = unit(get_kernel("emulator:w_then_a"), get_kernel("emulator:a_then_w"), t, "pow2", invariance=False)
    assert same.verdict("pow2-identity").status == "passed"


def test_predicted_differences_fires_on_an_element_where_an_arm_leaves_its_declared_model(tile):
    """Both arms declare a_then_w+fma, so the models predict no difference; one arm is one ulp off at
    (0, 0) only. That element is a difference the declared models do not predict: the check fires,
    pointing at it, and the unit is not explained (no cause named)."""
    for regime in ("real", "pow2"):
        u = unit(OneElementOff(), Reference(), tile, regime, invariance=False)
        v = u.verdict("predicted-differences")
        assert u.n_differing == 1 and u.n_predicted == 0, regime
        assert v.status == "fired" and v.evidence["n_unpredicted"] == 1 and v.evidence["first"] == [0, 0], regime
        assert v.evidence["n_predicted_not_observed"] == 0
        assert u.explained is False and u.cause is None
    assert unit(Reference(), Reference(), tile, "real", invariance=False).verdict(
        "predicted-differences").status == "passed"


def test_predicted_differences_fires_when_a_predicted_difference_does_not_happen(tile):
    """The converse finding: arm a declares a_then_w but gives w_then_a's bits at one element where the two
    orders differ; against a w_then_a arm that element was predicted to differ and does not."""
    from alibi.exact.emulator import run_model

    wa, aw = run_model(EpilogueModel("w_then_a"), tile), run_model(EpilogueModel("a_then_w"), tile)
    r, c = (wa != aw).nonzero()[0].tolist()

    class TakesTheOtherOrderOnce(Reference):
        name = "other-order-once"

        def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
            out = super().scaled_mm(a_q, s_a, w_q, s_w, bias, out_dtype).clone()
            out[r, c] = apply_epilogue(EpilogueModel("w_then_a"), exact_accumulator(a_q, w_q), s_a, s_w, bias,
                                       out_dtype)[r, c]
            return out

    u = unit(TakesTheOtherOrderOnce(), get_kernel("emulator:w_then_a"), tile, "real", invariance=False)
    v = u.verdict("predicted-differences")
    assert v.status == "fired" and v.evidence["n_unpredicted"] == 0
    assert v.evidence["n_predicted_not_observed"] == 1 and v.evidence["first"] == [r, c]
    assert u.n_predicted == u.n_differing + 1 and u.explained is False


def _exact_bias_mode_difference(t, row, col):
    """At one element, with rational arithmetic (tests/exact_reference.py), the fp32 products of the two
    scale orders, and the bf16 outputs of w_then_a+add_before_cast and a_then_w+fma."""
    from fractions import Fraction

    from exact_reference import BF16, FP32, round_nearest_even

    acc = int((t.a_q[row].to(torch.int64) * t.w_q[col].to(torch.int64)).sum())
    s_a, s_w, b = (Fraction(float(x)) for x in (t.s_a[row], t.s_w[col], t.bias[col].float()))

    def rn32(x):
        return round_nearest_even(x, FP32)

    x = rn32(Fraction(acc))  # the int32 accumulator entering fp32
    w_then_a = rn32(s_a * rn32(s_w * x))
    a_then_w = rn32(s_w * rn32(s_a * x))
    out_a = round_nearest_even(rn32(w_then_a + b), BF16)  # add_before_cast: product rounded, then the add
    out_b = round_nearest_even(rn32(s_w * rn32(s_a * x) + b), BF16)  # fma: one rounding of product + bias
    return w_then_a, a_then_w, out_a, out_b


def test_torch_cpu_against_a_then_w_on_the_biased_smollm2_preset_is_explained_unit_by_unit_with_its_cause():
    """torch-cpu declares w_then_a+add_before_cast, emulator:a_then_w is a_then_w+fma: both the scale order
    and the bias mode differ. On `smollm2-135m-bias` at 16 rows every unit is explained (the arms differ
    exactly where the declared models do), and each differing unit names its cause. The cause is checked
    independently: at every differing element the two scale orders give the same fp32 product (rational
    arithmetic), so only the bias handling can separate the arms, and the rational outputs of the two
    declared models are the reported values."""
    from alibi.conform.pipeline import source_from_preset

    pair = Pair(get_kernel("torch-cpu"), get_kernel("emulator:a_then_w"), "test")
    source = source_from_preset("smollm2-135m-bias", rows=16)
    report = run_conformance(pair, source, ["real", "pow2"], invariance=False)
    assert len(report.tiles) == 14 and all(u.bias for u in report.tiles)
    assert all(u.explained is True for u in report.tiles)
    differing = [u for u in report.tiles if u.n_differing]
    assert differing  # the claim is about something
    assert all(u.cause is None for u in report.tiles if not u.n_differing)
    tiles = {t.name: t for t in source.tiles}
    for u in differing:
        assert u.cause == "bias mode", (u.tile, u.regime)
        t = tiles[u.tile]
        if u.regime == "pow2":
            from alibi.exact.numerics import pow2_round

            t = t.replace(s_w=pow2_round(t.s_w, "nearest"))
        assert u.differences.count == len(u.differences.elements) == u.n_differing
        for e in u.differences.elements:
            w_then_a, a_then_w, out_a, out_b = _exact_bias_mode_difference(t, e.row, e.column)
            assert w_then_a == a_then_w  # the scale order did not change the product here
            assert (e.a, e.b) == (float(out_a), float(out_b)) and out_a != out_b
    assert report.verdict == "pass"
    assert "how they add the bias" in why_sentence(report)


def test_real_scale_tolerance_does_not_hold_elements_below_the_near_zero_floor_to_the_ulp_threshold():
    """Issue 12 item 3: on the probe tile with a cancelling bias, `fma` and `add_before_cast` (same scale
    order) differ only where the bias cancels the product: every such element's exact value lies below
    the floor 2^-8·max|exact| (bf16's 8 significand bits), and there they are up to a dozen ulps apart —
    cancellation, not the kernels. The old check fired on those ulps; it now passes (0 ulp above the
    floor) and the unit reports them as near-zero differences."""
    from alibi.exact.emulator import run_model
    from alibi.exact.numerics import ulp_distance

    t = _probe_bias_tile()
    a, b = EpilogueModel("w_then_a", "fma"), EpilogueModel("w_then_a", "add_before_cast")
    u = unit(get_kernel("emulator:w_then_a"), get_kernel("emulator:w_then_a+add_before_cast"), t, "real",
             invariance=False)
    # An independent look at the same outputs: the exact values in fp64, the ulp distances of the models.
    acc = exact_accumulator(t.a_q, t.w_q).to(torch.float64)
    exact = acc * t.s_a.double().reshape(-1, 1) * t.s_w.double().reshape(1, -1) + t.bias.double().reshape(1, -1)
    floor = float(exact.abs().max()) * 2.0**-8
    assert u.near_zero_floor == pytest.approx(floor, rel=1e-12)  # fp64 sums of products: not bit-for-bit
    out_a, out_b = run_model(a, t), run_model(b, t)
    d = ulp_distance(out_a, out_b)
    near = exact.abs() < floor
    over = d > 1
    assert bool(over.any()) and not bool((over & ~near).any())  # the only >1-ulp elements are near zero
    differs = out_a != out_b
    assert u.n_differing == int(differs.sum()) > 0 and u.max_ulp == int(d.max()) > 1
    assert u.n_near_zero == int(near.sum()) and u.n_differing_near_zero == int((differs & near).sum()) > 0
    assert u.max_ulp_above_floor == int(d[~near].max()) <= 1
    v = u.verdict("real-scale-tolerance")
    assert v.status == "passed" and v.evidence["max_ulp"] <= 1 and v.evidence["max_ulp_near_zero"] == u.max_ulp
    # Without the near-zero split (the old behaviour) the same outputs fire the check.
    assert checks.real_scale_tolerance(compare_outputs(out_a, out_b), True, 1).status == "fired"
    assert checks.real_scale_tolerance(compare_outputs(out_a, out_b), True, 1, near=near).status == "passed"



def _all_zero_tile():
    """A tile whose every accumulator (and so every exact value) is 0: a zero activation block."""
    from alibi.tiles.tile import Tile

    return Tile("zeros", torch.zeros((4, 8), dtype=torch.int8), torch.ones(4), torch.ones((3, 8), dtype=torch.int8),
                torch.ones(3)).validate()


def test_a_tile_whose_accumulators_are_all_zero_gives_a_report_that_serializes():
    """max|acc| = 0 has infinite headroom; the unit already writes that as null (`headroom_bits`), and the
    lossless-fp32-entry verdict must too, or `alibi conform` dies writing report.json."""
    report = conform(Pair(Reference(), get_kernel("emulator:a_then_w"), "test"), [_all_zero_tile()],
                     ["real", "pow2"], invariance=False)
    assert report.verdict == "pass" and all(u.max_abs_acc == 0 and u.headroom_bits is None for u in report.tiles)
    from alibi.conform.results import Report

    assert Report.from_json(report.to_json()).check("lossless-fp32-entry").status == "passed"


class SignedZeroes(Reference):
    """Reference, but every +0 output returned as −0: off its declared model in the sign bit only."""

    name = "signed-zeroes"

    def scaled_mm(self, a_q, s_a, w_q, s_w, bias=None, out_dtype=torch.bfloat16):
        out = super().scaled_mm(a_q, s_a, w_q, s_w, bias, out_dtype)
        return torch.where(out == 0, -out, out)


def test_a_sign_bit_difference_on_an_all_zero_tile_has_no_nan_relative_difference():
    """Every exact value of this tile is 0, so the near-zero floor is 0 and no element counts as near zero;
    an arm returning −0 for +0 differs in the sign bit only (0 ulp). The epilogue-model check fires, and
    the relative difference over the elements above the floor is a number (0) or absent, never NaN: a
    relative difference over an exact value of 0 is not defined."""
    report = conform(Pair(SignedZeroes(), Reference(), "test"), [_all_zero_tile()], ["real"], invariance=False)
    (u,) = report.tiles
    assert u.n_differing == 12 and u.max_ulp == 0 and u.near_zero_floor == 0.0
    assert report.check("epilogue-model").fired and report.verdict == "fail"
    assert u.max_rel_diff_above_floor is None or not math.isnan(u.max_rel_diff_above_floor)
