"""Seeded synthetic tiles with the layer shapes and operand statistics of real models.

Activations are drawn heavy-tailed (Student-t, 4 degrees of freedom) with a few outlier channels
(about 1% of K, scaled ×8, the pattern LLM activations show) and quantized per token with vLLM's
dynamic convention; weights are Gaussian, quantized per channel with the compressed-tensors
convention (scale = absmax/127.5, stored in bf16 as checkpoints do, then
widened to fp32). Same preset + seed → the same bits on every machine (torch's CPU generator).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from alibi.errors import InputError
from alibi.exact.fp8_block import DEEPSEEK_V3, LAYOUT_KEY, quantize_fp8_blocks, quantize_fp8_groups
from alibi.exact.quant import (
    quantize_fp8_rows,
    quantize_per_token,
    quantize_weight_per_channel,
    weight_scale_per_channel,
)
from alibi.io.limits import check_gemm_size, check_seed
from alibi.tiles.declaration_probe import declaration_probes
from alibi.tiles.tile import Tile

# (layer kind, K, N) of one decoder block: q, k, v, o, gate, up, down.
SMOLLM2_135M_BLOCK = (("q_proj", 576, 576), ("k_proj", 576, 192), ("v_proj", 576, 192), ("o_proj", 576, 576),
                      ("gate_proj", 576, 1536), ("up_proj", 576, 1536), ("down_proj", 1536, 576))
QWEN3_1_7B_BLOCK = (("q_proj", 2048, 2048), ("k_proj", 2048, 1024), ("v_proj", 2048, 1024),
                    ("o_proj", 2048, 2048), ("gate_proj", 2048, 6144), ("up_proj", 2048, 6144),
                    ("down_proj", 6144, 2048))
DEEPSEEK_V3_BLOCK = (("q_a_proj", 7168, 1536), ("q_b_proj", 1536, 24576), ("kv_a_proj_with_mqa", 7168, 576),
                     ("kv_b_proj", 512, 32768), ("o_proj", 16384, 7168), ("dense.gate_up_proj", 7168, 36864),
                     ("dense.down_proj", 18432, 7168), ("expert.gate_up_proj", 7168, 4096),
                     ("expert.down_proj", 2048, 7168))
"""DeepSeek-V3's block-scaled linear shapes (K, N) as vLLM runs them with one GPU per model: the attention's five,
a dense layer's MLP (gate and up fused) and one routed expert's."""


@dataclass(frozen=True)
class Preset:
    """A synthetic operand set: `layers` decoder blocks of `block` shapes, `M` tokens per tile.

    bias: give every tile a bf16 bias (exercises the bias modes of the epilogues);
    probe: append the `epilogue-probe` tile, on which the scale orders disagree often, so that
      the epilogue-model check can tell models apart even when the layer tiles are too small to;
    declaration_probes: append the declaration probes (`alibi.tiles.declaration_probe`): bfloat16 and float16
      outputs, an fp32 bias and one in the output dtype, at M = 1 and M = 64, on which a departure from a declared
      epilogue in any attribute (scale order, intermediate rounding, bias mode) shows;
    fmt: `int8`, or `fp8_e4m3`: the same operands quantized per token and per channel to e4m3
      (`alibi.exact.quant.quantize_fp8_rows`); fp8_scales `tensor`: one scale per operand instead (what
      `cublaslt-fp8-tensorwise` takes); `block`: block-scaled as DeepSeek-V3 / Qwen3-FP8 are, 1×128 activation
      groups and 128×128 weight blocks (`alibi.exact.fp8_block`; format `fp8_e4m3_block`).
    """

    name: str
    model: str
    block: tuple[tuple[str, int, int], ...]
    layers: int
    M: int
    bias: bool = False
    description: str = ""
    probe: bool = False
    fmt: str = "int8"
    fp8_scales: str = "row"
    declaration_probes: bool = False


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("default", "SmolLM2-135M", SMOLLM2_135M_BLOCK, 1, 32, probe=True, declaration_probes=True,
           description="the built-in default: one SmolLM2-135M decoder block (7 tiles, 32 tokens), the "
                       "epilogue-probe tile and the 8 declaration probes (bf16 and fp16 outputs, fp32 and "
                       "output-dtype biases, M = 1 and 64), which exercise every attribute of a declared epilogue"),
    Preset("smollm2-135m", "SmolLM2-135M", SMOLLM2_135M_BLOCK, 1, 32,
           description="one decoder block of SmolLM2-135M (7 tiles), 32 tokens"),
    Preset("smollm2-135m-bias", "SmolLM2-135M", SMOLLM2_135M_BLOCK, 1, 32, bias=True,
           description="as smollm2-135m with a bf16 bias on every layer"),
    Preset("smollm2-135m-full", "SmolLM2-135M", SMOLLM2_135M_BLOCK, 30, 512,
           description="all 210 decoder linear layers of SmolLM2-135M at M=512 (GPU-sized)"),
    Preset("qwen3-1.7b", "Qwen3-1.7B", QWEN3_1_7B_BLOCK, 1, 512,
           description="one decoder block of Qwen3-1.7B (7 tiles) at M=512"),
    Preset("qwen3-1.7b-full", "Qwen3-1.7B", QWEN3_1_7B_BLOCK, 28, 512,
           description="all 196 decoder linear layers of Qwen3-1.7B at M=512 (GPU-sized)"),
    Preset("smollm2-135m-fp8", "SmolLM2-135M", SMOLLM2_135M_BLOCK, 1, 32, fmt="fp8_e4m3",
           description="one decoder block of SmolLM2-135M (7 tiles), 32 tokens, e4m3 operands with per-token "
                       "and per-channel fp32 scales"),
    Preset("qwen3-1.7b-fp8", "Qwen3-1.7B", QWEN3_1_7B_BLOCK, 1, 512, fmt="fp8_e4m3",
           description="one decoder block of Qwen3-1.7B (7 tiles) at M=512 in e4m3 (GPU-sized)"),
    Preset("smollm2-135m-fp8-tensor", "SmolLM2-135M", SMOLLM2_135M_BLOCK, 1, 32, fmt="fp8_e4m3", fp8_scales="tensor",
           description="as smollm2-135m-fp8 with one scale per operand (per-tensor)"),
    Preset("smollm2-135m-fp8-block", "SmolLM2-135M", SMOLLM2_135M_BLOCK, 1, 16, fmt="fp8_e4m3", fp8_scales="block",
           description="one decoder block of SmolLM2-135M (7 tiles), 16 tokens, block-scaled e4m3 (1x128 activation "
                       "groups, 128x128 weight blocks; K = 576 ends in a half group, N = 192 in a half block)"),
    Preset("smollm2-135m-fp8-block-decode", "SmolLM2-135M", SMOLLM2_135M_BLOCK, 1, 1, fmt="fp8_e4m3",
           fp8_scales="block", description="as smollm2-135m-fp8-block at M = 1 (one decode token)"),
    Preset("smollm2-135m-fp8-block-prefill", "SmolLM2-135M", SMOLLM2_135M_BLOCK, 1, 256, fmt="fp8_e4m3",
           fp8_scales="block", description="as smollm2-135m-fp8-block at M = 256 (a prefill; GPU-sized)"),
    Preset("qwen3-1.7b-fp8-block", "Qwen3-1.7B", QWEN3_1_7B_BLOCK, 1, 512, fmt="fp8_e4m3", fp8_scales="block",
           description="one decoder block of Qwen3-1.7B (7 tiles) at M=512, block-scaled e4m3 as Qwen3-FP8 ships "
                       "(GPU-sized)"),
    Preset("deepseek-v3-fp8-block", "DeepSeek-V3", DEEPSEEK_V3_BLOCK, 1, 16, fmt="fp8_e4m3", fp8_scales="block",
           description="DeepSeek-V3's nine block-scaled linear shapes (attention, a dense MLP, an expert; K up to "
                       "18432) at M = 16, e4m3 in 1x128 groups and 128x128 blocks (GPU-sized)"),
    Preset("deepseek-v3-fp8-block-decode", "DeepSeek-V3", DEEPSEEK_V3_BLOCK, 1, 1, fmt="fp8_e4m3",
           fp8_scales="block", description="as deepseek-v3-fp8-block at M = 1 (one decode token; GPU-sized)"),
    Preset("tiny-fp8-block", "test", (("proj", 384, 48), ("ragged", 200, 136)), 1, 4, fmt="fp8_e4m3",
           fp8_scales="block", description="two small block-scaled e4m3 tiles for tests (the second with a ragged "
                                           "K = 200 and N = 136)"),
    Preset("tiny-fp8", "test", (("proj", 64, 48), ("wide", 96, 80)), 1, 8, fmt="fp8_e4m3",
           description="two small e4m3 tiles for tests"),
    Preset("tiny", "test", (("proj", 64, 48), ("wide", 96, 80)), 1, 8,
           description="two small tiles for tests"),
    Preset("epilogue-probe", "probe", (("probe", 256, 256),), 1, 64,
           description="one tile whose fp32 scales are searched so the three scale orders disagree on many "
                       "outputs: tells epilogue models apart (alibi identify)"),
    Preset("epilogue-probe-bias", "probe", (("probe", 256, 256),), 1, 64, bias=True,
           description="epilogue-probe plus an fp32 bias that cancels one row per column: also tells the "
                       "bias modes apart"),
)}
PROBES = ("epilogue-probe", "epilogue-probe-bias")
DEFAULT_PRESET = "default"


def _student_t(gen: torch.Generator, shape: tuple[int, ...], df: int = 4) -> torch.Tensor:
    """Student-t samples from a seeded generator: normal / sqrt(chi2/df), chi2 from a sum of squares."""
    z = torch.randn(shape, generator=gen)
    chi2 = torch.randn((*shape, df), generator=gen).pow(2).sum(-1)
    return z / torch.sqrt(chi2 / df)


def _operands(gen: torch.Generator, M: int, K: int, N: int) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 activations [M,K] and weights [N,K] with a shared direction `d`.

    Activations: Student-t noise, ~1% outlier channels ×8, plus a per-token multiple of `d`;
    weights: N(0, 0.02²) plus a per-channel multiple of `d`. The shared component makes dot
    products add up coherently, as in trained layers: the accumulators reach 2²⁰–2²² (2.5–4.5
    bits of headroom below 2²⁴ at these shapes, like the real Qwen3 layers in science.md §6)
    instead of the ~2¹⁷ independent operands would give.
    """
    d = torch.sign(torch.randn(K, generator=gen))
    x = _student_t(gen, (M, K))
    outliers = torch.randperm(K, generator=gen)[: max(1, K // 100)]
    x[:, outliers] *= 8.0
    x = x + torch.randn((M, 1), generator=gen) * d
    w = 0.02 * torch.randn((N, K), generator=gen) + 0.006 * torch.randn((N, 1), generator=gen) * d
    return x.to(torch.bfloat16), w.to(torch.bfloat16)


def synthetic_tiles(preset: str, seed: int = 0, M: int | None = None) -> list[Tile]:
    """The tiles of `preset` for `seed` (M overrides the preset's token count)."""
    if preset not in PRESETS:
        raise InputError(f"unknown synthetic preset {preset!r}; choose one of {', '.join(PRESETS)}")
    p = PRESETS[preset]
    rows = p.M if M is None else M
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
        raise InputError(f"synthetic M (--rows) must be a positive integer, got {rows!r}")
    check_seed(seed, "the seed (--seed)")
    for kind, K, N in p.block:  # before anything is drawn: --rows 10**9 must not allocate
        check_gemm_size(rows, K, N, f"synthetic preset {preset} at M={rows} ({kind})")
    gen = torch.Generator().manual_seed(seed)
    if preset in PROBES:
        return [_probe_tile(gen, rows, p.block[0][1], p.block[0][2], p.bias, preset, seed)]
    tiles = []
    for layer in range(p.layers):
        for kind, K, N in p.block:
            x, w = _operands(gen, rows, K, N)
            layout = {}
            if p.fmt == "fp8_e4m3" and p.fp8_scales == "block":
                (a_q, s_a), (w_q, s_w) = quantize_fp8_groups(x, DEEPSEEK_V3.block_k), quantize_fp8_blocks(w)
                layout = {LAYOUT_KEY: DEEPSEEK_V3.text}
            elif p.fmt == "fp8_e4m3" and p.fp8_scales == "tensor":
                (a_q, s_a), (w_q, s_w) = quantize_fp8_rows(x.reshape(1, -1)), quantize_fp8_rows(w.reshape(1, -1))
                a_q, w_q = a_q.reshape(rows, K), w_q.reshape(N, K)
            elif p.fmt == "fp8_e4m3":
                (a_q, s_a), (w_q, s_w) = quantize_fp8_rows(x), quantize_fp8_rows(w)
            else:
                a_q, s_a = quantize_per_token(x)
                w_q, s_w = quantize_weight_per_channel(w, weight_scale_per_channel(w, torch.bfloat16))
            bias = (0.05 * torch.randn(N, generator=gen)).to(torch.bfloat16) if p.bias else None
            meta = {"source": f"synthetic:{preset}", "seed": str(seed), "model": p.model,
                    "layer": str(layer), "kind": kind, **layout}
            tiles.append(Tile(f"layers.{layer}.{kind}", a_q, s_a, w_q, s_w, bias, torch.bfloat16, meta).validate())
    if p.probe:
        probe = PRESETS["epilogue-probe"]
        tiles.append(_probe_tile(gen, probe.M, probe.block[0][1], probe.block[0][2], False, preset, seed))
    if p.declaration_probes:
        tiles += declaration_probes(seed)
    return tiles


def _probe_tile(gen: torch.Generator, M: int, K: int, N: int, bias: bool, preset: str, seed: int) -> Tile:
    """A tile built so that `w_then_a`, `a_then_w` and `product_first` disagree on many outputs.

    Real-scale disagreements are rare (parts per million), which makes them useless for telling
    models apart on small inputs. Here the weight scales are random fp32 and each row's activation
    scale is chosen among 512 random candidates as the one for which the three orders give the
    most distinct bf16 outputs. With `bias`, column n's fp32 bias cancels row (n mod M)'s output
    to about 2⁻²⁰ of its size, so the rounding of the product before the add (fma or not) and the
    cast before the add (add_after_cast) show in the result.
    """
    a_q = torch.randint(-127, 128, (M, K), generator=gen, dtype=torch.int8)
    w_q = torch.randint(-127, 128, (N, K), generator=gen, dtype=torch.int8)
    acc = (a_q.to(torch.float64) @ w_q.to(torch.float64).T).to(torch.float32)
    s_w = (torch.rand(N, generator=gen) + 0.5) * 2.0**-7
    candidates = (torch.rand((512, 1), generator=gen) + 0.5) * 2.0**-6
    s_a = torch.empty(M)
    for m in range(M):
        row = acc[m].unsqueeze(0)
        wa = ((row * s_w) * candidates).to(torch.bfloat16)
        aw = ((row * candidates) * s_w).to(torch.bfloat16)
        pf = (row * (candidates * s_w)).to(torch.bfloat16)
        score = (wa != aw).sum(1) + (aw != pf).sum(1) + (wa != pf).sum(1)
        s_a[m] = candidates[int(score.argmax()), 0]
    b = None
    if bias:
        y = (acc * s_a.unsqueeze(1)) * s_w
        rows = torch.arange(N) % M
        b = -(y[rows, torch.arange(N)] * (1 + 2.0**-20)).to(torch.float32)
    meta = {"source": f"synthetic:{preset}", "seed": str(seed), "model": "probe", "layer": "0", "kind": "probe"}
    return Tile("probe", a_q, s_a, w_q, s_w, b, torch.bfloat16, meta).validate()
