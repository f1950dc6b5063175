"""Power-of-two weight scales for compressed-tensors W8A8 checkpoints (`alibi pow2-rewrite`).

Why: if every weight scale is a power of two, `(acc·s_a)·s_w`, `(acc·s_w)·s_a` and `acc·(s_a·s_w)`
round to the same fp32 for normal results (science.md §2.3), so the two vLLM int8 epilogue orders
(CUTLASS: weight scale first; Triton: activation scale first) return the same bits. The rewrite
replaces each `<module>.weight_scale` by `2^k` with `k = round(log2 s)`, `ceil` or `floor`
(`alibi.exact.numerics.pow2_round`, computed exactly from the float's exponent), under one of two
weight policies:

- `keep-weights` changes only the scales (the paper's probe). Channel n's effective weights
  `q·s` are then multiplied by `s_new/s_old`: within [2^-½, 2^½] for `nearest`, [1, 2) for `ceil`,
  (½, 1] for `floor`. That is a different model, and on a 135M model a much worse one.
- `requantize` re-derives the int8 weights from the original dense weights under the new scale,
  `q = clamp(round_half_even(w / s_new), -128, 127)`. The division is exact in fp32 because
  `s_new` is a power of two (it only shifts the exponent). Under `ceil`, `s_new ≥ s_old`, so
  `|w/s_new| ≤ |w/s_old|`: no weight saturates that did not already saturate under the original
  scale, at the price of a step up to 2× coarser. Under `nearest` or `floor`, `s_new` can be
  smaller than `absmax/127.5` and the largest weights of a channel saturate at ±127/−128; the
  rewrite counts them per layer.

The new scale is stored in the dtype the checkpoint records for it (often bf16). A power of two
is exact in bf16, fp16 and fp32 while it lies in the dtype's range (subnormal powers of two
included); one that is not — e.g. `ceil` of an fp16 scale above 2^15 — is refused, never rounded.

Everything else is copied: config, tokenizer and other side files byte for byte, the shard
layout and its index, every tensor other than `weight_scale` (and, when requantizing, `weight`)
bit for bit. The output folder is staged and renamed into place only when complete, with a
`manifest.json` recording the input's digests, the mode, the weight policy and what changed in
each layer. Run it as `alibi pow2-rewrite IN OUT ...` (`alibi.cli.pow2`; this library module
imports no CLI code and has no `__main__`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch
from safetensors.torch import save_file

from alibi.errors import InputError
from alibi.exact.numerics import Pow2Mode, dtype_name, is_pow2, pow2_round
from alibi.exact.quant import INT8_MAX, INT8_MIN, quantize_weight_per_channel
from alibi.governance.manifest import build_predicate, digest_set, digest_tree, verify_files, write_manifest
from alibi.io import atomic
from alibi.model.checkpoint import checkpoint_digests, load_shard, read_config, read_tensors, weight_files
from alibi.model.compressed_tensors import parse_w8a8
from alibi.model.digests import tensors_sha256

WeightPolicy = Literal["keep-weights", "requantize"]
MODES: tuple[str, ...] = ("nearest", "ceil", "floor")
SCALE_SUFFIX = ".weight_scale"
MANIFEST_FILE = "manifest.json"


@dataclass(frozen=True)
class LayerRewrite:
    """What the rewrite did to one quantized Linear.

    name: the module; channels: output channels N; scales_changed: channels whose stored scale
    was not already the requested power of two; weights_changed: int8 weights that differ from
    the input's (0 when keeping weights); weights_saturated: weights whose requantized value
    `round(w / s_new)` lay outside [-128, 127] and was clamped (requantize only); scale_ratio_min
    / scale_ratio_max: the range of `s_new / s_old` over the channels.
    """

    name: str
    channels: int
    scales_changed: int
    weights_changed: int
    weights_saturated: int
    scale_ratio_min: float
    scale_ratio_max: float


@dataclass(frozen=True)
class SourceAgreement:
    """How well the dense checkpoint given to `--requantize-from` explains the W8A8 one.

    weights_reproduced / weights_total: int8 weights that requantizing the dense weights under the
    *original* scales gives back exactly (all of them when the W8A8 checkpoint was made from these
    weights by round-to-nearest, fewer after GPTQ-style calibration); dense_tensors_differing:
    tensors other than the quantized weights present in both checkpoints whose bits differ (e.g.
    norms rescaled by SmoothQuant — then the dense weights are not the W8A8 model's weights).
    """

    weights_reproduced: int
    weights_total: int
    dense_tensors_differing: tuple[str, ...]

    @property
    def exact(self) -> bool:
        return self.weights_reproduced == self.weights_total and not self.dense_tensors_differing


@dataclass(frozen=True)
class Pow2RewriteResult:
    """The written checkpoint `out`, the `mode` and `weight_policy` used, each layer's
    `LayerRewrite`, and (requantize only) the `source` agreement."""

    out: Path
    mode: str
    weight_policy: str
    layers: tuple[LayerRewrite, ...]
    source: SourceAgreement | None

    @property
    def scales_total(self) -> int:
        return sum(layer.channels for layer in self.layers)

    @property
    def scales_changed(self) -> int:
        return sum(layer.scales_changed for layer in self.layers)

    @property
    def weights_changed(self) -> int:
        return sum(layer.weights_changed for layer in self.layers)

    @property
    def weights_saturated(self) -> int:
        return sum(layer.weights_saturated for layer in self.layers)


# --- numerics: pure functions of tensors -------------------------------------------------------


def pow2_stored_scale(stored: torch.Tensor, mode: Pow2Mode, name: str = "weight_scale") -> torch.Tensor:
    """`stored` (any shape, in its own float dtype) rounded to powers of two, in the same dtype and shape.

    Computed in float64 from the exact stored values; InputError if a result is not exactly
    representable in the stored dtype (out of its range), naming the module and the dtype.
    """
    wide = stored.to(torch.float64)
    target = pow2_round(wide, mode)
    back = target.to(stored.dtype)
    exact = torch.isfinite(back) & (back.to(torch.float64) == target)
    if not bool(exact.all()):
        bad = target[~exact]
        raise InputError(f"{name}: {bad.numel()} power-of-two scale(s) (e.g. {float(bad[0]):.6g} from mode {mode!r}) "
                         f"are outside the range of {dtype_name(stored.dtype)}, the dtype the checkpoint stores its "
                         "scales in; choose another --mode or store the scales as float32")
    return back


def requantize(weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Int8 weights [N,K] of the dense `weight` under per-channel `scale` [N] (fp32 power-of-two),
    and how many of them saturated (`round(w/s)` outside [-128, 127], then clamped)."""
    q, s = quantize_weight_per_channel(weight, scale=scale)
    unclamped = torch.round(weight.to(torch.float32) / s.unsqueeze(-1))
    saturated = int(((unclamped < INT8_MIN) | (unclamped > INT8_MAX)).sum())
    return q, saturated


def rewrite_tensors(
    tensors: Mapping[str, torch.Tensor],
    modules: list[str],
    mode: Pow2Mode,
    dense: Mapping[str, torch.Tensor] | None = None,
) -> tuple[dict[str, torch.Tensor], tuple[LayerRewrite, ...]]:
    """The replacement tensors of a pow2 rewrite, and what changed per layer.

    tensors: the W8A8 checkpoint's stored tensors; modules: its quantized modules (each has
    `<m>.weight` int8 [N,K] and `<m>.weight_scale`); dense: the original dense tensors to
    requantize from (None keeps the int8 weights). Returns only the tensors that are replaced,
    `<m>.weight_scale` (same dtype and shape as stored) and, when requantizing, `<m>.weight`.
    """
    replaced: dict[str, torch.Tensor] = {}
    layers = []
    for m in modules:
        w_q, stored = tensors[f"{m}.weight"], tensors[f"{m}{SCALE_SUFFIX}"]
        new_stored = pow2_stored_scale(stored, mode, f"{m}{SCALE_SUFFIX}")
        n = w_q.shape[0]
        old = stored.to(torch.float32).reshape(-1).expand(n)
        new = new_stored.to(torch.float32).reshape(-1).expand(n).contiguous()
        replaced[f"{m}{SCALE_SUFFIX}"] = new_stored
        changed_weights = saturated = 0
        if dense is not None:
            new_q, saturated = requantize(dense[f"{m}.weight"], new)
            changed_weights = int((new_q != w_q).sum())
            replaced[f"{m}.weight"] = new_q
        ratio = (new.to(torch.float64) / old.to(torch.float64))
        layers.append(LayerRewrite(m, n, int((new != old).sum()), changed_weights, saturated,
                                   float(ratio.min()), float(ratio.max())))
    return replaced, tuple(layers)


def source_agreement(tensors: Mapping[str, torch.Tensor], modules: list[str],
                     dense: Mapping[str, torch.Tensor]) -> SourceAgreement:
    """Whether `dense` is what the W8A8 `tensors` were quantized from (see `SourceAgreement`)."""
    reproduced = total = 0
    for m in modules:
        w_q, stored = tensors[f"{m}.weight"], tensors[f"{m}{SCALE_SUFFIX}"]
        scale = stored.to(torch.float32).reshape(-1).expand(w_q.shape[0])
        q, _ = quantize_weight_per_channel(dense[f"{m}.weight"], scale=scale)
        reproduced += int((q == w_q).sum())
        total += w_q.numel()
    quantized = {f"{m}.weight" for m in modules} | {f"{m}{SCALE_SUFFIX}" for m in modules}
    differing = tuple(sorted(
        k for k in tensors.keys() & dense.keys()
        if k not in quantized and not _same_bits(tensors[k], dense[k])))
    return SourceAgreement(reproduced, total, differing)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


# --- validation -------------------------------------------------------------------------------


def check_dense_source(dense: Mapping[str, torch.Tensor], tensors: Mapping[str, torch.Tensor],
                       modules: list[str], source: str) -> None:
    """InputError unless `dense` holds a floating `<m>.weight` of the W8A8 weight's shape for every module."""
    for m in modules:
        key = f"{m}.weight"
        want = list(tensors[key].shape)
        w = dense.get(key)
        if w is None:
            raise InputError(f"{source}: has no tensor {key!r}, which the W8A8 checkpoint quantizes; "
                             "--requantize-from needs the dense checkpoint the W8A8 one was made from")
        if not w.is_floating_point() or list(w.shape) != want:
            raise InputError(f"{source}: {key} is {dtype_name(w.dtype)} {list(w.shape)}, but the W8A8 checkpoint's "
                             f"weight is {want}; --requantize-from needs the matching dense (bf16/fp16/fp32) checkpoint")


def check_paths(src: Path, out: Path, requantize_from: Path | None, overwrite: bool) -> None:
    """Refuse an output that is, contains or lies inside an input, and an existing output unless
    `overwrite` (and then only if it is empty or a checkpoint folder alibi wrote, holding nothing else:
    `atomic.check_replaceable`, never an arbitrary folder)."""
    if not src.is_dir():
        raise InputError(f"{src}: no such checkpoint folder; pass the W8A8 checkpoint to rewrite")
    atomic.refuse_overlap(out, {"the input checkpoint": src, "--requantize-from": requantize_from},
                          what="the rewritten checkpoint")
    if (out.exists() or out.is_symlink()) and not overwrite:
        raise InputError(f"{out}: already exists; choose another output folder or pass --overwrite")
    atomic.check_writable_dir(out)
    atomic.check_replaceable(out, kind="checkpoint")


# --- I/O --------------------------------------------------------------------------------------


def checkpoint_files(folder: Path) -> list[str]:
    """Relative POSIX paths of the files a checkpoint folder holds, sorted: every regular file
    below it (symbolic links followed, as in a Hugging Face cache snapshot) except the root
    `manifest.json` and anything whose name starts with a dot."""
    out = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(folder).as_posix()
            if not name.startswith(".") and rel != MANIFEST_FILE and path.is_file():
                out.append(rel)
    return sorted(out)


def tree_sha256(folder: Path) -> str:
    """The folder digest (`alibi.governance.manifest.digest_tree`) over `checkpoint_files`, so a
    Hugging Face snapshot's symbolic links are followed: changes exactly when a covered file's
    bytes, name or presence change."""
    return digest_tree(folder, files=checkpoint_files(folder))


def _verify_own_manifest(folder: Path) -> bool:
    """Check `folder` against its manifest when it has one (InputError on a mismatch); whether it had one."""
    if not (folder / MANIFEST_FILE).is_file():
        return False
    problems = verify_files(folder)
    if problems:
        raise InputError(f"{folder}: does not match its manifest.json ({problems[0]}); restore the checkpoint "
                         "or remove its manifest if you changed it on purpose")
    return True


def _read_dense(folder: Path) -> dict[str, torch.Tensor]:
    config = read_config(folder)
    if "quantization_config" in config:
        raise InputError(f"{folder}: is a quantized checkpoint (its config.json has a quantization_config); "
                         "--requantize-from needs the dense checkpoint the W8A8 one was made from")
    return read_tensors(folder)


def _write(src: Path, stage: Path, replaced: Mapping[str, torch.Tensor]) -> None:
    """Copy `src` into `stage` file by file, replacing tensors in their own shard (layout kept).

    The shards are the files the index names (`weight_files`: each inside `src`, refused
    otherwise), rewritten whatever their names; every other file is copied byte for byte. Every
    replaced tensor must land in some shard.
    """
    shards = [p.relative_to(src).as_posix() for p in weight_files(src)]
    for rel in checkpoint_files(src):
        if rel not in shards:
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, stage / rel)
    written: set[str] = set()
    for rel in shards:
        target = stage / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        part, metadata = load_shard(src / rel)
        mine = {k: v for k, v in replaced.items() if k in part}
        part.update(mine)
        written |= mine.keys()
        save_file({k: v.contiguous() for k, v in part.items()}, str(target), metadata=metadata)
    if written != set(replaced):
        missing = sorted(set(replaced) - written)
        raise InputError(f"{src}: tensor {missing[0]!r} is in no shard the index names; nothing was written")


def check_written(stage: Path, modules: list[str], expected: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Read the written checkpoint back and refuse it unless it is what the rewrite promised.

    It must be a valid W8A8 checkpoint with exactly the input's quantized modules, every
    `weight_scale` a power of two (`is_pow2`, exact), and tensors bit-identical to `expected`
    (compared by tensor digest). Returns the tensors read back (the manifest's digests are
    computed from them, not from memory). InputError — nothing is renamed into place — otherwise.
    """
    tensors = read_tensors(stage)
    ckpt = parse_w8a8(read_config(stage), tensors, str(stage))
    if sorted(ckpt.linears) != sorted(modules):
        raise InputError(f"the rewritten checkpoint holds {len(ckpt.linears)} quantized modules, the input "
                         f"{len(modules)}; nothing was written")
    for name, lin in ckpt.linears.items():
        bad = int((~is_pow2(lin.scale)).sum())
        if bad:
            raise InputError(f"after writing, {name}{SCALE_SUFFIX} holds {bad} scale(s) that are not powers of two; "
                             "nothing was written")
    if tensors_sha256(tensors) != tensors_sha256(expected):
        raise InputError("the rewritten checkpoint's tensors differ from the rewrite's; nothing was written")
    return tensors


def pow2_rewrite(src: str | os.PathLike, out: str | os.PathLike, mode: Pow2Mode, *,
                 requantize_from: str | os.PathLike | None = None, overwrite: bool = False) -> Pow2RewriteResult:
    """Rewrite the W8A8 checkpoint `src` into `out` with power-of-two weight scales.

    mode: `nearest`, `ceil` or `floor` (of log2 of each stored scale); requantize_from: the dense
    checkpoint to re-derive the int8 weights from under the new scales (None keeps the int8
    weights); overwrite: replace an existing checkpoint folder at `out`. Nothing is written unless
    the whole checkpoint is (InputError for bad input, before anything is written).
    """
    if mode not in MODES:
        raise InputError(f"--mode {mode!r} is unknown; use one of {', '.join(MODES)}")
    src, out = Path(src), Path(out)
    dense_dir = None if requantize_from is None else Path(requantize_from)
    check_paths(src, out, dense_dir, overwrite)
    if dense_dir is not None and not dense_dir.is_dir():
        raise InputError(f"{dense_dir}: no such checkpoint folder; --requantize-from needs the dense checkpoint")

    src_verified = _verify_own_manifest(src)
    tensors = read_tensors(src)  # stored form: scales keep their own dtype and shape
    modules = list(parse_w8a8(read_config(src), tensors, str(src)).linears)  # InputError unless W8A8
    dense = agreement = None
    dense_verified = False
    if dense_dir is not None:
        dense_verified = _verify_own_manifest(dense_dir)
        dense = _read_dense(dense_dir)
        check_dense_source(dense, tensors, modules, str(dense_dir))
        agreement = source_agreement(tensors, modules, dense)
    replaced, layers = rewrite_tensors(tensors, modules, mode, dense)
    policy: WeightPolicy = "keep-weights" if dense is None else "requantize"
    result = Pow2RewriteResult(out, mode, policy, layers, agreement)

    inputs = {"checkpoint": {"name": src.name or "checkpoint", "digest": digest_set(tree_sha256(src))}}
    if dense_dir is not None:
        inputs["dense_checkpoint"] = {"name": dense_dir.name or "dense", "digest": digest_set(tree_sha256(dense_dir))}
    new_tensors = {**tensors, **replaced}
    with atomic.staged_dir(out, overwrite=overwrite) as stage:
        _write(src, stage, replaced)
        written = check_written(stage, modules, new_tensors)  # valid W8A8, all scales pow2, the promised bits
        digests = checkpoint_digests(stage, written)
        parameters = {
            "format": "compressed-tensors/int-quantized",
            "pow2_rewrite": {
                "mode": mode, "weight_policy": policy,
                "scale_dtypes": sorted({dtype_name(tensors[f"{m}{SCALE_SUFFIX}"].dtype) for m in modules}),
                "quantized_linears": len(layers),
                "scales_total": result.scales_total,
                "scales_changed": result.scales_changed,
                "weights_changed": result.weights_changed,
                "weights_saturated": result.weights_saturated,
                "layers": [asdict(x) for x in layers],
                "source_agreement": None if agreement is None else {**asdict(agreement), "exact": agreement.exact},
                "input_verified_against_manifest": src_verified,
                "dense_verified_against_manifest": dense_verified if dense_dir is not None else None,
            },
            "input_tensors_digest": digest_set(tensors_sha256(tensors)),
            "tensors_digest": digest_set(digests.weights),
            "config_digest": digest_set(digests.config),
            "tokenizer_digest": digest_set(digests.tokenizer) if digests.tokenizer else None,
        }
        write_manifest(stage, "checkpoint", build_predicate(inputs=inputs, parameters=parameters))
    return result


def summary_lines(result: Pow2RewriteResult) -> list[str]:
    """What `alibi pow2-rewrite` prints."""
    ratios = [x.scale_ratio_min for x in result.layers] + [x.scale_ratio_max for x in result.layers]
    lines = [(f"pow2-rewrite ({result.mode}, {result.weight_policy}): {len(result.layers)} quantized Linears, "
              f"{result.scales_changed} of {result.scales_total} scales changed (new/old in "
              f"[{min(ratios):.4f}, {max(ratios):.4f}])")]
    if result.weight_policy == "requantize":
        lines.append(f"  requantized: {result.weights_changed} int8 weights changed, {result.weights_saturated} "
                     "saturated at the int8 range")
        src = result.source
        if src is not None and not src.exact:
            lines.append(f"  warning: the dense checkpoint reproduces {src.weights_reproduced} of {src.weights_total} "
                         "original int8 weights" + (f" and {len(src.dense_tensors_differing)} other tensor(s) differ "
                                                    f"(e.g. {src.dense_tensors_differing[0]})"
                                                    if src.dense_tensors_differing else "")
                         + "; it may not be the W8A8 checkpoint's source (calibrated or smoothed quantization)")
    else:
        lines.append("  int8 weights kept: each channel's effective weights are scaled by new/old")
    lines.append(f"  wrote {result.out} (manifest.json records the input digests, mode, policy and per-layer counts)")
    return lines

