"""The mutants: each fault changes output bits on a tile built to expose it, and only in the way it claims.

Every mutant lies (it declares its base's epilogue model); these tests hold each one to the fault
it is named after, on CPU bases (torch-cpu, the emulator) and on the real Triton kernel under the
interpreter, including the native in-kernel variants.
"""

import os
import subprocess
import sys

import pytest
import torch

from alibi.conform.pipeline import Pair, check_device, evaluate_unit, prepare, run_conformance, source_from_tiles
from alibi.errors import InputError
from alibi.exact.emulator import (
    BIAS_MODES,
    ORDERS,
    EpilogueModel,
    apply_epilogue,
    exact_accumulator,
    int32_wrap,
)
from alibi.exact.numerics import (
    bits,
    bitwise_equal,
    bitwise_equal_mask,
    is_subnormal,
    max_ulp_distance,
)
from alibi.kernels.mutants import (
    FAULTS,
    SMALL_M,
    MutantKernel,
    Severity,
    epilogue_finish,
    epilogue_parts,
    round_toward_zero,
    saturating_pair_accumulator,
)
from alibi.kernels.registry import get_kernel
from alibi.kernels.triton_int8 import TruncatingTritonKernel
from alibi.tiles.exposing import (
    EXPOSING_TILES,
    exposing_tile,
    fp32_partials_tile,
    subnormal_outputs_tile,
)
from alibi.tiles.tile import Tile

ISSUE_NAMES = ["scale-bf16", "double-round", "reassociate", "truncate-cast", "scale-in-reduction", "int32-wrap",
               "fp32-accumulate", "null", "operand-step", "scale-ulp", "reseed", "flush-subnormal",
               "m-dependent-order", "splitk-fp32", "sat16-pairs", "nondeterministic", "unfused-bias", "ignore-bias",
               "wrong-row-scale"]


def _unit(kernel_a, kernel_b, tile, regime, **kw):
    """One unit of the conformance pipeline: `tile` prepared on the check device, both arms run under `regime`."""
    unit, _evidence = evaluate_unit(Pair(kernel_a, kernel_b, "test"), prepare(tile, check_device()), regime, **kw)
    return unit


@pytest.fixture(scope="module")
def tiles():
    return {name: exposing_tile(name) for name in EXPOSING_TILES}


def copy(tile: Tile) -> Tile:
    return tile.replace(a_q=tile.a_q.clone(), s_a=tile.s_a.clone(), w_q=tile.w_q.clone(), s_w=tile.s_w.clone())


def changed(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((~bitwise_equal_mask(a, b)).sum())


def base_for(fault_name: str) -> str:
    # unfused-bias only exists where a fused bias is declared: the vLLM-CUTLASS model on the CPU.
    return "emulator:w_then_a" if fault_name == "unfused-bias" else "torch-cpu"


# --- the catalogue ------------------------------------------------------------------------------

def test_the_catalogue_holds_exactly_the_faults_the_issue_names():
    assert list(FAULTS) == ISSUE_NAMES


@pytest.mark.parametrize("name", ISSUE_NAMES)
def test_every_mutant_resolves_by_name_and_declares_its_base_epilogue_model(name):
    base = base_for(name)
    kernel = get_kernel(f"mutant:{name}:{base}")
    assert isinstance(kernel, MutantKernel)
    assert kernel.name == f"mutant:{name}:{base}"
    assert kernel.epilogue == get_kernel(base).epilogue
    assert kernel.available()[0]


def test_severity_names_resolve_and_out_of_range_or_unknown_severities_are_refused():
    assert get_kernel("mutant:scale-bf16@pct:torch-cpu").severity == Severity("pct", 0.01)
    assert get_kernel("mutant:scale-bf16@2.5%:torch-cpu").severity.fraction == 0.025
    assert get_kernel("mutant:scale-bf16@all:torch-cpu").name == "mutant:scale-bf16@all:torch-cpu"
    for bad, why in (("150%", "out of range"), ("0%", "out of range"), ("half", "unknown")):
        with pytest.raises(InputError, match=why):
            get_kernel(f"mutant:scale-bf16@{bad}:torch-cpu")
    with pytest.raises(InputError, match="has no severities"):
        get_kernel("mutant:null@one:torch-cpu")
    with pytest.raises(InputError, match="unknown fault"):
        get_kernel("mutant:bit-flip:torch-cpu")


def test_faults_that_cannot_exist_for_a_base_are_refused_by_name():
    with pytest.raises(InputError, match="already is unfused"):
        get_kernel("mutant:unfused-bias:torch-cpu")
    with pytest.raises(InputError, match="int8"):
        get_kernel("mutant:scale-bf16:triton-fp8")
    with pytest.raises(InputError, match="product_first epilogue unchanged"):
        get_kernel("mutant:m-dependent-order:emulator:product_first")


def test_a_mutant_of_a_base_that_cannot_run_here_is_unavailable_with_the_base_s_reason():
    if torch.cuda.is_available():
        pytest.skip("cutlass runs here")
    kernel = get_kernel("mutant:scale-bf16:cutlass")
    ok, reason = kernel.available()
    assert not ok and "no CUDA GPU" in reason


@pytest.mark.parametrize("label,n,expected", [("one", 1000, 1), ("pct", 1000, 10), ("pct", 40, 1), ("all", 37, 37),
                                              ("5%", 200, 10)])
def test_a_severity_selects_a_fixed_number_of_entries_the_same_ones_every_time(label, n, expected):
    sev = Severity.parse(label)
    picked = sev.select(n)
    assert len(picked) == expected == len(set(picked.tolist()))
    assert torch.equal(picked, sev.select(n))


# --- the exact programs the wrappers recompute with -----------------------------------------------

@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("bias_mode", BIAS_MODES)
def test_the_wrappers_epilogue_program_equals_the_emulator_bit_for_bit_for_every_model(tiles, order, bias_mode):
    """Without a fault in it, the program the mutants recompute from is the emulator's own."""
    tile = tiles["epilogue-probe-bias"]
    model = EpilogueModel(order, bias_mode)
    acc = exact_accumulator(tile.a_q, tile.w_q)
    first, last = epilogue_parts(order, int32_wrap(acc).to(torch.float32), tile.s_a, tile.s_w)
    ours = epilogue_finish(bias_mode, first, last, tile.bias, tile.out_dtype)
    assert bitwise_equal(ours, apply_epilogue(model, acc, tile.s_a, tile.s_w, tile.bias, tile.out_dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_round_toward_zero_never_increases_a_magnitude_and_differs_from_nearest_by_at_most_one_ulp(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1 << 15, generator=g) * torch.exp2(torch.randint(-20, 20, (1 << 15,), generator=g).float())
    edges = torch.tensor([0.0, -0.0, 65519.99, 65520.0, 3.4028235e38, -3.4028235e38, 1e-45, 2.0**-126])
    x = torch.cat([x, edges])
    rtz, rne = round_toward_zero(x, dtype), x.to(dtype)
    assert bool((rtz.float().abs() <= x.abs()).all())
    assert max_ulp_distance(rtz, rne) == 1
    exact = rne.float() == x
    assert torch.equal(bits(rtz[exact]), bits(rne[exact]))  # representable values are kept as they are
    assert bool(torch.isfinite(round_toward_zero(torch.tensor([1e6]), torch.float16)).all())  # no overflow to inf


@pytest.mark.parametrize("M,K,N", [(5, 33, 7), (16, 256, 64), (3, 1, 2)])
def test_saturating_pairs_equal_a_lane_by_lane_saturating_sum(M, K, N):
    """Against the definition itself: every int16 lane formed, clipped and summed (odd K: a zero pads the last pair)."""
    g = torch.Generator().manual_seed(M + K + N)
    a_q = torch.randint(-128, 128, (M, K), generator=g, dtype=torch.int8)
    w_q = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
    a, w = a_q.long() + 128, w_q.long()
    if K % 2:
        a, w = torch.nn.functional.pad(a, (0, 1)), torch.nn.functional.pad(w, (0, 1))
    lanes = (a[:, None, 0::2] * w[None, :, 0::2] + a[:, None, 1::2] * w[None, :, 1::2]).clamp(-32768, 32767)
    assert torch.equal(saturating_pair_accumulator(a_q, w_q), lanes.sum(-1) - 128 * w_q.long().sum(1)[None])


def test_saturating_pairs_equal_the_exact_accumulator_until_a_pair_leaves_the_int16_range():
    g = torch.Generator().manual_seed(1)
    small_a = torch.randint(-128, -60, (5, 33), generator=g, dtype=torch.int8)  # a + 128 ≤ 67: pairs ≤ 17,018
    small_w = torch.randint(-127, 128, (7, 33), generator=g, dtype=torch.int8)
    assert torch.equal(saturating_pair_accumulator(small_a, small_w), exact_accumulator(small_a, small_w))
    big = torch.full((1, 2), 127, dtype=torch.int8)  # (127 + 128)·127 · 2 = 64,770 clips to 32,767
    assert int(saturating_pair_accumulator(big, big)) == 32767 - 128 * 254
    assert int(exact_accumulator(big, big)) == 2 * 127 * 127


# --- each mutant is observable on the tile built to expose it -----------------------------------------

OUTPUT_FAULTS = [n for n in ISSUE_NAMES if n not in ("null", "m-dependent-order", "nondeterministic")]


@pytest.mark.parametrize("name", OUTPUT_FAULTS)
def test_each_mutant_changes_output_bits_on_the_tile_built_to_expose_it(tiles, name):
    fault = FAULTS[name]
    base = get_kernel(base_for(name))
    tile = tiles[fault.exposed_by]
    reference = base.run(tile).out
    mutant = get_kernel(f"mutant:{name}:{base.name}")
    out = mutant.run(copy(tile)).out
    assert out.dtype == reference.dtype and out.shape == reference.shape
    assert changed(out, reference) > 0, f"{name} changed no bit on {tile.name}"


def test_m_dependent_order_is_invisible_at_full_m_and_changes_bits_in_a_small_m_launch(tiles):
    tile = tiles["epilogue-probe"]
    assert tile.M > SMALL_M
    base, mutant = get_kernel("torch-cpu"), get_kernel("mutant:m-dependent-order:torch-cpu")
    assert changed(mutant.run(copy(tile)).out, base.run(tile).out) == 0
    rows = tile.rows(torch.arange(48, 64))
    assert changed(mutant.run(copy(rows)).out, base.run(rows).out) > 0
    swapped = apply_epilogue(EpilogueModel("a_then_w", "add_before_cast"), exact_accumulator(rows.a_q, rows.w_q),
                             rows.s_a, rows.s_w)
    assert bitwise_equal(mutant.run(copy(rows)).out, swapped)


def test_nondeterministic_mutant_gives_different_bits_from_one_run_to_the_next(tiles):
    tile = tiles["fp32-partials"]
    mutant = get_kernel("mutant:nondeterministic:torch-cpu")
    outs = [mutant.run(copy(tile)).out for _ in range(4)]
    assert any(changed(outs[0], o) for o in outs[1:])


def test_null_mutant_is_bitwise_its_base_on_every_exposing_tile(tiles):
    base, null = get_kernel("torch-cpu"), get_kernel("mutant:null:torch-cpu")
    for tile in tiles.values():
        a, b = base.run(tile, accumulator=True), null.run(copy(tile), accumulator=True)
        assert bitwise_equal(a.out, b.out) and torch.equal(a.acc, b.acc)


# --- each fault does what its name says -----------------------------------------------------------

def test_severity_one_changes_exactly_one_element_and_pct_about_one_percent(tiles):
    tile = tiles["epilogue-probe"]  # int32-wrap changes every element it touches
    reference = get_kernel("torch-cpu").run(tile).out
    n = reference.numel()
    for label, expected in (("one", 1), ("pct", round(0.01 * n)), ("all", n)):
        out = get_kernel(f"mutant:int32-wrap@{label}:torch-cpu").run(copy(tile)).out
        assert changed(out, reference) == expected, label


def test_int32_wrap_exposes_a_sign_flipped_accumulator_that_check_4_sees(tiles):
    tile = tiles["epilogue-probe"]
    result = get_kernel("mutant:int32-wrap:torch-cpu").run(copy(tile), accumulator=True)
    exact = exact_accumulator(tile.a_q, tile.w_q)
    assert torch.equal(result.acc.long(), int32_wrap(exact + 2**31).long())
    nonzero = exact != 0
    assert bool((torch.sign(result.acc.long()[nonzero]) != torch.sign(exact[nonzero])).all())


def test_a_faithful_int32_wrap_is_invisible_against_an_int32_base_and_check_2_flags_the_tile():
    """Why int32-wrap injects the symptom: every int32 kernel wraps the same way beyond 2³¹, so only check 2
    (a property of the tile, firing for the null mutant too) can speak there."""
    K = 132105
    a = torch.full((1, K), -128, dtype=torch.int8)
    w = torch.full((2, K), -128, dtype=torch.int8)
    exact = exact_accumulator(a, w)
    assert int(exact[0, 0]) == 128 * 128 * K > 2**31
    assert torch.equal(get_kernel("torch-cpu").accumulator(a, w), int32_wrap(exact))
    tile = Tile("deep", a, torch.ones(1), w, torch.ones(2))
    unit = _unit(get_kernel("torch-cpu"), get_kernel("mutant:null:torch-cpu"), tile, "real", invariance=False)
    assert unit.verdict("int32-no-overflow").status == "fired"
    assert unit.bitwise_equal


def test_fp32_reductions_are_exact_while_partial_sums_stay_below_2_pow_24_and_round_beyond(tiles):
    probe, partials = tiles["epilogue-probe"], tiles["fp32-partials"]
    assert exact_accumulator(partials.a_q, partials.w_q).abs().max() <= 128  # check 3 stays silent on it
    for name in ("fp32-accumulate", "splitk-fp32"):
        mutant = get_kernel(f"mutant:{name}:torch-cpu")
        probe_run = mutant.run(copy(probe), accumulator=True)
        assert torch.equal(probe_run.acc.long(), exact_accumulator(probe.a_q, probe.w_q)), name
        wrong = mutant.run(copy(partials), accumulator=True).acc.long() != exact_accumulator(partials.a_q, partials.w_q)
        assert bool(wrong.any()), name


def test_scale_bf16_is_invisible_when_the_weight_scales_already_are_bf16_numbers(tiles):
    """Checkpoints store bf16 scales, so this fault only exists for fp32 weight scales (as on the probe)."""
    tile = tiles["epilogue-probe"]
    bf16_scales = tile.replace(s_w=tile.s_w.to(torch.bfloat16).to(torch.float32))
    base, mutant = get_kernel("torch-cpu"), get_kernel("mutant:scale-bf16:torch-cpu")
    assert changed(mutant.run(copy(bf16_scales)).out, base.run(bf16_scales).out) == 0
    assert changed(mutant.run(copy(tile)).out, base.run(tile).out) > 0


def test_flush_subnormal_zeroes_exactly_the_subnormal_outputs_and_keeps_their_sign():
    tile = subnormal_outputs_tile()
    reference = get_kernel("torch-cpu").run(tile).out
    out = get_kernel("mutant:flush-subnormal:torch-cpu").run(copy(tile)).out
    sub = is_subnormal(reference)
    assert int(sub.sum()) > 0.2 * sub.numel()
    assert bool((out[sub] == 0).all()) and torch.equal(torch.signbit(out[sub]), torch.signbit(reference[sub]))
    assert bitwise_equal(out[~sub], reference[~sub])


def test_ignore_bias_equals_the_base_without_its_bias_and_unfused_bias_equals_add_before_cast(tiles):
    tile = tiles["epilogue-probe-bias"]
    acc = exact_accumulator(tile.a_q, tile.w_q)
    out = get_kernel("mutant:ignore-bias:torch-cpu").run(copy(tile)).out
    assert bitwise_equal(out, apply_epilogue(get_kernel("torch-cpu").epilogue, acc, tile.s_a, tile.s_w, None))
    out = get_kernel("mutant:unfused-bias:emulator:w_then_a").run(copy(tile)).out
    assert bitwise_equal(out, apply_epilogue(EpilogueModel("w_then_a", "add_before_cast"), acc, tile.s_a, tile.s_w,
                                             tile.bias))


def test_wrong_row_scale_uses_the_next_row_s_scale_and_is_a_no_op_for_a_single_row(tiles):
    tile = tiles["epilogue-probe"]
    out = get_kernel("mutant:wrong-row-scale:torch-cpu").run(copy(tile)).out
    expected = apply_epilogue(get_kernel("torch-cpu").epilogue, exact_accumulator(tile.a_q, tile.w_q),
                              tile.s_a.roll(-1), tile.s_w)
    assert bitwise_equal(out, expected)
    one = tile.rows(torch.arange(3, 4))
    assert changed(get_kernel("mutant:wrong-row-scale:torch-cpu").run(copy(one)).out,
                   get_kernel("torch-cpu").run(one).out) == 0


@pytest.mark.parametrize("name,operand,n_changed", [("operand-step", "a_q", 1), ("scale-ulp", "s_a", 1),
                                                    ("reseed", "a_q", None)])
def test_operand_faults_rewrite_the_operands_the_arm_holds_and_conform_s_tile_stays_untouched(tiles, name, operand,
                                                                                             n_changed):
    tile = tiles["epilogue-probe"]
    held = copy(tile)
    get_kernel(f"mutant:{name}@one:torch-cpu").run(held)
    diff = getattr(held, operand) != getattr(tile, operand)  # int8 values / positive finite scales: exact
    rows_changed = diff.reshape(diff.shape[0], -1).any(1)
    if n_changed is None:
        assert int(rows_changed.sum()) == 1  # one reseeded row
    else:
        assert int(diff.sum()) == n_changed
    before = copy(tile)
    unit = _unit(get_kernel("torch-cpu"), get_kernel(f"mutant:{name}@one:torch-cpu"), tile, "real", invariance=False)
    assert unit.verdict("shared-operands").status == "fired"
    for key in ("a_q", "s_a", "w_q", "s_w"):
        assert torch.equal(getattr(tile, key), getattr(before, key))


def test_a_mutant_of_a_faulty_fp32_partials_tile_is_caught_by_check_4_while_checks_2_and_3_stay_silent(tiles):
    report = run_conformance(Pair(get_kernel("torch-cpu"), get_kernel("mutant:fp32-accumulate:torch-cpu"), "test"),
                             source_from_tiles([tiles["fp32-partials"]], label="fp32-partials"), ["real"],
                             invariance=False)
    by = {c.check: c.status for c in report.checks}
    assert by["exact-accumulator"] == "fired"
    assert by["int32-no-overflow"] == by["lossless-fp32-entry"] == "passed"


# --- the real Triton kernel: wrappers and native variants --------------------------------------------

def test_the_original_truncating_mutant_keeps_its_name_and_native_implementation():
    assert isinstance(get_kernel("mutant:truncate-cast:triton"), TruncatingTritonKernel)


@pytest.fixture(scope="module")
def small_partials():
    return fp32_partials_tile(M=5, N=9)  # K = 3072: partial sums pass 2^24


@pytest.mark.parametrize("name", ["truncate-cast", "fp32-accumulate", "splitk-fp32", "scale-bf16"])
def test_native_triton_variants_equal_their_wrapper_around_triton_bit_for_bit(tiles, small_partials, name):
    """The fault inside the kernel and the fault injected around it are the same arithmetic."""
    native = get_kernel(f"mutant:{name}:triton-native")
    wrapper = get_kernel(f"mutant:{name}:triton")
    assert native.epilogue == wrapper.epilogue == get_kernel("triton").epilogue
    tile = small_partials if name in ("fp32-accumulate", "splitk-fp32") else tiles["epilogue-probe"].rows(
        torch.arange(0, 8))
    a, b = native.run(copy(tile), accumulator=True), wrapper.run(copy(tile), accumulator=True)
    assert bitwise_equal(a.out, b.out) and torch.equal(a.acc, b.acc)
    assert changed(a.out, get_kernel("triton").run(tile).out) > 0


def test_native_fault_variants_compile_for_sm90_with_tensor_cores_and_no_fma_or_flush_to_zero(tmp_path):
    code = """if True:
        import re
        import torch
        torch.cuda.is_available = lambda: True
        import triton
        import triton.language as tl
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from alibi.kernels.triton_int8 import faulty_scaled_mm_kernel
        ints = ("M", "N", "K", "stride_am", "stride_ak", "stride_wn", "stride_wk", "stride_om", "stride_on",
                "stride_sa", "stride_sw")
        for switches in (dict(FP32_ACC=True, SPLIT_K=1, SCALE_BF16=False), dict(FP32_ACC=False, SPLIT_K=4,
                         SCALE_BF16=False), dict(FP32_ACC=False, SPLIT_K=1, SCALE_BF16=True)):
            constexprs = dict(ACC_DTYPE=tl.int32, HAS_BIAS=True, OUT_BF16=True, TRUNCATE=False, STORE_ACC=False,
                              BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, **switches)
            signature = {"a_ptr": "*i8", "w_ptr": "*i8", "s_a_ptr": "*fp32", "s_w_ptr": "*fp32", "bias_ptr": "*fp32",
                         "out_ptr": "*i16", **{p: "i32" for p in ints}, **{k: "constexpr" for k in constexprs}}
            ptx = triton.compile(ASTSource(fn=faulty_scaled_mm_kernel, signature=signature, constexprs=constexprs),
                                 target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3}).asm["ptx"]
            assert "wgmma.mma_async" in ptx, switches
            assert not re.search(r"\\bfma\\.", ptx), switches
            assert ".ftz" not in ptx, switches
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                            check=False)
    assert result.returncode == 0, result.stderr[-3000:]
