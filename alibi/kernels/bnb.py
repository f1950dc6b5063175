"""`bnb-int8`: bitsandbytes' LLM.int8() matmul (`int8_linear_matmul` + `int8_mm_dequant`), as its linear runs it.

bitsandbytes 0.50.2's `Linear8bitLt` calls `torch.ops.bitsandbytes.int8_scaled_mm(CA, CB, SCA, SCB, bias,
dtype)`: the int32 accumulator of `CA·CBᵀ`, then `int8_mm_dequant(acc, row_stats, col_stats, dtype, bias)`.
alibi calls that op (bitsandbytes' own dispatch picks the backend). What each backend computes
(read from the wheel and bitsandbytes' `csrc/kernels.cu`):

* CUDA (`kdequant_mm_int32_fp16`): `half(fmaf(float(acc)·row·col, 6.200012e-05f, bias))`, left to right,
  bias read as fp16 (0 when absent), output fp16 only (other dtypes are the fp16 result cast again):
  model `a_then_w+fma+absmax_stats*6.20001229e-05`. cuBLASLt int8 for the accumulator (exact), except
  K not a multiple of 4: an fp32 matmul (`lda % 4 != 0` fallback). The kernel flushes fp32 intermediates
  below 2⁻¹²⁶ to zero, as a fast-math build does (`cuda_flushed_epilogue`): on the subnormal-outputs tile in
  fp16 (products of about 2⁻¹³⁰) the H100 gave 1 element of 1,152 that differs from the model, where the
  model's −0 came out +0 (`fmaf(−0·c, +0)`); flushing predicts exactly that one element (2026-12-06).
* CPU (the `default` backend): `(acc · (row·col)) · 6.200124e-05` in fp32, `+= bias` in fp32, then the
  cast: model `product_first+add_before_cast+absmax_stats*6.20012434e-05`. Note the constant: the CUDA
  kernel's is 1/127² (6.2000124e-05 rounded), the CPU backend's 6.200124e-05 is 1.8·10⁻⁵ larger —
  the two backends differ by more than rounding. The accumulator on the CPU is `torch._int_mm` only
  with AVX-512; otherwise bitsandbytes' `default` backend computes it as an fp32 matmul cast to
  int32, exact only while its partial sums stay within 2²⁴ (the exposed accumulator lets the
  exact-accumulator check judge it).

Statistics, not scales. bitsandbytes takes absmax statistics: `row_stats[m] = max|x_m|`, and
dequantizes with `stat/127`. alibi holds scales `s` with `x ≈ q·s`, so the adapter hands it
`row = 127·s_a`, `col = 127·s_w` — and refuses (InputError naming the first element) operands for
which that product is not exactly an fp32 number, since bitsandbytes would then see other
operands than alibi's: exact for scales with at most 17 significant bits, e.g. powers of two, and
for scales made as `stat/127` from a statistic with at most 17 significant bits.
On CUDA the adapter refuses output dtypes other than fp16 and a bias that is not fp16: those go
through a second rounding (the fp16 result cast again, a bias added in fp16) that the declared
model does not describe.
"""

from __future__ import annotations

import importlib.metadata
import os
from typing import Any

import torch

from alibi.errors import InputError, KernelUnavailable
from alibi.exact.emulator import ABSMAX_LEVELS, EpilogueModel, fma_f32
from alibi.io.digests import sha256_file
from alibi.kernels.base import Kernel

PINNED_VERSION = "0.50.2"
INSTALL = f"pip install 'integer-alibi[bnb]' (bitsandbytes=={PINNED_VERSION})"
CUDA_CONSTANT = 6.200012e-05    # MM_DEQUANT_CONST in csrc/kernels.cu
CPU_CONSTANT = 6.200124e-05     # backends/default/ops.py
BNB_CUDA = EpilogueModel("a_then_w", "fma", statistics=CUDA_CONSTANT)
BNB_CPU = EpilogueModel("product_first", "add_before_cast", statistics=CPU_CONSTANT)


def cuda_flushed_epilogue(model: EpilogueModel, acc: torch.Tensor, s_a: torch.Tensor, s_w: torch.Tensor,
                          out_dtype: torch.dtype) -> torch.Tensor:
    """The CUDA kernel's arithmetic where fp32 intermediates fall below 2⁻¹²⁶ (module docstring): the statistics
    epilogue `model` (a_then_w, no bias: the kernel's fmaf adds +0) with every fp32 intermediate flushed to a
    zero of its sign. Elsewhere it equals `apply_epilogue(model, ...)`."""
    def flush(x: torch.Tensor) -> torch.Tensor:
        return torch.where(x.abs() < torch.finfo(torch.float32).tiny, torch.copysign(torch.zeros_like(x), x), x)

    row = flush(s_a.to(torch.float32).reshape(-1, 1) * ABSMAX_LEVELS)
    col = flush(s_w.to(torch.float32).reshape(1, -1) * ABSMAX_LEVELS)
    y = flush(flush(acc.to(torch.float32) * row) * col)
    c = torch.tensor(model.statistics, dtype=torch.float32, device=y.device)
    return flush(fma_f32(y, c, torch.zeros_like(y))).to(out_dtype)


def bnb_version() -> str | None:
    try:
        return importlib.metadata.version("bitsandbytes")
    except importlib.metadata.PackageNotFoundError:
        return None


_LOADED: dict[str, Any] = {}


def _import() -> Any:
    if "bnb" in _LOADED:
        return _LOADED["bnb"]
    if bnb_version() is None:
        raise KernelUnavailable(f"bitsandbytes is not installed; {INSTALL}")
    try:
        # deferred: keeps bitsandbytes out of start-up
        import bitsandbytes
    except Exception as exc:  # noqa: BLE001 - foreign code: any import failure is a refusal
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise KernelUnavailable(f"importing bitsandbytes failed: {type(exc).__name__}: {first}") from None
    _LOADED["bnb"] = bitsandbytes
    return bitsandbytes


def statistics(scale: torch.Tensor, label: str, kernel: str) -> torch.Tensor:
    """`127·scale` as fp32, refused (InputError) where that product is not exactly an fp32 number."""
    exact = scale.to(torch.float64) * ABSMAX_LEVELS
    stats = exact.to(torch.float32)
    bad = (stats.to(torch.float64) != exact).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise InputError(f"kernel {kernel!r} takes absmax statistics 127·s, and 127·{label}[{i}] = "
                         f"127·{float(scale[i])!r} is not an fp32 number ({bad.shape[0]} such scale(s)): "
                         "bitsandbytes would see other operands. Use scales with at most 17 significant bits "
                         "(e.g. --scales pow2, or scales made as stat/127 from such a statistic)")
    return stats.contiguous()


STATISTIC_BITS = 17  # 127 < 2^7: a 17-bit significand times 127 fits fp32's 24 bits


def with_exact_statistics(tile):
    """`tile` with s_a and s_w rounded (to nearest, ties to even) to 17 significant bits, so that 127·s is an
    fp32 number and bitsandbytes can be handed exactly these operands; name and meta say so."""
    def round17(s: torch.Tensor) -> torch.Tensor:
        m, e = torch.frexp(s.to(torch.float64))
        return torch.ldexp(torch.round(m * 2.0**STATISTIC_BITS) / 2.0**STATISTIC_BITS, e).to(torch.float32)
    meta = {**dict(tile.meta), "scales": f"rounded to {STATISTIC_BITS} significant bits (alibi.kernels.bnb)"}
    return tile.replace(s_a=round17(tile.s_a), s_w=round17(tile.s_w), meta=meta)


class BnbInt8Kernel(Kernel):
    """`bnb-int8`: bitsandbytes' int8_scaled_mm (int8_linear_matmul + int8_mm_dequant) on its statistics."""

    name = "bnb-int8"
    formats = ("int8",)
    description = ("bitsandbytes 0.50.2 LLM.int8() matmul: int8_linear_matmul, then int8_mm_dequant on absmax "
                   "statistics 127·s (CUDA: fp16 output, one FMA with 1/127²; CPU: product first, constant 6.200124e-05)")

    def __init__(self) -> None:
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.epilogue = BNB_CUDA if self.device == "cuda" else BNB_CPU
        self.last_run: dict[str, Any] = {}

    def available(self) -> tuple[bool, str]:
        version = bnb_version()
        if version is None:
            return False, f"bitsandbytes is not installed; {INSTALL}"
        try:
            _import()
        except KernelUnavailable as exc:
            return False, str(exc)
        if not hasattr(torch.ops.bitsandbytes, "int8_scaled_mm"):
            return False, f"bitsandbytes {version} registers no bitsandbytes::int8_scaled_mm op"
        note = "" if version == PINNED_VERSION else f"; the declared epilogue was read from {PINNED_VERSION}"
        where = f"CUDA ({torch.cuda.get_device_name()})" if self.device == "cuda" else "the CPU (default backend)"
        return True, f"bitsandbytes {version} int8_scaled_mm on {where}{note}"

    def _operands(self, a_q, s_a, w_q, s_w, bias, out_dtype):
        if a_q.dtype != torch.int8 or w_q.dtype != torch.int8:
            raise InputError(f"kernel {self.name!r} takes int8 operands, got {a_q.dtype} and {w_q.dtype}")
        if self.device == "cuda" and (out_dtype != torch.float16 or (bias is not None and bias.dtype != torch.float16)):
            raise InputError(f"kernel {self.name!r} on CUDA is held to bitsandbytes' fused fp16 path: fp16 output and an "
                             f"fp16 bias (or none); got {str(out_dtype).removeprefix('torch.')} output"
                             + ("" if bias is None else f" and a {str(bias.dtype).removeprefix('torch.')} bias")
                             + ": use fp16 tiles")
        return (statistics(s_a.reshape(-1), "s_a", self.name), statistics(s_w.reshape(-1), "s_w", self.name))

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor | None:
        _import()
        return torch.ops.bitsandbytes.int8_linear_matmul.default(a_q.contiguous(), w_q.contiguous())

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        _import()
        row, col = self._operands(a_q, s_a, w_q, s_w, bias, out_dtype)
        out = torch.ops.bitsandbytes.int8_scaled_mm.default(a_q.contiguous(), w_q.contiguous(), row, col,
                                                            bias=None if bias is None else bias.contiguous(),
                                                            dtype=out_dtype)
        self.last_run = {"M": int(a_q.shape[0]), "op": "bitsandbytes::int8_scaled_mm",
                         "bias_dtype": None if bias is None else str(bias.dtype).removeprefix("torch.")}
        return out

    def evidence(self) -> dict[str, Any]:
        ev = super().evidence()
        files = {}
        bnb = _LOADED.get("bnb")
        if bnb is not None:
            folder = os.path.dirname(bnb.__file__)
            for rel in ("_ops.py", "backends/default/ops.py", "backends/cpu/ops.py", "backends/cuda/ops.py"):
                path = os.path.join(folder, rel)
                if os.path.isfile(path):
                    files[rel] = sha256_file(path)
            lib = getattr(getattr(bnb, "cextension", None), "lib", None)
            lib_path = getattr(lib, "_name", None) or getattr(getattr(lib, "_lib", None), "_name", None)
            if lib_path and os.path.isfile(lib_path):
                files[os.path.basename(lib_path)] = sha256_file(lib_path)
        ev["bitsandbytes"] = {"version": bnb_version(), "pinned": PINNED_VERSION, "sha256": files}
        ev["last_run"] = dict(self.last_run)
        return ev


__all__ = ["BNB_CPU", "BNB_CUDA", "BnbInt8Kernel", "statistics", "with_exact_statistics"]
