"""TorchAO's W8A8 linear: `torchao-int8` (its production path) and `torchao-int-scaled-mm` (its Triton kernel).

These run TorchAO's own code, not a re-implementation: the linear of an `Int8Tensor` weight as
`Int8DynamicActivationInt8WeightConfig` (version 2, per-row) creates it, entered through
`torch.nn.functional.linear` exactly as a quantized `nn.Linear` enters it. What that code does
(torchao 0.18.0, `quantization/quantize_/workflows/int8/int8_tensor.py` and `kernel/intmm.py`):

    acc = _int_mm(x_q, w_qᵀ)                       int32 (CPU: torch._int_mm; CUDA: cuBLASLt, or Triton)
    t   = out(RN32(float(acc) · s_x))              int_scaled_matmul(...).to(output_dtype)
    y   = RN32(float(t) · s_w)                     y_dot_scaled * w_scales (bf16·fp32 promotes to fp32)
    y   = RN32(y + float(bias))                    y += bias, in fp32
    out = out(y)                                   y.to(output_dtype)

i.e. `a_then_w+add_before_cast+round_between` (alibi.exact.emulator.TORCHAO_INT8): an intermediate rounding
to the output dtype between the two scales, which neither vLLM kernel has.

Handing TorchAO exactly alibi's operands (the adapter). TorchAO's linear quantizes a high-precision
activation itself. With `act_quant_scale` set (TorchAO's static-scale branch of the same linear; the
production dynamic branch differs only in computing that scale from the activation) it quantizes with
the given per-row scale: `q = clamp(round(x · (1/s_a)))`. The adapter gives it `s_a` as that scale and
`x = out(a_q · s_a)`, which maps back to `a_q`: `|a_q| ≤ 128` and the output cast's relative error is at
most 2⁻⁹ (bf16) or 2⁻¹¹ (fp16) for normal values, so `x/s_a` stays within 0.25 of `a_q` and rounds to it.
Where that fails (a product that is subnormal or overflows in the output dtype) the adapter refuses
the tile (InputError naming the first element) instead of handing TorchAO other operands: it runs
TorchAO's own `Int8Tensor.from_hp` on `x` first and compares the int8 values bit for bit. The
weights enter as an `Int8Tensor` holding `w_q` and `s_w` ([N,1] fp32), block size [1,K], per row.
tests/kernels/test_torchao.py intercepts `int_scaled_matmul` and checks that it receives exactly
`a_q`, `w_qᵀ` and `s_a`.

`torchao-int-scaled-mm` is the same linear with TorchAO's Triton `int_scaled_matmul`
(`TORCHAO_AUTOTUNER_ENABLE=1`'s path, `torch.ops.torchao.int_scaled_matmul`: `acc * s_x` stored as
fp32), CUDA only; alibi sets `torchao.kernel.intmm.AUTOTUNER_ENABLE` for the duration of the call
only, so both kernels can run in one process. TorchAO's autotuner compiles and times every one of its 960
configurations (BLOCK_M/N/K in 32…256, 15 stage/warp pairs) for each new shape before the first call returns:
on the H200 `alibi identify torchao-int-scaled-mm` ran past 240 s on its first probe shape (2026-12-06). No
configuration changes a bit of the result (the int32 accumulator is exact; the epilogue `acc * s_x` is per
element), so for the duration of the call alibi offers the autotuner one configuration, `TRITON_CONFIG`
(PyTorch's baseline int8 tile), and records it in the evidence (`last_run.triton_config`). The autotuner
still saves its choice to `TORCHAO_AUTOTUNER_DATA_PATH` (default `./data.pkl`).

TorchAO's compiled extensions are not used by these paths: alibi sets
`TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1` (unless already set) before importing torchao, as they load only
on torch ≥ 2.11. The evidence names torchao's version and the sha256 of each source file that runs.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from alibi.errors import InputError, KernelUnavailable
from alibi.exact.emulator import TORCHAO_INT8
from alibi.io.digests import sha256_file, sha256_listing
from alibi.kernels.base import Kernel

PINNED_VERSION = "0.18.0"
INSTALL = f"pip install 'integer-alibi[torchao]' (torchao=={PINNED_VERSION})"
SKIP_SO_ENV = "TORCHAO_FORCE_SKIP_LOADING_SO_FILES"
# The modules whose code computes the linear; their files' digests go into the evidence.
# The one configuration torchao-int-scaled-mm offers TorchAO's autotuner (module docstring): PyTorch's
# baseline int8 GEMM tile.
TRITON_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 2, "num_warps": 4}
SOURCE_MODULES = ("torchao.quantization.quantize_.workflows.int8.int8_tensor", "torchao.kernel.intmm",
                  "torchao.quantization.quant_primitives", "torchao.kernel.intmm_triton")


def torchao_version() -> str | None:
    try:
        return importlib.metadata.version("torchao")
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_version() -> str:
    """torchao's version; KernelUnavailable when torchao is not installed."""
    version = torchao_version()
    if version is None:
        raise KernelUnavailable(f"torchao is not installed; {INSTALL}")
    return version


_MODULES: dict[str, Any] = {}


def _import() -> dict[str, Any]:
    """TorchAO's pieces this adapter uses (imported once; KernelUnavailable when torchao is missing)."""
    if _MODULES:
        return _MODULES
    installed_version()
    os.environ.setdefault(SKIP_SO_ENV, "1")
    try:
        int8_tensor = importlib.import_module(SOURCE_MODULES[0])
        intmm = importlib.import_module(SOURCE_MODULES[1])
        granularity = importlib.import_module("torchao.quantization.granularity")
    except Exception as exc:  # noqa: BLE001 - foreign code: any import failure is a refusal
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise KernelUnavailable(f"importing torchao failed: {type(exc).__name__}: {first}; {INSTALL}") from None
    _MODULES.update(int8_tensor=int8_tensor, intmm=intmm, PerRow=granularity.PerRow)
    return _MODULES


def source_digests() -> dict[str, str]:
    """sha256 of each TorchAO source file that computes the linear, as imported in this process."""
    out = {}
    for name in SOURCE_MODULES:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            out[name] = sha256_file(Path(module.__file__))
    return out


def activation_for(a_q: torch.Tensor, s_a: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """The high-precision activation `out(a_q · s_a)` TorchAO is given (see the module docstring)."""
    return (a_q.to(torch.float32) * s_a.reshape(-1, 1).to(torch.float32)).to(out_dtype)


class TorchaoInt8Kernel(Kernel):
    """`torchao-int8`: TorchAO's W8A8 linear (Int8Tensor, per row) as its production path runs it."""

    name = "torchao-int8"
    formats = ("int8",)
    epilogue = TORCHAO_INT8
    description = ("TorchAO 0.18 W8A8 linear (Int8DynamicActivationInt8WeightConfig v2, per row): int_scaled_matmul, "
                   "cast to the output dtype, · s_w and + bias in fp32, cast again")
    triton = False  # torchao-int-scaled-mm: TorchAO's Triton int_scaled_matmul instead of _int_mm

    def __init__(self) -> None:
        # TorchAO's production path runs where the tensors are: the GPU when there is one, else the CPU.
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.last_run: dict[str, Any] = {}

    def available(self) -> tuple[bool, str]:
        version = torchao_version()
        if version is None:
            return False, f"torchao is not installed; {INSTALL}"
        try:
            _import()
        except KernelUnavailable as exc:
            return False, str(exc)
        if self.triton:
            if not torch.cuda.is_available():
                return False, "TorchAO's Triton int_scaled_matmul is registered for CUDA only; no CUDA GPU here"
            if _MODULES["intmm"].intmm_triton is None:
                return False, "torchao.kernel.intmm_triton did not import (no triton); pip install 'triton>=3.3'"
        where = (f"CUDA ({torch.cuda.get_device_name()})" if self.device == "cuda"
                 else "the CPU (torch._int_mm)")
        note = "" if version == PINNED_VERSION else f"; the declared epilogue was read from {PINNED_VERSION}"
        return True, f"torchao {version} W8A8 linear on {where}{note}"

    def _check(self, a_q, s_a, w_q, s_w, bias, out_dtype) -> None:
        if a_q.dtype != torch.int8 or w_q.dtype != torch.int8:
            raise InputError(f"kernel {self.name!r} takes int8 operands, got {a_q.dtype} and {w_q.dtype}")
        if out_dtype not in (torch.bfloat16, torch.float16):
            raise InputError(f"kernel {self.name!r}: out_dtype must be bfloat16 or float16, got {out_dtype}")
        M, N = a_q.shape[0], w_q.shape[0]
        if s_a.numel() != M or s_w.numel() != N:
            raise InputError(f"kernel {self.name!r} runs per-row scales: s_a of {M} and s_w of {N} elements, "
                             f"got {s_a.numel()} and {s_w.numel()}")
        if bias is not None and tuple(bias.shape) != (N,):
            raise InputError(f"kernel {self.name!r}: bias must have shape [{N}], got {list(bias.shape)}")

    def quantized_operands(self, a_q, s_a, w_q, s_w, out_dtype):
        """(activation, Int8Tensor weight) TorchAO's linear receives; InputError when TorchAO's own quantization
        of the activation would not give back `a_q` bit for bit."""
        mods = _import()
        Int8Tensor = mods["int8_tensor"].Int8Tensor
        Kwargs = mods["int8_tensor"].QuantizeTensorToInt8Kwargs
        M, K = a_q.shape
        N = w_q.shape[0]
        act_scale = s_a.reshape(M, 1).to(torch.float32).contiguous()
        x = activation_for(a_q, act_scale, out_dtype)
        requantized = Int8Tensor.from_hp(x, mods["PerRow"](), scale=act_scale).qdata
        bad = (requantized.view(torch.uint8) != a_q.view(torch.uint8)).nonzero()
        if bad.numel():
            r, c = (int(v) for v in bad[0])
            raise InputError(
                f"kernel {self.name!r} cannot be handed these operands exactly: TorchAO requantizes its activation "
                f"out(a_q·s_a) and gets {int(requantized[r, c])} instead of a_q[{r},{c}] = {int(a_q[r, c])} "
                f"(s_a[{r}] = {float(s_a.reshape(-1)[r])!r}; {bad.shape[0]} element(s)): a_q·s_a is subnormal or "
                f"overflows in {str(out_dtype).removeprefix('torch.')}; use tiles whose scaled activations are normal")
        weight = Int8Tensor(w_q.contiguous(), s_w.reshape(N, 1).to(torch.float32).contiguous(), [1, K], out_dtype,
                            act_quant_scale=act_scale, act_quant_kwargs=Kwargs(granularity=mods["PerRow"]()))
        return x, weight

    @contextmanager
    def _matmul_path(self):
        intmm = _MODULES["intmm"]
        triton_module = intmm.intmm_triton
        before = intmm.AUTOTUNER_ENABLE, getattr(triton_module, "int8_mm_kernel_configs", None)
        intmm.AUTOTUNER_ENABLE = self.triton
        if self.triton:
            import triton  # CUDA only, and only here: the Triton path is the one that needs it

            options = dict(TRITON_CONFIG)
            stages, warps = options.pop("num_stages"), options.pop("num_warps")
            triton_module.int8_mm_kernel_configs = [triton.Config(options, num_stages=stages, num_warps=warps)]
        try:
            yield
        finally:
            intmm.AUTOTUNER_ENABLE = before[0]
            if self.triton:
                triton_module.int8_mm_kernel_configs = before[1]

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        self._check(a_q, s_a, w_q, s_w, bias, out_dtype)
        x, weight = self.quantized_operands(a_q, s_a, w_q, s_w, out_dtype)
        K, N = a_q.shape[1], w_q.shape[0]
        with self._matmul_path():
            out = torch.nn.functional.linear(x, weight, bias)
        if self.device == "cuda":
            bad_dims = not (K % 8 == 0 and N % 8 == 0)
            path = ("TorchAO Triton int_scaled_matmul" if self.triton else
                    "torch.matmul on the CPU (TorchAO's fallback: K or N not a multiple of 8)" if bad_dims else
                    "safe_int_mm: out_dtype(aten.mm, int32), fp32 matmul if that raises")
        else:
            # deferred: keeps torchao out of start-up
            from torchao.utils import _cpu_is_amx_tile_supported, _cpu_is_vnni_supported

            u8s8 = (not _cpu_is_amx_tile_supported()) and _cpu_is_vnni_supported()
            path = "torch._int_mm u8s8 (a+128, VNNI)" if u8s8 else "torch._int_mm s8s8"
        self.last_run = {"M": int(a_q.shape[0]), "matmul": path,
                         **({"triton_config": dict(TRITON_CONFIG)} if self.triton else {}),
                         "bias_dtype": None if bias is None else str(bias.dtype).removeprefix("torch.")}
        return out

    def evidence(self) -> dict[str, Any]:
        ev = super().evidence()
        ev["torchao"] = {"version": torchao_version(), "pinned": PINNED_VERSION,
                         "skip_so_files": os.environ.get(SKIP_SO_ENV), "sources_sha256": source_digests()}
        ev["build_digest"] = {"sha256": self.build_digest()}
        ev["last_run"] = dict(self.last_run)
        return ev

    def build_digest(self) -> str:
        """The installed TorchAO sources this kernel calls into (`source_digests`), else the kernel's own
        sources (`Kernel.build_digest`) where none was found."""
        return _combined(source_digests()) or super().build_digest()


def _combined(digests: dict[str, str]) -> str | None:
    return sha256_listing(sorted(digests.items())) if digests else None


class TorchaoIntScaledMmKernel(TorchaoInt8Kernel):
    """`torchao-int-scaled-mm`: the same linear with TorchAO's Triton `int_scaled_matmul` (CUDA only)."""

    name = "torchao-int-scaled-mm"
    triton = True
    description = ("TorchAO 0.18 W8A8 linear with its Triton int_scaled_matmul (TORCHAO_AUTOTUNER_ENABLE path): "
                   "acc·s_x in fp32, cast, · s_w and + bias in fp32, cast again")

    def __init__(self) -> None:
        super().__init__()
        self.device = "cuda"


__all__ = ["PINNED_VERSION", "TRITON_CONFIG", "TorchaoInt8Kernel", "TorchaoIntScaledMmKernel", "activation_for", "source_digests"]
