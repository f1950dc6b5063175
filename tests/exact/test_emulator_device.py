"""The exact reference and the epilogue models give the same bits on a GPU as on the CPU.

The conformance pipeline runs them on the GPU when there is one (`alibi.conform.pipeline.check_device`); that
is sound only if every model, applied to the same accumulator, returns the CPU's bits there — IEEE
fp32 multiplies, round-to-nearest-even casts, the fp64 FMA emulation, subnormals kept. These tests
hold it on adversarial tiles (the epilogue probes, subnormal scales, biases, the fp32 overflow tie)
and on every model.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from alibi.exact.emulator import BIAS_MODES, ORDERS, EpilogueModel, apply_epilogue, exact_accumulator, fma_f32
from alibi.exact.numerics import bits
from alibi.tiles.out_bias_probe import out_bias_probe_tiles
from alibi.tiles.synthetic import synthetic_tiles

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
MODELS = [EpilogueModel(o, b) for o, b in itertools.product(ORDERS, BIAS_MODES)]


def _tiles():
    tiles = [*synthetic_tiles("epilogue-probe-bias", seed=1), *synthetic_tiles("smollm2-135m-bias", seed=2, M=64)]
    tiles += out_bias_probe_tiles(torch.bfloat16, seed=0) + out_bias_probe_tiles(torch.float16, seed=0)
    t = tiles[0]
    tiny = torch.finfo(torch.float32).tiny
    tiles.append(t.replace(name="subnormal-scales", s_a=t.s_a * tiny / 4, s_w=t.s_w))  # subnormal products
    return tiles


def test_the_exact_accumulator_is_the_same_integer_on_the_gpu_as_on_the_cpu():
    for t in _tiles():
        cpu = exact_accumulator(t.a_q, t.w_q)
        gpu = exact_accumulator(t.a_q.cuda(), t.w_q.cuda())
        assert gpu.device.type == "cuda" and torch.equal(gpu.cpu(), cpu), t.name


def test_every_epilogue_model_gives_the_cpus_bits_on_the_gpu():
    for t in _tiles():
        acc = exact_accumulator(t.a_q, t.w_q)
        for model in MODELS:
            cpu = apply_epilogue(model, acc, t.s_a, t.s_w, t.bias, t.out_dtype)
            gpu = apply_epilogue(model, acc.cuda(), t.s_a.cuda(), t.s_w.cuda(),
                                 None if t.bias is None else t.bias.cuda(), t.out_dtype)
            assert torch.equal(bits(gpu.cpu()), bits(cpu)), f"{t.name} {model.name}"


def test_the_fma_emulation_gives_the_cpus_bits_on_the_gpu_at_the_overflow_tie_and_on_random_operands():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1 << 16, generator=g) * 2.0 ** torch.randint(-60, 60, (1 << 16,), generator=g)
    y = torch.randn(1 << 16, generator=g) * 2.0 ** torch.randint(-60, 60, (1 << 16,), generator=g)
    z = -(x * y) * (1 + torch.randn(1 << 16, generator=g) * 2.0 ** -20)  # near-cancellation: the hard cases
    x = torch.cat([x, torch.tensor([18631 * 2.0 ** 50])])
    y = torch.cat([y, torch.tensor([1801 * 2.0 ** 53])])
    z = torch.cat([z, torch.tensor([-(2.0 ** -100)])])
    cpu = fma_f32(x, y, z)
    gpu = fma_f32(x.cuda(), y.cuda(), z.cuda())
    assert torch.equal(bits(gpu.cpu()), bits(cpu))
    assert float(cpu[-1]) == torch.finfo(torch.float32).max


def test_the_int32_wrap_of_every_int64_is_the_same_word_on_the_gpu_as_on_the_cpu():
    from alibi.exact.emulator import int32_wrap
    values = torch.tensor([[0, -1, 2**31 - 1, 2**31, -(2**31) - 1], [2**32 + 7, -(2**40) - 3, 2**63 - 1, -(2**63), 5]],
                          dtype=torch.int64)
    cpu, gpu = int32_wrap(values), int32_wrap(values.cuda())
    assert gpu.dtype == torch.int32 and torch.equal(gpu.cpu(), cpu)
    assert cpu.reshape(-1).tolist() == [(v + 2**31) % 2**32 - 2**31 for v in values.reshape(-1).tolist()]
