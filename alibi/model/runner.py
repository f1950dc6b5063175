"""A transformers model whose quantized Linears run through a chosen alibi kernel.

`load_model(folder, kernel=...)` builds the architecture named in `config.json` with transformers
(Llama, Qwen3, any `AutoModelForCausalLM` type) in bf16 and loads the checkpoint into it. For a
compressed-tensors W8A8 checkpoint every quantized Linear becomes a `W8A8Linear`, whose forward is
exactly what vLLM does for this scheme:

    a_q, s_a = quantize_per_token(x)              # dynamic symmetric per-token int8 (alibi.exact.quant)
    y = kernel.scaled_mm(a_q, s_a, w_q, s_w, bias, out_dtype=bf16)

so the kernel is the only thing two arms differ in. A block-scaled fp8 checkpoint (DeepSeek-V3 / Qwen3-FP8
layout, `alibi.model.fp8_block_checkpoint`) gets a `BlockFp8Linear` instead, the same with vLLM's block recipe:

    a_q, s_a = quantize_fp8_groups(x, 128)        # dynamic e4m3 per 1×128 group (alibi.exact.fp8_block)
    y = kernel.scaled_mm(a_q, s_a, w_q, weight_scale_inv, bias, out_dtype=bf16)   # a block kernel

A K that is not a multiple of 128 (SmolLM2's 576) is handed to the kernel as it is, with ceil(K/128) scale
groups; a kernel that needs whole blocks pads A and W with zero bytes, which changes no bit of its result
(docs/fp8-block.md). A dense checkpoint loads unchanged (no kernel).
Everything else runs batch-invariant and deterministic unless asked otherwise
(`alibi.model.execution`): the same token at the same position gets the same bits whatever the
batch, the chunking of the prompt, or the use of the KV cache.
Observers attached to a `W8A8Linear` (see `alibi.model.capture`) see the operands the kernel
receives, before it runs, and cannot change them.

Needs transformers (the `model` extra). Runs on the CPU or CUDA: the model is placed on the
kernel's device unless another is given.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from alibi.errors import InputError
from alibi.exact.fp8_block import DEEPSEEK_V3, BlockLayout, quantize_fp8_groups
from alibi.exact.quant import quantize_per_token
from alibi.kernels.base import Kernel
from alibi.kernels.registry import get_kernel
from alibi.model.checkpoint import read_config, read_tensors
from alibi.model.compressed_tensors import parse_w8a8
from alibi.model.decode_graphs import GraphDecoder, greedy_loop
from alibi.model.execution import ExecutionMode, apply_execution_mode
from alibi.model.fp8_block_checkpoint import is_block_fp8_config, parse_block_fp8
from alibi.tiles.tile import BLOCK_FORMAT

Observer = Callable[["W8A8Linear", torch.Tensor, torch.Tensor], None]
MODEL_DTYPE = torch.bfloat16


class W8A8Linear(torch.nn.Module):
    """A Linear with int8 weights [N,K] and fp32 per-channel scales [N] that calls `kernel.scaled_mm`.

    Inputs are quantized per token (vLLM's dynamic symmetric convention) in the order the rows
    appear after flattening the leading dimensions, so a `[1, T, K]` prefill is one GEMM of M = T.
    """

    def __init__(self, name: str, w_q: torch.Tensor, s_w: torch.Tensor, bias: torch.Tensor | None, kernel: Kernel):
        super().__init__()
        self.name = name
        self.kernel = kernel
        self.register_buffer("w_q", w_q, persistent=False)
        self.register_buffer("s_w", s_w.to(torch.float32), persistent=False)
        self.register_buffer("bias", bias, persistent=False)
        self.observers: list[Observer] = []

    @property
    def in_features(self) -> int:
        return self.w_q.shape[1]

    @property
    def out_features(self) -> int:
        return self.w_q.shape[0]

    def quantize_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The activation operands the kernel takes for the rows of `x` [M, K]: int8 per token, scales [M]."""
        return quantize_per_token(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        a_q, s_a = self.quantize_input(x.reshape(-1, self.in_features))
        for observe in self.observers:
            observe(self, a_q, s_a)
        out_dtype = x.dtype if x.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        y = self.kernel.scaled_mm(a_q, s_a, self.w_q, self.s_w, self.bias, out_dtype)
        return y.to(x.dtype).reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel.name}"


class BlockFp8Linear(W8A8Linear):
    """A Linear with e4m3 weights [N,K] and fp32 block scales [ceil(N/bn), ceil(K/bk)] (`weight_scale_inv`) that
    calls a block-scaled `kernel.scaled_mm`. A W8A8Linear in every other respect (the kernel call, the observers):
    only the operands differ. Inputs are quantized per 1 × bk group of each row (vLLM's
    `per_token_group_quant_fp8`), after flattening the leading dimensions as W8A8Linear does."""

    def __init__(self, name: str, w_q: torch.Tensor, s_w: torch.Tensor, bias: torch.Tensor | None, kernel: Kernel,
                 layout: BlockLayout = DEEPSEEK_V3):
        super().__init__(name, w_q, s_w, bias, kernel)
        self.layout = layout

    def quantize_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """e4m3 per 1 × block_k group of each row, scales [M, ceil(K/block_k)]."""
        return quantize_fp8_groups(x, self.layout.block_k)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scale_layout={self.layout.text}"


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to run: the transformers `model`, the `kernel` its quantized Linears call
    (None for a dense checkpoint), the checkpoint `folder`, its `device`, the `execution` mode
    it runs in, and the `decoder` that replays greedy decode steps as CUDA graphs (None: eager)."""

    model: torch.nn.Module
    kernel: Kernel | None
    folder: Path
    device: torch.device
    execution: ExecutionMode
    decoder: GraphDecoder | None = None

    @property
    def quantized(self) -> bool:
        return self.kernel is not None

    def linears(self) -> Iterator[W8A8Linear]:
        """The quantized Linears (W8A8, or their block-scaled subclass), in module order."""
        return (m for m in self.model.modules() if isinstance(m, W8A8Linear))

    @torch.inference_mode()
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [B,T,V] (float32) for token ids [B,T] — one prefill, no cache."""
        out = self.model(input_ids=input_ids.to(self.device), use_cache=False)
        return out.logits.float()

    def greedy(self, input_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """Greedy continuation of one prompt [T] → the `new_tokens` chosen ids: `greedy_batch` of a batch of one
        (decode GEMMs have M = 1)."""
        return self.greedy_batch(input_ids.reshape(1, -1), new_tokens)[0]

    @torch.inference_mode()
    def greedy_batch(self, input_ids: torch.Tensor, new_tokens: int,
                     logit_digests: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Greedy continuations of B prompts of one length [B,T] → the chosen ids [B, new_tokens].

        The prompts are equally long, so they batch without padding or attention mask: row b of
        every GEMM is prompt b, and batching changes only M (B·T at prefill, B at each decode
        step). Each row's next token is the argmax of its own fp32 logits, as in `greedy`.
        logit_digests: when a list, each step appends the digest (`alibi.model.trace.row_digests`)
        of every row's fp32 logits [B], so two runs can be compared bit for bit at every step.
        """
        if new_tokens < 1:
            raise ValueError(f"new_tokens must be positive, got {new_tokens}")
        if input_ids.dim() != 2:
            raise ValueError(f"greedy_batch takes [B,T] token ids, got shape {list(input_ids.shape)}")
        if self.decoder is not None:
            return self.decoder.greedy(input_ids, new_tokens, logit_digests)
        out = self.model(input_ids=input_ids.to(self.device), use_cache=True)
        cache = out.past_key_values  # transformers' dynamic cache, grown in place by every step

        def step(nxt: torch.Tensor, _position: int) -> torch.Tensor:
            return self.model(input_ids=nxt, past_key_values=cache, use_cache=True).logits[:, -1].float()

        return greedy_loop(out.logits[:, -1].float(), input_ids.shape[1], new_tokens, step, logit_digests)

    @torch.inference_mode()
    def chunked_logits(self, input_ids: torch.Tensor, chunks: list[int] | tuple[int, ...]) -> torch.Tensor:
        """Logits [B,T,V] (float32) of token ids [B,T] fed in consecutive chunks of the given sizes
        (summing to T), each a forward against the KV cache the earlier chunks filled: `[T]` is one
        prefill, `[T0, 1, 1, …]` a prefill then decode steps, `[C, C, …]` a chunked prefill. Row t
        is the output at token t, as in row t of `logits`."""
        ids = input_ids.to(self.device)
        if sum(chunks) != ids.shape[1] or any(c < 1 for c in chunks):
            raise ValueError(f"chunks {list(chunks)} do not split {ids.shape[1]} tokens")
        rows, cache, start = [], None, 0
        for size in chunks:
            out = self.model(input_ids=ids[:, start:start + size], past_key_values=cache, use_cache=True)
            cache, start = out.past_key_values, start + size
            rows.append(out.logits.float())
        return torch.cat(rows, dim=1)

    def incremental_logits(self, input_ids: torch.Tensor, prefill_tokens: int) -> torch.Tensor:
        """Logits [T,V] (float32) of one window [T] computed the way decoding computes them: one
        prefill of the first `prefill_tokens` tokens (with the KV cache), then one forward per
        remaining token, each of M = 1 against the cache. Row t is the output at token t, as in
        row t of `logits` (which computes all T rows in one prefill without a cache)."""
        ids = input_ids.reshape(1, -1)
        if not 1 <= prefill_tokens <= ids.shape[1]:
            raise ValueError(f"prefill_tokens must be in 1..{ids.shape[1]}, got {prefill_tokens}")
        return self.chunked_logits(ids, [prefill_tokens] + [1] * (ids.shape[1] - prefill_tokens))[0]


def _require_transformers():
    try:
        # deferred: keeps transformers out of start-up
        import transformers
    except ImportError as exc:
        raise InputError("running a model needs transformers; install the model extra: "
                         "`pip install 'integer-alibi[model]'`") from exc
    return transformers


def _build(config: dict, device: torch.device) -> torch.nn.Module:
    transformers = _require_transformers()
    hf_config = copy.deepcopy(config)
    hf_config.pop("quantization_config", None)
    model_type = hf_config.get("model_type")
    try:
        cfg = transformers.AutoConfig.for_model(**hf_config)
    except (ValueError, KeyError) as exc:
        raise InputError(f"config.json: model_type {model_type!r} is not known to transformers "
                         f"{transformers.__version__} ({exc})") from exc
    with torch.device(device):
        try:
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=MODEL_DTYPE, attn_implementation="sdpa")
        except TypeError:  # transformers 4.x spells it torch_dtype
            model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=MODEL_DTYPE,
                                                                  attn_implementation="sdpa")
    return model.eval()


Operands = tuple[torch.Tensor, torch.Tensor, "torch.Tensor | None"]  # a quantized Linear's weight, scale, bias


def _swap_linears(model: torch.nn.Module, linears: Mapping[str, Operands], make: Callable[..., W8A8Linear],
                  device: torch.device) -> None:
    """Replace each Linear named in `linears` by `make(name, weight, scale, bias)` on `device`."""
    modules = dict(model.named_modules())
    for name, (weight, scale, bias) in linears.items():
        old = modules.get(name)
        if not isinstance(old, torch.nn.Linear):
            raise InputError(f"checkpoint module {name!r} is not a Linear of the {type(model).__name__} "
                             "built from config.json; the checkpoint and its config disagree")
        if (old.out_features, old.in_features) != tuple(weight.shape):
            raise InputError(f"{name}: weight is {list(weight.shape)} but the model expects "
                             f"[{old.out_features}, {old.in_features}]")
        parent_name, _, child = name.rpartition(".")
        bias = None if bias is None else bias.to(device=device, dtype=MODEL_DTYPE)
        new = make(name, weight.to(device), scale.to(device), bias)
        setattr(modules[parent_name] if parent_name else model, child, new)


def _load_dense(model: torch.nn.Module, tensors: dict[str, torch.Tensor], folder: Path) -> None:
    expected = model.state_dict()
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise InputError(f"{folder}: tensor {unexpected[0]!r} (and {len(unexpected) - 1} more) has no place in "
                         f"{type(model).__name__}; the checkpoint does not match its config.json")
    with torch.no_grad():
        for key, value in tensors.items():
            target = expected[key]
            if tuple(target.shape) != tuple(value.shape):
                raise InputError(f"{folder}: tensor {key!r} is {list(value.shape)}, the model expects {list(target.shape)}")
            target.copy_(value.to(target.dtype))
    missing = set(expected) - set(tensors)
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
        missing -= {k for k in missing if k.startswith("lm_head.")}
    if missing:
        raise InputError(f"{folder}: tensor(s) {', '.join(sorted(missing)[:3])} missing from the checkpoint")


def resolve_kernel(kernel: str | Kernel, operands: str = "int8") -> Kernel:
    """A kernel object from a registry name, checked to be available (KernelUnavailable otherwise) and to take
    `operands` (`int8` for a W8A8 checkpoint, `fp8_e4m3_block` for a block-scaled one)."""
    k = get_kernel(kernel) if isinstance(kernel, str) else kernel
    k.require_available()
    if operands not in k.formats:
        if operands == "int8":
            raise InputError(f"kernel {k.name!r} does not take int8 operands; W8A8 checkpoints need an int8 kernel")
        raise InputError(f"kernel {k.name!r} does not take block-scaled fp8 operands; a block-scaled checkpoint "
                         "needs a block kernel, e.g. emulator-fp8-block:block128:fma(sa*sw,p,acc):add_before_cast")
    return k


def model_device(kernel: Kernel | None, device: str | None) -> torch.device:
    """The device a model runs on: `device` if given, else the kernel's (CPU for a dense model)."""
    return torch.device(device) if device else (kernel.torch_device() if kernel else torch.device("cpu"))


def load_model(folder: str | Path, kernel: str | Kernel | None = None, device: str | None = None,
               deterministic: bool = True, cuda_graphs: bool | None = False) -> LoadedModel:
    """Load the checkpoint in `folder` (dense, compressed-tensors W8A8, or block-scaled fp8, the last two with
    `kernel`) into transformers.

    kernel: registry name or Kernel; required for a quantized checkpoint (an int8 kernel for W8A8, a block kernel
    for block-scaled fp8) and refused for a dense one.
    device: default the kernel's device (CPU for a dense model).
    deterministic: the batch-invariant, deterministic runner (default); False keeps the libraries'
    own attention, norms and flags (`alibi.model.execution`).
    cuda_graphs: greedy decoding replays CUDA graphs (`alibi.model.decode_graphs`; CUDA only); a kernel that
    cannot be captured decodes eagerly, and the execution mode names it (`graphs_refused`). None: graphs when the
    model runs on a CUDA device, eager decoding elsewhere.
    """
    folder = Path(folder)
    config = read_config(folder)
    tensors = read_tensors(folder)
    quantized = "quantization_config" in config
    block = is_block_fp8_config(config)
    what = "block-scaled fp8" if block else "W8A8"
    if quantized and kernel is None:
        raise InputError(f"{folder}: is a {what} checkpoint; choose the kernel its Linears run with (--kernel NAME)")
    if not quantized and kernel is not None:
        raise InputError(f"{folder}: is a dense checkpoint; it has no quantized Linears for kernel "
                         f"{kernel if isinstance(kernel, str) else kernel.name!r} to run (drop --kernel)")
    k = resolve_kernel(kernel, BLOCK_FORMAT if block else "int8") if quantized else None
    dev = model_device(k, device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda requested but torch sees no CUDA device here")
    if cuda_graphs is None:
        cuda_graphs = dev.type == "cuda"
    elif cuda_graphs and dev.type != "cuda":
        raise InputError(f"--decode cuda-graphs: the model runs on {dev}; CUDA graphs need a CUDA device (--device "
                         "cuda, or a CUDA kernel), or decode eagerly (--decode eager, or auto)")
    if block:  # parsed before the model is built: a layout the kernel does not take is refused first
        blocks = parse_block_fp8(config, tensors, str(folder))
        layout = blocks.scheme.layout
        kernel_layout = getattr(k, "layout", None)
        if kernel_layout is None:
            raise InputError(f"kernel {k.name!r} takes block-scaled operands but states no scale layout (its `layout`, "
                             f"e.g. alibi.exact.fp8_block.DEEPSEEK_V3); the checkpoint's is {layout.text}")
        if kernel_layout != layout:
            raise InputError(f"{folder}: its scales are {layout.text}, but kernel {k.name!r} takes "
                             f"{kernel_layout.text}; choose a kernel of the checkpoint's layout")
    model = _build(config, dev)
    if block:
        _swap_linears(model, {n: (q.weight, q.scale_inv, q.bias) for n, q in blocks.linears.items()},
                      lambda *a: BlockFp8Linear(*a, k, layout), dev)
        tensors = dict(blocks.dense)
    elif quantized:
        ckpt = parse_w8a8(config, tensors, str(folder))
        _swap_linears(model, {n: (q.weight, q.scale, q.bias) for n, q in ckpt.linears.items()},
                      lambda *a: W8A8Linear(*a, k), dev)
        tensors = dict(ckpt.dense)
    _load_dense(model, tensors, folder)
    mode = apply_execution_mode(model, deterministic)
    decoder = None
    if cuda_graphs:
        decoder = GraphDecoder(model, dev)
        refused = decoder.probe()
        if refused is None:
            mode = dataclasses.replace(mode, decode="cuda-graphs")
        else:
            decoder = None
            what = f"kernel {k.name}" if k is not None else "the dense model"
            mode = dataclasses.replace(mode, graphs_refused=f"{what} cannot be captured in a CUDA graph ({refused}); "
                                                            "decoding eagerly")
    return LoadedModel(model=model, kernel=k, folder=folder, device=dev, execution=mode, decoder=decoder)
