"""compressed-tensors W8A8 checkpoints (`format: int-quantized`): parse, validate, read, write, quantize.

The layout (science.md §4), as llm-compressor's `W8A8` preset writes it:

- `config.json` carries `quantization_config = {quant_method: "compressed-tensors", format:
  "int-quantized", config_groups: {group_0: {targets: ["Linear"], weights: {num_bits: 8, type:
  "int", symmetric: true, strategy: "channel", dynamic: false, ...}, input_activations: {num_bits:
  8, type: "int", symmetric: true, strategy: "token", dynamic: true, ...}}}, ignore: ["lm_head"]}`;
- each quantized module `<m>` has `<m>.weight` int8 `[N,K]` and `<m>.weight_scale` `[N,1]` in the
  model's dtype (often bf16), no zero point (symmetric), optionally `<m>.bias`;
- every other tensor (embeddings, norms, `lm_head`) is stored as in the dense checkpoint.

Supported: int8 symmetric static weights per channel (or per tensor, broadcast to `[N]`) with
dynamic symmetric per-token int8 activations — the operands the toolkit's kernels take. Anything
else (group or block weights, static or asymmetric activations, FP8, packed int4, a KV-cache
scheme) is refused with an error naming the field, because a runner that silently ignored it
would compute a different model.

Reading widens scales to fp32 (as vLLM does); writing stores them back in their recorded dtype and
refuses a scale that dtype cannot hold exactly, so a read → write round trip is bit-identical and a
rewrite (e.g. to powers of two) never rounds silently.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch

from alibi.errors import InputError, shown
from alibi.exact.numerics import dtype_name
from alibi.exact.quant import quantize_weight_per_channel
from alibi.model.checkpoint import (
    CONFIG_FILE,
    INDEX_FILE,
    MANIFEST_FILE,
    read_config,
    read_tensors,
    weight_files,
    write_checkpoint,
)

FORMAT = "int-quantized"
QUANT_METHOD = "compressed-tensors"
SCALE_SUFFIX = ".weight_scale"
_UNSUPPORTED_SUFFIXES = (".weight_zero_point", ".input_scale", ".input_zero_point", ".weight_g_idx",
                         ".weight_global_scale", ".weight_packed", ".weight_shape")
L = TypeVar("L")  # a checkpoint format's quantized Linear (`quantize_targets`)
SCALE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def module_listed(entries: tuple[str, ...], module: str) -> bool:
    """Whether `module` is one of `entries`: a module name (matching the whole name or its last dotted parts) or
    an `re:` pattern matched from the start of the name, as compressed-tensors' `ignore` and HF's
    `ignored_layers` / `modules_to_not_convert` lists write them."""
    for entry in entries:
        if entry.startswith("re:"):
            if re.match(entry[3:], module):
                return True
        elif module == entry or module.endswith("." + entry):
            return True
    return False


def checked_module_list(entries: object, source: str, field: str) -> list[str]:
    """`entries` (the value of `quantization_config.<field>` in `source`) if it is a list of module names and valid
    `re:` patterns (see `module_listed`); InputError otherwise."""
    if not isinstance(entries, list) or not all(isinstance(i, str) for i in entries):
        raise InputError(f"{source}: quantization_config.{field} must be a list of module names")
    for entry in entries:
        if entry.startswith("re:"):
            try:
                re.compile(entry[3:])
            except re.error as exc:
                raise InputError(f"{source}: quantization_config.{field} entry {shown(entry)} is not a valid "
                                 f"regular expression ({exc}); fix the pattern") from None
    return entries


@dataclass(frozen=True)
class W8A8Scheme:
    """The part of `quantization_config` the toolkit honours.

    targets: what the config group quantizes (usually `["Linear"]`); ignore: module names or
    `re:` patterns left dense (usually `["lm_head"]`); weight_strategy: `channel` (one scale per
    output row) or `tensor` (one scale, broadcast). Activations are always dynamic, symmetric,
    per-token int8: nothing else is accepted.
    """

    targets: tuple[str, ...] = ("Linear",)
    ignore: tuple[str, ...] = ("lm_head",)
    weight_strategy: str = "channel"

    def ignores(self, module: str) -> bool:
        """Whether `module` is listed in `ignore` (by name or by an `re:` pattern)."""
        return module_listed(self.ignore, module)

    def to_quantization_config(self) -> dict:
        """The `quantization_config` object as llm-compressor writes it for this scheme."""
        weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": self.weight_strategy,
                   "dynamic": False, "group_size": None, "block_structure": None, "actorder": None,
                   "observer": "minmax", "observer_kwargs": {}}
        activations = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
                       "dynamic": True, "group_size": None, "block_structure": None, "actorder": None,
                       "observer": None, "observer_kwargs": {}}
        return {
            "quant_method": QUANT_METHOD,
            "format": FORMAT,
            "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": list(self.targets), "weights": weights,
                                          "input_activations": activations, "output_activations": None}},
            "ignore": list(self.ignore),
            "kv_cache_scheme": None,
            "global_compression_ratio": None,
        }

    @classmethod
    def from_config(cls, config: Mapping, source: str) -> W8A8Scheme:
        """Parse and validate `config['quantization_config']`; `source` names the file in errors."""
        qc = config.get("quantization_config")
        if qc is None:
            raise InputError(f"{source}: has no quantization_config; this is a dense checkpoint, not W8A8 "
                             "(quantize it with `alibi model prepare` or pass a W8A8 checkpoint)")
        if not isinstance(qc, Mapping):
            raise InputError(f"{source}: quantization_config must be an object")

        def unsupported(field: str, value: object, want: str) -> InputError:
            return InputError(f"{source}: unsupported quantization scheme: {field} is {value!r}, expected {want}; "
                              "only compressed-tensors int-quantized W8A8 (int8 per-channel weights, dynamic "
                              "per-token int8 activations) is supported")

        if qc.get("quant_method") != QUANT_METHOD:
            raise unsupported("quant_method", qc.get("quant_method"), repr(QUANT_METHOD))
        groups = qc.get("config_groups")
        if not isinstance(groups, Mapping) or not groups:
            raise InputError(f"{source}: quantization_config.config_groups is missing or empty")
        if qc.get("kv_cache_scheme") is not None:
            raise unsupported("quantization_config.kv_cache_scheme", qc.get("kv_cache_scheme"), "null")
        targets: list[str] = []
        strategies = set()
        for gname, group in groups.items():
            where = f"quantization_config.config_groups.{gname}"
            if not isinstance(group, Mapping):
                raise InputError(f"{source}: {where} must be an object")
            fmt = group.get("format") or qc.get("format")
            if fmt != FORMAT:
                raise unsupported(f"{where}.format (or quantization_config.format)", fmt, repr(FORMAT))
            w, a = group.get("weights"), group.get("input_activations")
            if not isinstance(w, Mapping):
                raise unsupported(f"{where}.weights", w, "an int8 weight scheme")
            if not isinstance(a, Mapping):
                raise unsupported(f"{where}.input_activations", a, "dynamic per-token int8 (weight-only schemes "
                                  "are not W8A8)")
            for field, want in (("num_bits", 8), ("type", "int"), ("symmetric", True), ("dynamic", False)):
                if w.get(field) != want:
                    raise unsupported(f"{where}.weights.{field}", w.get(field), repr(want))
            if w.get("strategy") not in ("channel", "tensor"):
                raise unsupported(f"{where}.weights.strategy", w.get("strategy"), "'channel' or 'tensor'")
            for field, want in (("num_bits", 8), ("type", "int"), ("symmetric", True), ("dynamic", True),
                                ("strategy", "token")):
                if a.get(field) != want:
                    raise unsupported(f"{where}.input_activations.{field}", a.get(field), repr(want))
            if group.get("output_activations") is not None:
                raise unsupported(f"{where}.output_activations", group.get("output_activations"), "null")
            targets += list(group.get("targets") or [])
            strategies.add(w["strategy"])
        if len(strategies) > 1:
            raise unsupported("weights.strategy across config groups", sorted(strategies), "one strategy")
        ignore = checked_module_list(qc.get("ignore") or [], source, "ignore")
        return cls(tuple(targets), tuple(ignore), strategies.pop())


class WeightShape:
    """N and K of a quantized Linear, read from its `weight` [N, K]."""

    weight: torch.Tensor

    @property
    def N(self) -> int:
        return self.weight.shape[0]

    @property
    def K(self) -> int:
        return self.weight.shape[1]


@dataclass(frozen=True)
class QuantizedLinear(WeightShape):
    """One quantized Linear: int8 `weight` [N,K], fp32 `scale` [N], the dtype the scale is stored
    in (`scale_dtype`), and an optional `bias` [N] in the model's dtype."""

    name: str
    weight: torch.Tensor
    scale: torch.Tensor
    scale_dtype: torch.dtype
    bias: torch.Tensor | None = None

    def replace(self, **changes) -> QuantizedLinear:
        return dataclasses.replace(self, **changes)

    def stored_scale(self) -> torch.Tensor:
        """The scale as the checkpoint stores it, `[N,1]` in `scale_dtype`; exact or ValueError."""
        stored = self.scale.to(self.scale_dtype)
        if not torch.equal(stored.to(torch.float32), self.scale.to(torch.float32)):
            bad = int((stored.to(torch.float32) != self.scale).sum())
            raise ValueError(f"{self.name}: {bad} scale(s) are not representable in {dtype_name(self.scale_dtype)}; "
                             "round them first or store the scales as float32")
        return stored.reshape(-1, 1)


@dataclass(frozen=True)
class W8A8Checkpoint:
    """A compressed-tensors W8A8 checkpoint in memory.

    config: the whole `config.json` (with its quantization_config); scheme: the parsed scheme;
    linears: the quantized modules by name, in natural name order (layer 2 before layer 10); dense: every other tensor as
    stored (embeddings, norms, lm_head, ...).
    """

    config: Mapping
    scheme: W8A8Scheme
    linears: Mapping[str, QuantizedLinear]
    dense: Mapping[str, torch.Tensor]

    def tensors(self) -> dict[str, torch.Tensor]:
        """The checkpoint's tensors in stored form (int8 weights, `[N,1]` scales, dense tensors)."""
        out = dict(self.dense)
        for name, lin in self.linears.items():
            out[f"{name}.weight"] = lin.weight
            out[f"{name}{SCALE_SUFFIX}"] = lin.stored_scale()
            if lin.bias is not None:
                out[f"{name}.bias"] = lin.bias
        return out

    def replace_linears(self, linears: Mapping[str, QuantizedLinear]) -> W8A8Checkpoint:
        """A copy with some quantized modules replaced (names must already exist)."""
        unknown = set(linears) - set(self.linears)
        if unknown:
            raise ValueError(f"no quantized module(s) {sorted(unknown)} in this checkpoint")
        return dataclasses.replace(self, linears={**self.linears, **linears})


def natural_key(name: str) -> tuple:
    """Sort key that orders `layers.10` after `layers.9` (numbers compared as numbers)."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def parse_w8a8(config: Mapping, tensors: Mapping[str, torch.Tensor], source: str) -> W8A8Checkpoint:
    """Validate `tensors` against the W8A8 layout and split them into quantized modules and the rest."""
    scheme = W8A8Scheme.from_config(config, f"{source}/{CONFIG_FILE}")
    for key in tensors:
        if key.endswith(_UNSUPPORTED_SUFFIXES):
            if key.endswith(".weight_zero_point") and not bool(tensors[key].to(torch.int32).any()):
                continue  # an all-zero zero point is what some writers store for symmetric schemes
            raise InputError(f"{source}: tensor {key!r} belongs to a scheme this toolkit does not run "
                             "(zero points, static activation scales, packed or grouped weights); "
                             "only symmetric W8A8 int-quantized checkpoints are supported")
    modules = sorted((k[: -len(SCALE_SUFFIX)] for k in tensors if k.endswith(SCALE_SUFFIX)), key=natural_key)
    if not modules:
        raise InputError(f"{source}: quantization_config says W8A8 but no tensor ends in '{SCALE_SUFFIX}'; "
                         "the checkpoint is malformed (were the weights saved uncompressed?)")
    linears: dict[str, QuantizedLinear] = {}
    used: set[str] = set()
    for name in modules:
        w = tensors.get(f"{name}.weight")
        s = tensors[f"{name}{SCALE_SUFFIX}"]
        if w is None:
            raise InputError(f"{source}: {name}{SCALE_SUFFIX} has no matching {name}.weight; the checkpoint is malformed")
        if w.dtype != torch.int8 or w.dim() != 2:
            raise InputError(f"{source}: {name}.weight is {dtype_name(w.dtype)} {list(w.shape)}; "
                             "an int-quantized W8A8 weight must be int8 [N,K]")
        if s.dtype not in SCALE_DTYPES.values():
            raise InputError(f"{source}: {name}{SCALE_SUFFIX} has dtype {dtype_name(s.dtype)}; expected a float dtype")
        n = w.shape[0]
        if scheme.weight_strategy == "channel" and tuple(s.shape) not in ((n, 1), (n,)):
            raise InputError(f"{source}: {name}{SCALE_SUFFIX} has shape {list(s.shape)}; per-channel weights "
                             f"need [{n}, 1]")
        if scheme.weight_strategy == "tensor" and s.numel() != 1:
            raise InputError(f"{source}: {name}{SCALE_SUFFIX} has shape {list(s.shape)}; a per-tensor scale "
                             "has one element")
        scale = s.to(torch.float32).reshape(-1).expand(n).contiguous()
        if not bool(torch.isfinite(scale).all()) or not bool((scale > 0).all()):
            raise InputError(f"{source}: {name}{SCALE_SUFFIX} holds zero, negative or non-finite scales")
        if scheme.ignores(name):
            raise InputError(f"{source}: {name} is quantized but quantization_config.ignore lists it; "
                             "the config and the tensors disagree")
        bias = tensors.get(f"{name}.bias")
        linears[name] = QuantizedLinear(name, w, scale, s.dtype, bias)
        used |= {f"{name}.weight", f"{name}{SCALE_SUFFIX}", f"{name}.bias", f"{name}.weight_zero_point"}
    for key, t in tensors.items():
        if key not in used and t.dtype == torch.int8:
            raise InputError(f"{source}: tensor {key!r} is int8 but has no '{SCALE_SUFFIX}'; "
                             "the checkpoint is malformed")
    dense = {k: v for k, v in tensors.items() if k not in used}
    return W8A8Checkpoint(config=config, scheme=scheme, linears=linears, dense=dense)


def read_w8a8(folder: str | Path) -> W8A8Checkpoint:
    """Read and validate the compressed-tensors W8A8 checkpoint in `folder` (InputError if it is not one)."""
    config = read_config(folder)
    return parse_w8a8(config, read_tensors(folder), str(folder))


def is_w8a8(folder: str | Path) -> bool:
    """Whether the checkpoint in `folder` declares a quantization_config (dense checkpoints do not)."""
    return "quantization_config" in read_config(folder)


# Projection names of the decoder Linears in Llama/Qwen-style models (attention and MLP).
DECODER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def is_decoder_linear(tensor_name: str) -> bool:
    """Whether `tensor_name` is the weight of a decoder Linear (`model.layers.<i>.<...>.<proj>.weight`)."""
    return bool(re.fullmatch(r".*layers\.\d+\..*\b(" + "|".join(DECODER_LINEARS) + r")\.weight", tensor_name))


def quantize_targets(
    tensors: Mapping[str, torch.Tensor],
    is_target: Callable[[str], bool],
    quantize: Callable[[str, torch.Tensor, torch.Tensor | None], L],
) -> tuple[dict[str, L], dict[str, torch.Tensor]]:
    """Split a dense checkpoint's tensors: each target Linear (`is_target` of its weight's name) as
    `quantize(module name, weight, bias or None)`, in natural name order, and every other tensor as it is (the
    dense ones: embeddings, norms, lm_head, ...). InputError when no tensor is a target."""
    linears: dict[str, L] = {}
    for key in sorted(tensors, key=natural_key):
        if is_target(key):
            name = key.removesuffix(".weight")
            linears[name] = quantize(name, tensors[key], tensors.get(f"{name}.bias"))
    if not linears:
        raise InputError("no tensor matched the quantization targets; is this a Llama/Qwen-style decoder checkpoint?")
    dense = {k: t for k, t in tensors.items()
             if k.removesuffix(".weight") not in linears and k.removesuffix(".bias") not in linears}
    return linears, dense


def quantize_dense(
    config: Mapping,
    tensors: Mapping[str, torch.Tensor],
    *,
    scale_dtype: torch.dtype = torch.bfloat16,
    is_target: Callable[[str], bool] = is_decoder_linear,
    scheme: W8A8Scheme = W8A8Scheme(),
) -> W8A8Checkpoint:
    """Quantize a dense checkpoint's target Linears to W8A8 (compressed-tensors convention).

    Each target weight `[N,K]` gets `scale = RN(absmax/127.5)` rounded to `scale_dtype` (the
    checkpoint's storage dtype) and `q = clamp(round_half_even(w / scale), -128, 127)` computed
    with that stored scale, so the dequantized weight `q·scale` is exactly what a reader sees.
    """
    def quantized(name: str, weight: torch.Tensor, bias: torch.Tensor | None) -> QuantizedLinear:
        q, s = quantize_weight_per_channel(weight, scale_dtype=scale_dtype)
        return QuantizedLinear(name, q, s, scale_dtype, bias)

    linears, dense = quantize_targets(tensors, is_target, quantized)
    new_config = copy.deepcopy(dict(config))
    new_config["quantization_config"] = scheme.to_quantization_config()
    return W8A8Checkpoint(config=new_config, scheme=scheme, linears=linears, dense=dense)


def side_files(folder: str | Path) -> dict[str, bytes]:
    """{name: bytes} of the files in `folder` that are neither config, weights nor manifest
    (tokenizer, generation config, chat template, licence, ...), to carry over unchanged."""
    folder = Path(folder)
    skip = {CONFIG_FILE, INDEX_FILE, MANIFEST_FILE} | {p.name for p in weight_files(folder)}
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())
            if p.is_file() and p.name not in skip and not p.name.startswith(".")}


def write_w8a8(ckpt: W8A8Checkpoint, folder: str | Path, copy_from: str | Path | None = None) -> None:
    """Write `ckpt` into the (staging) `folder`: config.json, one model.safetensors, and — with
    `copy_from` — every side file of that checkpoint byte for byte (see `side_files`).

    Dense tensors are written with their stored dtype and bits; scales in each module's
    `scale_dtype` (ValueError if a scale is not representable there).
    """
    write_checkpoint(folder, ckpt.config, ckpt.tensors(), side_files(copy_from) if copy_from else None)
