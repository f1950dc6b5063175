"""Operand capture: the exact int8 operands and scales each quantized Linear hands its kernel.

`OperandRecorder` attaches an observer to every `W8A8Linear` of a loaded model. The observer runs
inside the Linear's forward after per-token quantization and before the kernel call, and stores a
copy of `a_q` and `s_a` — the very tensors passed to `kernel.scaled_mm` — while the weights and
weight scales are the Linear's own buffers. It returns nothing and touches no tensor it is given,
so the model's outputs with and without capture are bit-identical (a test holds this).

Copies stay on the model's device during the forward (no host synchronisation per layer) and
move to the CPU when tiles are built, so the forward costs little more than one copy of each
layer's int8 activations.

A capture folder holds one tile file per Linear call, named `<call index>_<layer>.safetensors`
in execution order, plus `manifest.json` (kind `capture`) with the model, prompt-set and tokenizer
digests, the kernel and the environment.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import torch

from alibi.errors import InputError
from alibi.exact.fp8_block import LAYOUT_KEY
from alibi.governance.manifest import build_predicate, digest_set, resource, treatment_of, write_manifest
from alibi.io import atomic
from alibi.io.progress import ProgressCallback
from alibi.model.checkpoint import checkpoint_resource, read_config, tokenizer_digest, verified_checkpoint
from alibi.model.prompts import load_prompt_set, require_tokenizer_match
from alibi.model.runner import LoadedModel, W8A8Linear, load_model
from alibi.tiles.tile import Tile, tile_bytes


@dataclass(frozen=True)
class CapturedCall:
    """One call of one quantized Linear: its `layer` name, its `call` number for that layer
    (0 for the first), and the activation operands `a_q` [M,K] int8 and `s_a` [M] fp32."""

    layer: str
    call: int
    a_q: torch.Tensor
    s_a: torch.Tensor


@dataclass
class OperandRecorder:
    """Context manager recording every quantized Linear call of `lm` while active.

    max_calls_per_layer: stop recording a layer after this many calls (e.g. 1 to keep only the
    prefill of a generation); None records all.
    """

    lm: LoadedModel
    max_calls_per_layer: int | None = None
    calls: list[CapturedCall] = field(default_factory=list)
    _counts: dict[str, int] = field(default_factory=dict)
    _linears: dict[str, W8A8Linear] = field(default_factory=dict)

    def _observe(self, layer: W8A8Linear, a_q: torch.Tensor, s_a: torch.Tensor) -> None:
        n = self._counts.get(layer.name, 0)
        if self.max_calls_per_layer is not None and n >= self.max_calls_per_layer:
            return
        self._counts[layer.name] = n + 1
        self.calls.append(CapturedCall(layer.name, n, a_q.detach().clone(), s_a.detach().clone()))

    def __enter__(self) -> Self:
        if not self.lm.quantized:
            raise ValueError("capture needs a W8A8 model: a dense model has no quantized Linears")
        for lin in self.lm.linears():
            self._linears[lin.name] = lin
            lin.observers.append(self._observe)
        return self

    def __exit__(self, *exc) -> None:
        for lin in self._linears.values():
            lin.observers.remove(self._observe)

    def tiles(self, meta: Mapping[str, str] | None = None) -> list[Tile]:
        """One tile per recorded call, in execution order, operands on the CPU.

        The tile name is the layer name (with `#<call>` appended for repeated calls); `meta`
        is added to each tile's metadata together with the layer, its index and the call number.
        """
        order = {name: i for i, name in enumerate(self._linears)}
        repeated = {c.layer for c in self.calls if c.call > 0}
        out = []
        for c in self.calls:
            lin = self._linears[c.layer]
            name = c.layer if c.layer not in repeated else f"{c.layer}#{c.call}"
            tile_meta = {**(meta or {}), "layer": c.layer, "layer_index": str(order[c.layer]), "call": str(c.call),
                         "source": "capture"}
            if getattr(lin, "layout", None) is not None:  # a BlockFp8Linear: a block-scaled tile
                tile_meta[LAYOUT_KEY] = lin.layout.text
            out.append(Tile(
                name=name,
                a_q=c.a_q.cpu(),
                s_a=c.s_a.cpu(),
                w_q=lin.w_q.cpu(),
                s_w=lin.s_w.cpu(),
                bias=None if lin.bias is None else lin.bias.cpu(),
                out_dtype=torch.bfloat16,
                meta=tile_meta,
            ))
        return out


def tile_file_name(index: int, tile: Tile) -> str:
    """`<index>_<tile name>.safetensors` (zero-padded so the listing keeps execution order)."""
    safe = tile.name.replace("/", "_").replace("#", "-")
    return f"{index:04d}_{safe}.safetensors"


def write_tiles(folder: Path, tiles: list[Tile]) -> list[str]:
    """Write validated tiles into the (staging) `folder`; returns the file names in order.

    `tile_bytes` is canonical, so the same operands give the same tile digests on every run.
    """
    names = []
    for i, tile in enumerate(tiles):
        tile.validate()
        name = tile_file_name(i, tile)
        (folder / name).write_bytes(tile_bytes(tile))
        names.append(name)
    return names


@dataclass(frozen=True)
class CaptureResult:
    """What `capture_to_folder` wrote: the `folder`, the tile file names in execution order, M."""

    folder: Path
    files: tuple[str, ...]
    tokens: int


def require_quantized(model_dir: str | Path) -> None:
    """InputError unless `model_dir` is a W8A8 checkpoint: only quantized Linears hand operands to a kernel."""
    if "quantization_config" not in read_config(model_dir):
        raise InputError(f"{model_dir}: is a dense checkpoint, with no quantized Linears whose operands could be "
                         "captured; pass a W8A8 checkpoint (e.g. OUT/w8a8 of `alibi model prepare`)")


# The stages `capture_to_folder` reports: verify the inputs, load the model, run the prefill, write.
CAPTURE_STAGES = 4


def capture_to_folder(model_dir: str | Path, prompts_dir: str | Path, out: str | Path, *, tokens: int | None = None,
                      window: int = 0, kernel: str = "torch-cpu", device: str | None = None,
                      progress: ProgressCallback | None = None) -> CaptureResult:
    """Run one prefill of the first `tokens` tokens (default: all) of prompt window `window` and
    write every quantized Linear's operands as tiles, with a `capture` manifest, to `out` (atomically).

    progress: called `(done, CAPTURE_STAGES, label)` after each stage (alibi.io.progress): verified,
    loaded, ran the prefill, wrote; the label says what the stage did
    (the progress line or bar adds the time since the start)."""
    atomic.refuse_overlap(out, {"--model": model_dir, "--prompts": prompts_dir}, what="the capture folder")
    atomic.check_writable_dir(out)
    atomic.check_replaceable(out)  # before the model loads: --out is replaced whole
    model_dir = Path(model_dir)
    done = 0

    def say(stage: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, CAPTURE_STAGES, stage)

    require_quantized(model_dir)
    prompts = load_prompt_set(prompts_dir)
    if not 0 <= window < prompts.windows:
        raise InputError(f"--window {window} is out of range: {prompts_dir} has windows 0..{prompts.windows - 1}")
    tokens = prompts.tokens if tokens is None else tokens
    if not 1 <= tokens <= prompts.tokens:
        raise InputError(f"--tokens {tokens} is out of range: {prompts_dir} has {prompts.tokens} tokens per window")
    checkpoint = verified_checkpoint(model_dir)
    require_tokenizer_match(prompts, model_dir)
    say(f"verified {model_dir} and {prompts_dir}")
    lm = load_model(model_dir, kernel, device)
    say(f"loaded the model with kernel {lm.kernel.name} on {lm.device}")
    ids = prompts.input_ids[window, :tokens].reshape(1, -1)
    with OperandRecorder(lm) as recorder:
        lm.logits(ids)
    say(f"ran the prefill of window {window} (M = {tokens}): {len(recorder.calls)} Linear calls recorded")
    meta = {"model_tensors_sha256": checkpoint.get("tensors_sha256", ""), "prompts_sha256": prompts.digest,
            "window": str(window), "tokens": str(tokens), "kernel": lm.kernel.name}
    tiles = recorder.tiles(meta)
    with atomic.staged_dir(out) as stage:
        files = write_tiles(stage, tiles)
        write_manifest(stage, "capture", build_predicate(
            inputs={"checkpoint": checkpoint_resource(model_dir.name or "model", model_dir, checkpoint),
                    "prompts": resource(Path(prompts_dir).name or "prompts", prompts_dir),
                    "tokenizer": {"name": "tokenizer", "digest": digest_set(tokenizer_digest(model_dir))}},
            treatment=treatment_of(lm.kernel, "capture"),
            parameters={"window": window, "tokens": tokens, "M": tokens, "tiles": len(files),
                        "layers": len({t.meta["layer"] for t in tiles}), "device": str(lm.device),
                        "model_tensors_digest": digest_set(checkpoint["tensors_sha256"]),
                        "checkpoint_verified_against_manifest": checkpoint["verified"]}))
        say(f"wrote {len(files)} tiles and the manifest")
    return CaptureResult(Path(out), tuple(files), tokens)


@dataclass(frozen=True)
class Overhead:
    """Capture overhead, medians over `repeats` interleaved timed runs after one warm-up each.

    plain_s / capture_s / capture_tiles_s: wall seconds of a forward without capture, with the
    recorder active, and with the recorder plus building CPU tiles; ratio / ratio_with_tiles:
    those over plain_s. cpu_*: the same in process CPU seconds (all threads), which a machine
    shared with other jobs distorts less than wall time; tokens: M of the forward.
    """

    plain_s: float
    capture_s: float
    capture_tiles_s: float
    ratio: float
    ratio_with_tiles: float
    cpu_plain_s: float
    cpu_capture_s: float
    cpu_ratio: float
    repeats: int
    tokens: int


def capture_overhead(lm: LoadedModel, input_ids: torch.Tensor, repeats: int = 5) -> Overhead:
    """Time forwards of `input_ids` [1,T] with and without capture (interleaved, medians)."""
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise InputError(f"--repeats must be a positive integer (timed runs of each variant), got {repeats!r}")

    def sync() -> None:
        if lm.device.type == "cuda":
            torch.cuda.synchronize()

    def plain() -> None:
        lm.logits(input_ids)

    def captured(with_tiles: bool) -> None:
        with OperandRecorder(lm) as rec:
            lm.logits(input_ids)
        if with_tiles:
            rec.tiles()

    fns = {"plain": plain, "capture": lambda: captured(False), "tiles": lambda: captured(True)}
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeats):
        for key, fn in fns.items():
            sync()
            t, c = time.perf_counter(), time.process_time()
            fn()
            sync()
            wall[key].append(time.perf_counter() - t)
            cpu[key].append(time.process_time() - c)
    w = {k: statistics.median(v) for k, v in wall.items()}
    c = {k: statistics.median(v) for k, v in cpu.items()}
    return Overhead(w["plain"], w["capture"], w["tiles"], w["capture"] / w["plain"], w["tiles"] / w["plain"],
                    c["plain"], c["capture"], c["capture"] / c["plain"], repeats, int(input_ids.shape[-1]))
