"""The sweeps on CUDA: operands drawn on the GPU, the float64 GPU reference, and the GPU kernel pairs.

Run by analysis/h200/sweeps.sh before the sweeps themselves (skipped without CUDA).
"""

from __future__ import annotations

import pytest
import torch

from alibi.exact.emulator import EpilogueModel, apply_epilogue, exact_accumulator
from alibi.exact.numerics import bitwise_equal_mask
from alibi.sweep.arms import resolve_pair
from alibi.sweep.compare import exact_product
from alibi.sweep.depth import DepthPlan, operand_schedule, run_depth_sweep
from alibi.sweep.operands import OperandSpec, draw

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def _pair(a: str, b: str, fmt: str):
    from alibi.errors import KernelUnavailable

    try:
        return resolve_pair(a, b, fmt, tensorwise_ok=True)
    except KernelUnavailable as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("fmt, scales", [("int8", "tensor"), ("fp8_e4m3", "tensor"), ("fp8_e4m3", "row")])
def test_operands_drawn_on_cuda_are_well_formed_and_reproducible(fmt, scales):
    spec = OperandSpec(fmt, 64, 96, scales)
    one, two = draw(spec, 4096, (0,), CUDA), draw(spec, 4096, (0,), CUDA)
    for t in (one.a_q, one.s_a, one.w_q, one.s_w):
        assert t.device.type == "cuda"
    assert torch.equal(one.a_q.view(torch.uint8), two.a_q.view(torch.uint8))
    if fmt == "int8":
        assert int(one.a_q.min()) >= -127 and one.s_a.shape == (64,) and one.s_w.shape == (96,)
    elif scales == "row":
        assert bool((one.a_q.float().abs().amax(dim=1) == 448.0).all())


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
def test_cuda_float64_reference_equals_the_cpu_exact_product(fmt):
    ops = draw(OperandSpec(fmt, 32, 512), 32768, (1,), CUDA)
    gpu, path = exact_product(ops, CUDA)
    cpu, _ = exact_product(ops.to(torch.device("cpu")), torch.device("cpu"))
    assert path.startswith("cuda:") and torch.equal(gpu.cpu(), cpu)


def test_cutlass_and_triton_differ_exactly_where_their_scale_orders_do():
    """cutlass is w_then_a, triton a_then_w (science.md §3): the sweep's count must be the emulator's."""
    arms = _pair("cutlass", "triton", "int8")
    plan = DepthPlan("cutlass", "triton", "int8", Ks=(512, 32768), M=256, N=2048, seeds=2,
                     nested_prefix=True).validate()
    sweep = run_depth_sweep(plan, arms, CUDA)
    assert sweep.reference.startswith("cuda:") and "equal the CPU's exact computation" in sweep.reference_check
    records = iter(sweep.records)
    for seed in sweep.seeds:
        for K, ops in operand_schedule(plan, seed, CUDA):
            r = next(records)
            cpu = ops.to(torch.device("cpu"))
            acc = exact_accumulator(cpu.a_q, cpu.w_q)
            wa = apply_epilogue(EpilogueModel("w_then_a"), acc, cpu.s_a, cpu.s_w)
            aw = apply_epilogue(EpilogueModel("a_then_w"), acc, cpu.s_a, cpu.s_w)
            assert r.n_differing == int((~bitwise_equal_mask(wa, aw)).sum()), (seed, K)
            assert r.n_ge2ulp == 0 and (r.max_ulp or 0) <= 1


@pytest.mark.parametrize("a, b", [("cutlass-fp8", "cublaslt-fp8"), ("triton-fp8", "cublaslt-fp8")])
def test_fp8_gpu_sweep_counts_match_the_kernels_run_directly(a, b):
    arms = _pair(a, b, "fp8_e4m3")
    plan = DepthPlan(a, b, "fp8_e4m3", Ks=(512, 8192), M=256, N=2048, seeds=1, nested_prefix=True).validate()
    sweep = run_depth_sweep(plan, arms, CUDA)
    for r, (K, ops) in zip(sweep.records, operand_schedule(plan, 0, CUDA)):
        direct = int((~bitwise_equal_mask(arms[0].run(ops), arms[1].run(ops))).sum())
        assert r.K == K and r.n_differing == direct and r.n_nonfinite == 0
