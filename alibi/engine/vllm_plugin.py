"""The vLLM plugin: records the operands vLLM's int8 kernel receives, and can swap that kernel for an alibi one.

vLLM loads every entry point of the group `vllm.general_plugins` in each of its processes (engine
core, workers, API server; `vllm/plugins/__init__.py`); this package registers `register` there. It
is inert unless one of two environment variables is set:

- `ALIBI_CAPTURE_DIR=DIR`: every W8A8 Linear call writes one alibi tile into `DIR/raw-<pid>/`
  (`<sequence>_<layer>-<call>.safetensors`, the layer name as vLLM prefixes it, the call index per
  layer from 0), a line per call in `calls.jsonl`, and `engine.json` (vLLM's version, the kernel
  class vLLM selected and, per layer, the op it chose). `alibi.engine.vllm_runs.finalize_server_capture`
  turns that into a manifest-pinned capture folder.
- `ALIBI_KERNEL=K`: every W8A8 Linear runs alibi kernel `K` instead of vLLM's GEMM; everything else in
  the engine (the activation quantization included) stays vLLM's.

What it touches inside vLLM: two methods of the compressed-tensors scheme `CompressedTensorsW8A8Int8`
(`process_weights_after_loading`, to keep a copy of the int8 weights and fp32 scales before the kernel
repacks them, and `apply_weights`, the call into the kernel), the module attributes
`vllm._custom_ops.onednn_scaled_int8_quant` and `vllm._custom_ops.scaled_int8_quant` (wrapped to
observe their outputs during a W8A8 call: they are what the kernel's GEMM receives), and
`GPUModelRunner._dummy_run` (wrapped to mark vLLM's profiling and warm-up forwards, which are not
recorded, only counted). The same names exist in vLLM 0.26.0 (CUDA) and 0.32.0 (CPU).

The operands recorded are the kernel's own: `a_q`, `s_a` are the outputs of the quantization op the
kernel called on this call's activations (oneDNN path on the CPU, `scaled_int8_quant` on CUDA); the
weights and their scales are the checkpoint's as vLLM loaded them (`w_q` [N,K] int8, `s_w` [N] fp32,
fused layers such as `qkv_proj` and `gate_up_proj` concatenated as vLLM concatenates them); `bias`
as vLLM passes it; the output dtype is the activations' dtype. Where the kernel quantizes inside a
fused op (SGLang's `int8_scaled_mm_with_quant`, chosen on CPUs with AMX) no quantization op is
called; the plugin then quantizes the activations with the engine's own per-token op
(`ops.onednn_scaled_int8_quant`) and the tile's `quantized_by` says so.
"""

from __future__ import annotations

import contextvars
import json
import os
import threading
from pathlib import Path
from typing import Any

ENV_CAPTURE = "ALIBI_CAPTURE_DIR"
ENV_KERNEL = "ALIBI_KERNEL"
ENV_MAX_CALLS = "ALIBI_CAPTURE_MAX_CALLS"  # record at most this many calls per layer (e.g. 1: the first forward)
CALLS_FILE, ENGINE_FILE = "calls.jsonl", "engine.json"

_in_dummy_run = contextvars.ContextVar("alibi_in_dummy_run", default=False)
_observed = contextvars.ContextVar("alibi_observed_quant", default=None)


def register() -> None:
    """vLLM's plugin hook: patch the W8A8 path when capture or a kernel swap is asked for, else do nothing."""
    if os.environ.get(ENV_CAPTURE) or os.environ.get(ENV_KERNEL):
        install()


class _State:
    """This process's plugin state: the kept weights per layer, the call counters and the capture folder."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.weights: dict[int, dict[str, Any]] = {}  # id(layer) -> name, w_q, s_w, kernel class, method
        self.calls: dict[str, int] = {}
        self.dummy_calls = 0
        self.started = False
        self.sequence = 0
        self.kernel = None
        self.kernel_name = os.environ.get(ENV_KERNEL) or None
        capture = os.environ.get(ENV_CAPTURE)
        self.folder = Path(capture) / f"raw-{os.getpid()}" if capture else None
        limit = os.environ.get(ENV_MAX_CALLS)
        self.max_calls = int(limit) if limit else None

    def alibi_kernel(self):
        if self.kernel is None and self.kernel_name:
            # deferred: keeps torch out of start-up
            from alibi.kernels.registry import get_kernel

            kernel = get_kernel(self.kernel_name)
            kernel.require_available()
            self.kernel = kernel
        return self.kernel


STATE: _State | None = None


def _vllm_version() -> str:
    # deferred: keeps vllm out of start-up
    import vllm

    return getattr(vllm, "__version__", "?")


def install() -> None:
    """Patch vLLM (idempotent). Raises ImportError where vLLM's W8A8 scheme cannot be found."""
    global STATE
    # deferred: keeps vllm out of start-up
    from vllm import _custom_ops as ops
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_w8a8_int8 import (
        CompressedTensorsW8A8Int8 as Scheme,
    )

    if getattr(Scheme, "_alibi_plugin", False):
        return
    STATE = _State()
    original_process, original_apply = Scheme.process_weights_after_loading, Scheme.apply_weights

    def process_weights_after_loading(self, layer) -> None:
        w_q = layer.weight.detach().clone()
        s_w = layer.weight_scale.detach().to("cpu").float().clone()
        original_process(self, layer)
        method = getattr(getattr(self.kernel, "linear_method", None), "__name__", None)
        name = getattr(layer, "prefix", "") or f"layer{len(STATE.weights)}"
        if s_w.numel() == 1:  # a per-tensor scale: one value for every row, as vLLM expands it
            s_w = s_w.reshape(1).expand(w_q.shape[0]).clone()
        STATE.weights[id(layer)] = {"name": name, "w_q": w_q, "s_w": s_w.reshape(-1),
                                    "kernel_class": type(self.kernel).__name__, "method": method}
        _write_engine_json()

    def apply_weights(self, layer, x, bias):
        return _apply(self, layer, x, bias, original_apply)

    for op_name in ("onednn_scaled_int8_quant", "scaled_int8_quant"):
        if hasattr(ops, op_name):
            setattr(ops, op_name, _observing(getattr(ops, op_name)))
    Scheme.process_weights_after_loading = process_weights_after_loading
    Scheme.apply_weights = apply_weights
    Scheme._alibi_plugin = True
    _mark_dummy_runs()


def _observing(op):
    """Wrap a quantization op so a W8A8 call sees its (x_q, x_s) outputs; outside one it is unchanged."""
    def wrapped(*args, **kwargs):
        result = op(*args, **kwargs)
        seen = _observed.get()
        if seen is not None:
            seen.append((result[0], result[1]))
        return result
    wrapped.__wrapped__ = op
    return wrapped


def _mark_dummy_runs() -> None:
    try:
        # deferred: keeps vllm out of start-up
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:
        return
    original = GPUModelRunner._dummy_run

    def _dummy_run(self, *args, **kwargs):
        token = _in_dummy_run.set(True)
        try:
            return original(self, *args, **kwargs)
        finally:
            _in_dummy_run.reset(token)
    GPUModelRunner._dummy_run = _dummy_run


def engine_quantize(x2d):
    """The engine's own per-token int8 quantization of `x2d` [M,K]: (a_q [M,K] int8, s_a [M] fp32)."""
    # deferred: keeps vllm out of start-up
    from vllm import _custom_ops as ops

    if x2d.device.type == "cpu":
        quant = getattr(ops.onednn_scaled_int8_quant, "__wrapped__", ops.onednn_scaled_int8_quant)
        a_q, s_a, _ = quant(x2d, None, None, True)
    else:
        quant = getattr(ops.scaled_int8_quant, "__wrapped__", ops.scaled_int8_quant)
        a_q, s_a, _ = quant(x2d, None, None, True)
    return a_q, s_a.reshape(-1).float()


def _apply(scheme, layer, x, bias, original_apply):
    state = STATE
    kept = state.weights.get(id(layer))
    x2d = x.reshape(-1, x.shape[-1])
    dummy = _in_dummy_run.get()
    if dummy:
        state.dummy_calls += 1
    kernel = state.alibi_kernel()
    if kernel is not None:
        a_q, s_a = engine_quantize(x2d)
        dev = kernel.torch_device()
        out = kernel.scaled_mm(a_q.to(dev), s_a.to(dev), kept["w_q"].to(dev), kept["s_w"].to(dev),
                               None if bias is None else bias.to(dev), x.dtype).to(x.device)
        quantized_by = "engine quantization op, then alibi kernel " + kernel.name
    else:
        seen: list = []
        token = _observed.set(seen)
        try:
            out = original_apply(scheme, layer, x, bias)
        finally:
            _observed.reset(token)
        if seen:
            a_q, s_a = seen[-1][0], seen[-1][1].reshape(-1).float()
            quantized_by = "the kernel's own quantization op (its outputs, as the GEMM received them)"
        else:
            a_q, s_a = engine_quantize(x2d)
            quantized_by = "the plugin, with the engine's per-token op (the kernel quantizes inside a fused op)"
    if state.folder is not None and not dummy:
        if not state.started:
            state.started = True
            _write_engine_json()  # the warm-up forwards are over: their count is final
        _record(state, kept, a_q, s_a, bias, x.dtype, quantized_by)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _record(state: _State, kept: dict, a_q, s_a, bias, out_dtype, quantized_by: str) -> None:
    # deferred: keeps torch out of start-up
    import torch

    # deferred: keeps torch out of start-up
    from alibi.model.capture import tile_file_name
    from alibi.tiles.tile import Tile, tile_bytes

    with state.lock:
        layer = kept["name"]
        call = state.calls.get(layer, 0)
        if state.max_calls is not None and call >= state.max_calls:
            return
        state.calls[layer] = call + 1
        index = state.sequence
        state.sequence += 1
    tile = Tile(name=f"{layer}#{call}", a_q=a_q.detach().cpu().contiguous(), s_a=s_a.detach().cpu().contiguous(),
                w_q=kept["w_q"].cpu(), s_w=kept["s_w"].cpu(),
                bias=None if bias is None else bias.detach().cpu().clone(), out_dtype=out_dtype,
                meta={"layer": layer, "call": str(call), "source": "vllm-capture", "quantized_by": quantized_by,
                      "vllm_kernel_class": kept["kernel_class"], "vllm_linear_method": str(kept["method"]),
                      "vllm_version": _vllm_version()})
    if tile.out_dtype not in (torch.bfloat16, torch.float16):
        tile = tile.replace(out_dtype=torch.bfloat16, meta={**tile.meta, "engine_out_dtype": str(out_dtype)})
    name = tile_file_name(index, tile)
    (state.folder / name).write_bytes(tile_bytes(tile))
    line = {"sequence": index, "file": name, "layer": layer, "call": call, "M": int(a_q.shape[0]),
            "quantized_by": quantized_by}
    with state.lock, open(state.folder / CALLS_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")


def _write_engine_json() -> None:
    state = STATE
    if state is None or state.folder is None or not state.weights:
        return  # a process without W8A8 layers (API server, engine core) writes nothing
    state.folder.mkdir(parents=True, exist_ok=True)
    layers = {w["name"]: {"kernel_class": w["kernel_class"], "linear_method": w["method"],
                          "N": int(w["w_q"].shape[0]), "K": int(w["w_q"].shape[1])} for w in state.weights.values()}
    doc = {"vllm_version": _vllm_version(), "pid": os.getpid(), "kernel_swap": state.kernel_name,
           "kernel_classes": sorted({w["kernel_class"] for w in state.weights.values()}), "layers": layers,
           "dummy_calls_not_recorded": state.dummy_calls}
    (state.folder / ENGINE_FILE).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def finish() -> None:
    """Rewrite engine.json with the final count of unrecorded warm-up calls (the offline driver calls it)."""
    _write_engine_json()
