"""On a GPU: the FP8 kernels against their declared epilogues, and their accumulators against an exact one.

Two kinds of facts:
* `cutlass-fp8` exposes its own fp32 accumulator (same mainloop configuration, same summation
  order), so its output must equal `w_then_a+fma` applied to *that* accumulator, bit for bit, on
  any operands.
* On integer-valued operands with |a|,|w| ≤ 2 and K ≤ 512 every partial sum is an integer of
  magnitude ≤ 2048 = 2¹¹: exact in fp32 and in any reduced-precision tensor-core accumulator that
  keeps at least 12 significant bits, whatever the order. The accumulator is then known exactly
  (the fp64 GEMM), so every kernel's output can be held to its declared model without asking it
  for its accumulator — the only way to check the `torch._scaled_mm` paths.
The exact reference for general e4m3 operands is a float64 GEMM of the dequantized values (exact
for K ≤ 65536, see alibi/kernels/fp8.py); the distance of the fp32 accumulator from it is a
measurement, bounded here only to catch layout defects.
"""

from __future__ import annotations

import pytest
import torch

from alibi.exact.emulator import BIAS_MODES, ORDERS, EpilogueModel, apply_epilogue

pytestmark = pytest.mark.gpu

FP8 = torch.float8_e4m3fn
SHAPES = [(1, 4096, 4096), (1, 1000, 1536), (16, 4096, 4096), (16, 584, 1000), (64, 1536, 576),
          (100, 300, 520), (128, 4096, 4096), (512, 4096, 4096), (512, 1000, 32768), (4096, 4096, 4096),
          (4096, 1001, 2048)]


def _bits(t):
    return t.contiguous().view(torch.int16)


def _random_fp8(M, N, K, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g).mul(2).to(FP8)
    w = torch.randn(N, K, generator=g).mul(0.5).to(FP8)
    s_a = (torch.rand(M, generator=g) * 0.05 + 1e-3).float()
    s_w = (torch.rand(N, generator=g) * 2e-3 + 1e-4).float()
    return a, s_a, w, s_w


def _small_integer_fp8(M, N, K, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-2, 3, (M, K), generator=g).float().to(FP8)
    w = torch.randint(-2, 3, (N, K), generator=g).float().to(FP8)
    s_a = (torch.rand(M, generator=g) * 0.05 + 1e-3).float()
    s_w = (torch.rand(N, generator=g) * 2e-3 + 1e-4).float()
    return a, s_a, w, s_w


def _exact(a, w):
    return a.double() @ w.double().T


def _matching_models(out, acc, s_a, s_w, bias, out_dtype) -> list[str]:
    models = [EpilogueModel(o, b) for o in ORDERS for b in (BIAS_MODES if bias is not None else ("fma",))]
    return [m.name for m in models if torch.equal(_bits(apply_epilogue(m, acc, s_a, s_w, bias, out_dtype)), _bits(out))]


@pytest.fixture(scope="module")
def cutlass_fp8():
    from alibi.kernels.fp8 import CutlassFp8Kernel

    k = CutlassFp8Kernel()
    ok, reason = k.available()
    if not ok:
        pytest.skip(reason)
    return k


@pytest.mark.parametrize("M,N,K", SHAPES)
def test_cutlass_fp8_output_equals_w_then_a_fma_on_its_own_accumulator(cutlass_fp8, M, N, K):
    a, s_a, w, s_w = _random_fp8(M, N, K, seed=M + N + K)
    out = cutlass_fp8.scaled_mm(a.cuda(), s_a.cuda(), w.cuda(), s_w.cuda()).cpu()
    acc = cutlass_fp8.accumulator(a.cuda(), w.cuda()).cpu()
    assert acc.dtype == torch.float32
    expected = apply_epilogue(cutlass_fp8.epilogue, acc, s_a, s_w, None, torch.bfloat16)
    assert int((_bits(out) != _bits(expected)).sum()) == 0
    # A defect detector, not a precision claim: a layout or indexing error is of the order of
    # Σ|a·w| itself; accumulation rounding stays far below 2⁻⁶ of it.
    exact = _exact(a, w)
    magnitude = a.double().abs() @ w.double().abs().T
    assert bool(((acc.double() - exact).abs() <= magnitude * 2**-6 + 1e-30).all())


def test_cutlass_fp8_per_tensor_scales_are_broadcast_exactly(cutlass_fp8):
    a, _, w, _ = _random_fp8(64, 576, 1536, seed=9)
    s_a, s_w = torch.tensor([0.0123], dtype=torch.float32), torch.tensor([0.00071], dtype=torch.float32)
    out = cutlass_fp8.scaled_mm(a.cuda(), s_a.cuda(), w.cuda(), s_w.cuda()).cpu()
    acc = cutlass_fp8.accumulator(a.cuda(), w.cuda()).cpu()
    assert torch.equal(_bits(out), _bits(apply_epilogue(cutlass_fp8.epilogue, acc, s_a, s_w, None, torch.bfloat16)))


def _probe(M, N, K, seed, with_bias, tensorwise):
    """Small-integer e4m3 operands (exact accumulator) with scales and a bias that tell models apart.

    Scale orders disagree in parts per million under ordinary scales, too rarely to identify a
    model on a test-sized output. Here each row's activation scale (or, tensor-wise, the one
    scale) is picked among random candidates as the one for which the three orders give the most
    distinct bf16 outputs. The bf16 bias of column n cancels the row whose exact value lies
    closest to a bf16 number, leaving a residue small enough that the rounding of the product
    before the add (fma or not) shows in the result.
    """
    g = torch.Generator().manual_seed(seed)
    # Tensor-wise, the output is a function of acc alone, so many distinct accumulator values are
    # needed: integers up to 16 (all exact in e4m3), |acc| ≤ 256·K ≤ 2¹⁷ — exact in fp32 for the
    # full-precision cuBLASLt accumulation (use_fast_accum=False); the CUTLASS fast-accumulation
    # kernel is probed row-wise only, with |a|,|w| ≤ 2 and |acc| ≤ 4·K ≤ 2048.
    bound = 16 if tensorwise else 2
    a = torch.randint(-bound, bound + 1, (M, K), generator=g).float().to(FP8)
    w = torch.randint(-bound, bound + 1, (N, K), generator=g).float().to(FP8)
    acc = _exact(a, w).float()
    candidates = (torch.rand(256, generator=g) + 0.5) * 2.0**-6

    def disagreements(rows, sa, sw):  # rows [R,N] fp32, sa [C,1] or [C,R,1], sw [N]
        wa = ((rows * sw) * sa).to(torch.bfloat16)
        aw = ((rows * sa) * sw).to(torch.bfloat16)
        pf = (rows * (sa * sw)).to(torch.bfloat16)
        d = torch.stack([(wa != aw).flatten(1).sum(1), (aw != pf).flatten(1).sum(1), (wa != pf).flatten(1).sum(1)])
        return d.sum(0) + 1000 * d.min(0).values  # prefer candidates that separate all three orders

    if tensorwise:
        # One scale pair for the whole tile: the output is a function of acc alone, so score each
        # candidate pair over the distinct accumulator values (weighted by how often they occur).
        values, counts = acc.unique(return_counts=True)
        pairs = (torch.rand(4096, 2, generator=g) + 0.5) * torch.tensor([2.0**-6, 2.0**-7])
        sa, sw = pairs[:, :1].float(), pairs[:, 1:].float()
        v = values.reshape(1, -1)
        wa, aw, pf = ((v * sw) * sa).to(torch.bfloat16), ((v * sa) * sw).to(torch.bfloat16), (v * (sa * sw)).to(torch.bfloat16)
        d = torch.stack([((wa != aw) * counts).sum(1), ((aw != pf) * counts).sum(1), ((wa != pf) * counts).sum(1)])
        score = d.sum(0) + 1000 * d.min(0).values  # prefer pairs that separate all three orders
        best = int(score.argmax())
        s_a, s_w = sa[best].reshape(1), sw[best].reshape(1)
    else:
        s_w = ((torch.rand(N, generator=g) + 0.5) * 2.0**-7).float()
        s_a = torch.stack([candidates[int(disagreements(acc[m].unsqueeze(0), candidates.reshape(-1, 1), s_w).argmax())]
                           for m in range(M)]).float()
    bias = None
    if with_bias:
        y = acc.double() * s_a.double().reshape(-1, 1) * s_w.double().reshape(1, -1)
        rel = ((y - y.to(torch.bfloat16).double()).abs() / y.abs()).nan_to_num(nan=1.0)
        best = rel.argmin(0)
        bias = (-y[best, torch.arange(N)]).to(torch.bfloat16)
    return a, s_a, w, s_w, bias, acc


# Tensor-wise without a bias, a tile of 1 or 16 rows holds too few distinct accumulator values for
# any scale pair to separate all three orders (checked on the CPU emulation); 512 rows do.
PROBE_CASES = [(name, M, N, K, with_bias)
               for name in ("cutlass-fp8", "cublaslt-fp8", "cublaslt-fp8-tensorwise")
               for M, N, K in ((1, 1536, 512), (16, 1024, 512), (512, 1000, 384))
               for with_bias in (False, True)
               if not (name.endswith("tensorwise") and M < 512 and not with_bias)]


@pytest.mark.parametrize("name,M,N,K,with_bias", PROBE_CASES)
def test_fp8_kernel_equals_its_declared_model_and_no_other_on_exact_probe_operands(name, M, N, K, with_bias):
    from alibi.kernels.registry import get_kernel

    kernel = get_kernel(name)
    ok, reason = kernel.available()
    if not ok:
        pytest.skip(reason)
    a, s_a, w, s_w, bias, acc = _probe(M, N, K, seed=M + K, with_bias=with_bias, tensorwise=name.endswith("tensorwise"))
    out = kernel.scaled_mm(a.cuda(), s_a.cuda(), w.cuda(), s_w.cuda(), None if bias is None else bias.cuda()).cpu()
    declared = kernel.epilogue
    expected = apply_epilogue(declared, acc, s_a, s_w, bias, torch.bfloat16)
    differ = int((_bits(out) != _bits(expected)).sum())
    matches = _matching_models(out, acc, s_a, s_w, bias, torch.bfloat16)
    assert differ == 0, f"{name}: {differ} elements differ from its declared {declared.name}; matching: {matches}"
    # The operands must tell the scale orders apart, or the equality above proves nothing.
    assert {m.split("+")[0] for m in matches} == {declared.order}, matches
    if bias is not None and M >= 512:  # enough rows to cancel closely: bias modes told apart too
        assert matches == [declared.name], matches


def test_cutlass_fp8_accumulator_is_exact_when_every_partial_sum_is(cutlass_fp8):
    a, _, w, _ = _small_integer_fp8(4096, 1000, 512, seed=1)
    acc = cutlass_fp8.accumulator(a.cuda(), w.cuda()).cpu()
    assert torch.equal(acc.double(), _exact(a, w))
