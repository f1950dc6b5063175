"""On a GPU: the `cutlass` kernel (both code paths) is its declared epilogue model, bit for bit.

Each test compares bit patterns (`out.view(torch.int16)`) with the CPU emulation of
`w_then_a+fma` applied to the exact int64 accumulator, and the kernel's exposed int32 accumulator
with that exact reference. Shapes cover M ∈ {1, 16, 512, 4096}, K up to 32768, N and K that are
not multiples of any tile (and not of 8 or 16: padded, which must be exact), every mainloop
configuration, all −128 operands at K = 32768, bf16 and fp16 outputs, with and without bias.
"""

from __future__ import annotations

import pytest
import torch

from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator

pytestmark = pytest.mark.gpu

W_THEN_A_FMA = EpilogueModel("w_then_a", "fma")

# (M, N, K): ≥ 20 shapes. Tiles are 64/128 wide in M and N; 128/256 deep in K.
SHAPES = [
    (1, 4096, 4096), (1, 1000, 1536), (1, 8192, 1024), (1, 5, 7),
    (16, 4096, 4096), (16, 192, 576), (16, 8200, 1024), (3, 96, 32768),
    (17, 1000, 1000), (33, 584, 1536), (64, 4104, 4096), (100, 300, 520),
    (128, 4096, 4096), (129, 2056, 1024), (512, 1000, 4096), (512, 4096, 4096),
    (512, 576, 1536), (512, 256, 32768), (777, 1234, 2000), (4096, 4096, 4096),
    (4096, 1000, 576), (4096, 1536, 8192),
]


def _kernel(path: str):
    from alibi.kernels.cutlass import CutlassInt8Kernel

    if path == "sm90" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 path needs an sm_90 GPU")
    return CutlassInt8Kernel(path=path)


def _operands(M: int, N: int, K: int, seed: int, pow2: bool = False, bias_dtype=None):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-128, 128, (M, K), dtype=torch.int8, generator=g)
    w = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)
    # Realistic magnitudes: per-token scales ~ amax/127 of activations, weight scales ~ 1e-3.
    s_a = (torch.rand(M, generator=g) * 0.05 + 1e-3).float()
    s_w = (torch.rand(N, generator=g) * 2e-3 + 1e-4).float()
    if pow2:
        s_w = torch.exp2(torch.round(torch.log2(s_w)))
    bias = None if bias_dtype is None else (torch.randn(N, generator=g) * 4).to(bias_dtype)
    return a, s_a, w, s_w, bias


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def _assert_output_is_model(kernel, a, s_a, w, s_w, bias, out_dtype, model=W_THEN_A_FMA, config=-1):
    dev = torch.device("cuda")
    out = kernel.scaled_mm(a.to(dev), s_a.to(dev), w.to(dev), s_w.to(dev),
                           None if bias is None else bias.to(dev), out_dtype, config=config).cpu()
    acc = exact_accumulator(a, w)
    expected = apply_epilogue(model, acc, s_a, s_w, bias, out_dtype)
    differ = int((_bits(out) != _bits(expected)).sum())
    assert out.shape == expected.shape and out.dtype == out_dtype
    assert differ == 0, f"{differ} of {out.numel()} elements differ from {model.name} ({kernel.last_run})"
    return out, acc


@pytest.mark.parametrize("path", ["sm90", "sm80"])
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_cutlass_output_equals_w_then_a_fma_model_bit_for_bit(path, M, N, K):
    kernel = _kernel(path)
    a, s_a, w, s_w, _ = _operands(M, N, K, seed=M * 7 + N * 3 + K)
    _assert_output_is_model(kernel, a, s_a, w, s_w, None, torch.bfloat16)


@pytest.mark.parametrize("path", ["sm90", "sm80"])
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_cutlass_accumulator_equals_the_int64_reference(path, M, N, K):
    kernel = _kernel(path)
    a, _, w, _, _ = _operands(M, N, K, seed=M + N + K)
    acc = kernel.accumulator(a.cuda(), w.cuda()).cpu()
    assert acc.dtype == torch.int32
    assert torch.equal(acc.to(torch.int64), exact_accumulator(a, w))


def _operands_telling_fusion_apart(M: int, N: int, K: int, seed: int, bias_dtype, tries: int = 400):
    """Operands on which the fused (`fma`) and two-rounding (`add_before_cast`) bias models differ in
    at least one output bit: the first seed from `seed` on that gives such operands (computed on the
    CPU, deterministic). At small M·N random operands often give none (at M=1, N=1000 the first
    difference took up to 111 seeds), and without one a kernel cannot be shown to fuse."""
    two_roundings_model = EpilogueModel("w_then_a", "add_before_cast")
    for s in range(seed, seed + tries):
        a, s_a, w, s_w, bias = _operands(M, N, K, seed=s, bias_dtype=bias_dtype)
        acc = exact_accumulator(a, w)
        two = apply_epilogue(two_roundings_model, acc, s_a, s_w, bias, torch.bfloat16)
        fused = apply_epilogue(W_THEN_A_FMA, acc, s_a, s_w, bias, torch.bfloat16)
        if not torch.equal(_bits(two), _bits(fused)):
            return (a, s_a, w, s_w, bias), two
    raise AssertionError(f"no seed in [{seed}, {seed + tries}) separates the fused and two-rounding models "
                         f"at M={M}, N={N}, K={K}")


@pytest.mark.parametrize("path", ["sm90", "sm80"])
@pytest.mark.parametrize("M,N,K", [(1, 1000, 1536), (16, 584, 4096), (512, 4096, 4096), (4096, 1000, 2048)])
@pytest.mark.parametrize("bias_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cutlass_with_bias_equals_the_exactly_fused_fma_model(path, M, N, K, bias_dtype):
    """The output is the fused model bit for bit, on operands where the two-rounding model differs
    from it, so the test also proves the output is not the two-rounding model (issue 16: the second
    assertion used to run only if random operands happened to separate the models)."""
    kernel = _kernel(path)
    (a, s_a, w, s_w, bias), two_roundings = _operands_telling_fusion_apart(M, N, K, K + 1, bias_dtype)
    out, _ = _assert_output_is_model(kernel, a, s_a, w, s_w, bias, torch.bfloat16)
    assert not torch.equal(_bits(out), _bits(two_roundings))


@pytest.mark.parametrize("path", ["sm90", "sm80"])
def test_cutlass_pow2_weight_scales_make_its_output_equal_both_scale_order_models(path):
    """Power-of-two s_w: both scale orders give the same fp32 (normal range), so the kernel, which is
    `w_then_a`, also equals `a_then_w` bit for bit. (Named for both models: issue 16 found the old
    name claimed only a_then_w while its first assertion checked w_then_a.) The same operands under
    real scales separate the two models, so the equality is the pow2 scales' doing."""
    kernel = _kernel(path)
    a, s_a, w, s_w, _ = _operands(512, 1536, 4096, seed=11, pow2=True)
    _assert_output_is_model(kernel, a, s_a, w, s_w, None, torch.bfloat16, model=EpilogueModel("w_then_a"))
    _assert_output_is_model(kernel, a, s_a, w, s_w, None, torch.bfloat16, model=EpilogueModel("a_then_w"))
    _, s_a_real, _, s_w_real, _ = _operands(512, 1536, 4096, seed=11)
    acc = exact_accumulator(a, w)
    real = [apply_epilogue(EpilogueModel(o), acc, s_a_real, s_w_real, None, torch.bfloat16)
            for o in ("w_then_a", "a_then_w")]
    assert not torch.equal(_bits(real[0]), _bits(real[1]))


@pytest.mark.parametrize("path", ["sm90", "sm80"])
@pytest.mark.parametrize("w_value", [-128, 127])
def test_cutlass_all_minus_128_activations_at_k_32768_accumulate_exactly(path, w_value):
    """|acc| = 32768·128·|w| ≤ 2²⁹: extreme operands; the int32 accumulator must hold it exactly."""
    kernel = _kernel(path)
    M, N, K = 16, 72, 32768
    a = torch.full((M, K), -128, dtype=torch.int8)
    w = torch.full((N, K), w_value, dtype=torch.int8)
    acc = kernel.accumulator(a.cuda(), w.cuda()).cpu().to(torch.int64)
    exact = exact_accumulator(a, w)
    assert int(exact.abs().max()) == K * 128 * abs(w_value)
    assert torch.equal(acc, exact)
    s_a, s_w = torch.full((M,), 1 / 127, dtype=torch.float32), torch.full((N,), 3e-4, dtype=torch.float32)
    _assert_output_is_model(kernel, a, s_a, w, s_w, None, torch.bfloat16)


@pytest.mark.parametrize("path", ["sm90", "sm80"])
def test_every_mainloop_configuration_gives_the_same_bits(path):
    """Tilings differ per configuration; the exact int32 accumulator makes the outputs identical."""
    kernel = _kernel(path)
    a, s_a, w, s_w, bias = _operands(200, 1000, 3000, seed=5, bias_dtype=torch.bfloat16)
    configs = range(5) if path == "sm90" else range(4)
    outs = [_assert_output_is_model(kernel, a, s_a, w, s_w, bias, torch.bfloat16, config=c)[0] for c in configs]
    assert all(torch.equal(_bits(o), _bits(outs[0])) for o in outs)


def test_cutlass_picks_the_sm90_path_on_hopper_and_reports_it_in_evidence():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    from alibi.kernels.registry import get_kernel
    from alibi.tiles.tile import Tile

    a, s_a, w, s_w, _ = _operands(16, 64, 64, seed=0)
    kernel = get_kernel("cutlass")
    result = kernel.run(Tile("t", a, s_a, w, s_w), accumulator=True)
    assert "sm_90a" in result.evidence["code_path"]
    assert result.acc is not None and torch.equal(result.acc.to(torch.int64), exact_accumulator(a, w))


def test_cutlass_rejects_non_int8_operands():
    from alibi.errors import InputError
    from alibi.kernels.cutlass import CutlassInt8Kernel

    x = torch.zeros(4, 16, device="cuda")
    with pytest.raises(InputError, match="int8"):
        CutlassInt8Kernel().scaled_mm(x, x[:, 0], x, x[:, 0])


def _models_matching(out, acc, tile):
    from alibi.exact.emulator import BIAS_MODES, ORDERS

    modes = BIAS_MODES if tile.bias is not None else ("fma",)
    return [m.name for m in (EpilogueModel(o, b) for o in ORDERS for b in modes)
            if torch.equal(_bits(apply_epilogue(m, acc, tile.s_a, tile.s_w, tile.bias, tile.out_dtype)), _bits(out))]


@pytest.mark.parametrize("path", ["sm90", "sm80"])
@pytest.mark.parametrize("preset", ["epilogue-probe", "epilogue-probe-bias"])
def test_cutlass_matches_w_then_a_fma_and_no_other_model_on_the_epilogue_probe(path, preset):
    """The probe tile's scales (and bias) are built so every known epilogue model gives other bits."""
    from alibi.tiles.synthetic import synthetic_tiles

    kernel = _kernel(path)
    tile = synthetic_tiles(preset)[0]
    out = kernel.scaled_mm(tile.a_q.cuda(), tile.s_a.cuda(), tile.w_q.cuda(), tile.s_w.cuda(),
                           None if tile.bias is None else tile.bias.cuda(), tile.out_dtype).cpu()
    matches = _models_matching(out, exact_accumulator(tile.a_q, tile.w_q), tile)
    assert matches == ["w_then_a+fma"], matches
