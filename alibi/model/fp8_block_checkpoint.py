"""Block-scaled FP8 checkpoints (DeepSeek-V3 / Qwen3-FP8 layout): parse, validate, read, quantize.

The layout, as DeepSeek-V3 and Qwen3's `-FP8` checkpoints store it and vLLM's `Fp8Config` reads it:

- `config.json` carries `quantization_config = {quant_method: "fp8", fmt: "e4m3", activation_scheme:
  "dynamic", weight_block_size: [128, 128]}` (block n × block k), optionally with `ignored_layers` or
  `modules_to_not_convert` (modules left dense);
- each quantized module `<m>` has `<m>.weight` float8_e4m3fn `[N, K]` and `<m>.weight_scale_inv` float32
  `[ceil(N/128), ceil(K/128)]`, a *dequantisation* scale despite its name (`w ≈ weight · weight_scale_inv`
  block by block), optionally `<m>.bias`;
- every other tensor (embeddings, norms, `lm_head`) is stored as in the dense checkpoint. vLLM quantises no
  embedding or LM head under this config, and a tied `lm_head` is the embedding.

Activations are quantised at run time per 1 × 128 group (`alibi.exact.fp8_block.quantize_fp8_groups`). A K or N
that is not a multiple of 128 keeps its ragged last block: the scale tensor has `ceil` blocks and the last one
is taken over the rows or columns that exist (`alibi.exact.fp8_block`). SmolLM2-135M's hidden size is 576 =
4.5 · 128, so six of its seven projections have a ragged K; the runner and the block emulators take it as it is,
while vLLM's CUDA group quantiser (`per_token_group_quant_fp8`) asserts `K % 128 == 0` (docs/fp8-block.md).

Supported: e4m3 weights in 2-D blocks with dynamic activations — what the runner's `BlockFp8Linear` computes.
Per-tensor or per-channel fp8 (no `weight_block_size`), static activation scales (`input_scale`), e5m2 and
compressed-tensors fp8 are refused with an error naming the field.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from alibi.errors import InputError, shown
from alibi.exact.fp8_block import DEEPSEEK_V3, BlockLayout, quantize_fp8_blocks
from alibi.exact.numerics import dtype_name
from alibi.model.checkpoint import CONFIG_FILE, read_config, read_tensors
from alibi.model.compressed_tensors import (
    WeightShape,
    checked_module_list,
    is_decoder_linear,
    module_listed,
    natural_key,
    quantize_targets,
)

QUANT_METHOD = "fp8"
FORMAT_NAME = "fp8-block"  # `alibi model prepare --format fp8-block`, the prepared folder's name
SCALE_SUFFIX = ".weight_scale_inv"
_STATIC_SUFFIXES = (".input_scale", ".weight_scale")  # per-tensor fp8 and static activations: another scheme


def is_block_fp8_config(config: Mapping) -> bool:
    """Whether `config.json` declares an HF-style fp8 quantization (`quant_method: "fp8"`)."""
    qc = config.get("quantization_config")
    return isinstance(qc, Mapping) and qc.get("quant_method") == QUANT_METHOD


@dataclass(frozen=True)
class BlockFp8Scheme:
    """The part of `quantization_config` the toolkit honours.

    layout: the block sizes (`weight_block_size` = [block_n, block_k]; activations in 1 × block_k groups);
    ignored: module names (or `re:` patterns) left dense, from `ignored_layers` or `modules_to_not_convert`.
    """

    layout: BlockLayout = DEEPSEEK_V3
    ignored: tuple[str, ...] = ()

    def ignores(self, module: str) -> bool:
        return module_listed(self.ignored, module)

    def to_quantization_config(self) -> dict:
        """The `quantization_config` object as DeepSeek-V3 and Qwen3-FP8 write it (`ignored_layers` only if any)."""
        qc: dict = {"quant_method": QUANT_METHOD, "fmt": "e4m3", "activation_scheme": "dynamic",
                    "weight_block_size": [self.layout.block_n, self.layout.block_k]}
        if self.ignored:
            qc["ignored_layers"] = list(self.ignored)
        return qc

    @classmethod
    def from_config(cls, config: Mapping, source: str) -> BlockFp8Scheme:
        """Parse and validate `config['quantization_config']`; `source` names the file in errors."""
        qc = config.get("quantization_config")
        if not isinstance(qc, Mapping):
            raise InputError(f"{source}: has no quantization_config object; this is not a block-scaled fp8 checkpoint")

        def unsupported(field: str, value: object, want: str) -> InputError:
            return InputError(f"{source}: unsupported fp8 scheme: quantization_config.{field} is {shown(value)}, "
                              f"expected {want}; only block-scaled e4m3 weights with dynamic 1×k activation groups "
                              "(DeepSeek-V3 / Qwen3-FP8) are supported")

        if qc.get("quant_method") != QUANT_METHOD:
            raise unsupported("quant_method", qc.get("quant_method"), repr(QUANT_METHOD))
        if qc.get("fmt", "e4m3") != "e4m3":
            raise unsupported("fmt", qc.get("fmt"), "'e4m3'")
        if qc.get("activation_scheme") != "dynamic":
            raise unsupported("activation_scheme", qc.get("activation_scheme"), "'dynamic'")
        block = qc.get("weight_block_size")
        if not (isinstance(block, list) and len(block) == 2
                and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
            raise unsupported("weight_block_size", block, "[block_n, block_k] of two positive integers (per-tensor "
                              "fp8 without blocks is not run)")
        ignored = checked_module_list(qc.get("ignored_layers") or qc.get("modules_to_not_convert") or [], source,
                                      "ignored_layers")
        return cls(BlockLayout(block[0], block[1]), tuple(ignored))


@dataclass(frozen=True)
class BlockQuantizedLinear(WeightShape):
    """One block-scaled Linear: e4m3 `weight` [N, K], fp32 `scale_inv` [ceil(N/bn), ceil(K/bk)] (the checkpoint's
    `weight_scale_inv`), and an optional `bias` [N] in the model's dtype."""

    name: str
    weight: torch.Tensor
    scale_inv: torch.Tensor
    bias: torch.Tensor | None = None


@dataclass(frozen=True)
class BlockFp8Checkpoint:
    """A block-scaled fp8 checkpoint in memory: the whole `config`, the parsed `scheme`, the quantized `linears`
    by name (natural order), and every other tensor as stored (`dense`)."""

    config: Mapping
    scheme: BlockFp8Scheme
    linears: Mapping[str, BlockQuantizedLinear]
    dense: Mapping[str, torch.Tensor]

    def tensors(self) -> dict[str, torch.Tensor]:
        """The checkpoint's tensors in stored form (e4m3 weights, fp32 `weight_scale_inv`, dense tensors)."""
        out = dict(self.dense)
        for name, lin in self.linears.items():
            out[f"{name}.weight"] = lin.weight
            out[f"{name}{SCALE_SUFFIX}"] = lin.scale_inv
            if lin.bias is not None:
                out[f"{name}.bias"] = lin.bias
        return out

    def ragged_k(self) -> list[int]:
        """The distinct K of the quantized Linears that are not a multiple of block_k (sorted)."""
        return sorted({lin.K for lin in self.linears.values() if lin.K % self.scheme.layout.block_k})


def parse_block_fp8(config: Mapping, tensors: Mapping[str, torch.Tensor], source: str) -> BlockFp8Checkpoint:
    """Validate `tensors` against the block-scaled layout and split them into quantized modules and the rest."""
    scheme = BlockFp8Scheme.from_config(config, f"{source}/{CONFIG_FILE}")
    layout = scheme.layout
    for key in tensors:
        if key.endswith(_STATIC_SUFFIXES):
            raise InputError(f"{source}: tensor {key!r} belongs to a per-tensor or static fp8 scheme; only block "
                             f"scales ('{SCALE_SUFFIX}') with dynamic activations are run")
    modules = sorted((k[: -len(SCALE_SUFFIX)] for k in tensors if k.endswith(SCALE_SUFFIX)), key=natural_key)
    if not modules:
        raise InputError(f"{source}: quantization_config says block-scaled fp8 but no tensor ends in "
                         f"'{SCALE_SUFFIX}'; the checkpoint is malformed")
    linears: dict[str, BlockQuantizedLinear] = {}
    used: set[str] = set()
    for name in modules:
        w, s = tensors.get(f"{name}.weight"), tensors[f"{name}{SCALE_SUFFIX}"]
        if w is None:
            raise InputError(f"{source}: {name}{SCALE_SUFFIX} has no matching {name}.weight; the checkpoint is "
                             "malformed")
        if w.dtype != torch.float8_e4m3fn or w.dim() != 2:
            raise InputError(f"{source}: {name}.weight is {dtype_name(w.dtype)} {list(w.shape)}; a block-scaled "
                             "fp8 weight must be float8_e4m3fn [N,K]")
        want = layout.w_scale_shape(*w.shape)
        if s.dtype != torch.float32 or tuple(s.shape) != want:
            raise InputError(f"{source}: {name}{SCALE_SUFFIX} is {dtype_name(s.dtype)} {list(s.shape)}; "
                             f"{layout.block_n}x{layout.block_k} blocks of a {list(w.shape)} weight need float32 "
                             f"{list(want)}")
        if not bool(torch.isfinite(s).all()) or not bool((s > 0).all()):
            raise InputError(f"{source}: {name}{SCALE_SUFFIX} holds zero, negative or non-finite scales")
        if scheme.ignores(name):
            raise InputError(f"{source}: {name} is quantized but quantization_config.ignored_layers lists it; "
                             "the config and the tensors disagree")
        linears[name] = BlockQuantizedLinear(name, w, s, tensors.get(f"{name}.bias"))
        used |= {f"{name}.weight", f"{name}{SCALE_SUFFIX}", f"{name}.bias"}
    for key, t in tensors.items():
        if key not in used and t.dtype == torch.float8_e4m3fn:
            raise InputError(f"{source}: tensor {key!r} is float8_e4m3fn but has no '{SCALE_SUFFIX}'; "
                             "the checkpoint is malformed")
    dense = {k: v for k, v in tensors.items() if k not in used}
    return BlockFp8Checkpoint(config=config, scheme=scheme, linears=linears, dense=dense)


def read_block_fp8(folder: str | Path) -> BlockFp8Checkpoint:
    """Read and validate the block-scaled fp8 checkpoint in `folder` (InputError if it is not one)."""
    return parse_block_fp8(read_config(folder), read_tensors(folder), str(folder))


def quantize_dense_block_fp8(
    config: Mapping,
    tensors: Mapping[str, torch.Tensor],
    *,
    layout: BlockLayout = DEEPSEEK_V3,
    is_target: Callable[[str], bool] = is_decoder_linear,
) -> BlockFp8Checkpoint:
    """Quantize a dense checkpoint's target Linears to block-scaled e4m3 (`alibi.exact.fp8_block.quantize_fp8_blocks`:
    vLLM's group rule over 2-D blocks, a ragged last block scaled over what exists); everything else stays as it is.
    The result's config is the dense one with the block `quantization_config` added."""
    scheme = BlockFp8Scheme(layout)

    def quantized(name: str, weight: torch.Tensor, bias: torch.Tensor | None) -> BlockQuantizedLinear:
        return BlockQuantizedLinear(name, *quantize_fp8_blocks(weight, layout), bias)

    linears, dense = quantize_targets(tensors, is_target, quantized)
    new_config = copy.deepcopy(dict(config))
    new_config["quantization_config"] = scheme.to_quantization_config()
    return BlockFp8Checkpoint(config=new_config, scheme=scheme, linears=linears, dense=dense)


__all__ = ["BlockFp8Checkpoint", "BlockFp8Scheme", "BlockQuantizedLinear", "FORMAT_NAME", "QUANT_METHOD",
           "SCALE_SUFFIX", "is_block_fp8_config", "parse_block_fp8", "quantize_dense_block_fp8", "read_block_fp8"]
