"""The `cutlass` kernel: an int8 scaled GEMM built from the CUTLASS headers, with vLLM's CUTLASS epilogue.

What it computes, for int8 `A [M,K]`, `W [N,K]`, fp32 scales `s_a [M]`, `s_w [N]`, an optional
bias and bfloat16/float16 output (sources in `csrc/`, one epilogue program for both paths):

    acc = Σ_k A[m,k]·W[n,k]                      int32 tensor-core MMA: exact, order-free
    t   = RN32(s_w[n] · float(acc))              __fmul_rn
    y   = RN32(s_a[m] · t)                       no bias (as fma with -0.0f, bit-identical)
    y   = RN32(s_a[m] · t + float(bias[n]))      with a bias: __fmaf_rn, one rounding
    out = out_dtype(y)                           round to nearest even

i.e. the `w_then_a+fma` epilogue model, vLLM's CUTLASS order (science.md §3). The FMA is written
explicitly (`__fmaf_rn` in a custom EVT compute node), so it does not depend on nvcc contracting
`a*b + c` as vLLM's build does.

Two code paths, chosen by the GPU's compute capability at run time:

* sm90 (H100/H200, `sm_90a`): CUTLASS 3 collective builder (TMA, warp-specialized / ping-pong
  schedules, thread-block clusters) with an epilogue visitor tree: per-column broadcast of s_w,
  per-row broadcast of s_a, a per-column bias broadcast. Mainloop configurations by M as vLLM's
  sm90 int8 dispatch.
* sm80 (A100, sm_86, L4/L40/4090 = sm_89, and later GPUs without the sm_90a instructions):
  CUTLASS 2 `mma.sync` GEMM with the same program as an sm80 visitor tree. `CutlassInt8Kernel(path="sm80")`
  forces it on Hopper too, which is how it is tested on an H200.

Shapes. The kernels need 16-byte rows: K a multiple of 16 (int8 A and W) and N a multiple of 8
(bf16/fp16 output; also 16-byte rows of the int32 accumulator). Other shapes are zero-padded here
— K with zero columns in both A and W, N with zero weight rows (scale 1, bias 0) whose output
columns are dropped. Padding is exact: a zero product adds exactly 0 to an integer sum, and output
columns are independent of each other. Any M works (TMA and the predicated sm80 iterators clip
rows). The evidence of each run says whether it padded.

The library is compiled at first use (see `alibi.kernels.nvcc`); `build(arch)` compiles it ahead
of time on any machine with nvcc, with or without a GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from alibi.errors import InputError, KernelUnavailable
from alibi.exact.emulator import VLLM_CUTLASS
from alibi.kernels import nvcc
from alibi.kernels.base import Kernel

K_MULTIPLE = 16  # int8 rows of A and W must be 16-byte aligned (TMA / cp.async 16 B)
N_MULTIPLE = 8   # bf16/fp16 output rows must be 16-byte aligned

INT8_SM90_SOURCES = ("sm90_int8_api.cu", "sm90_int8_bf16.cu", "sm90_int8_f16.cu", "sm90_int8_acc.cu")
INT8_SM80_SOURCES = ("sm80_int8_api.cu", "sm80_int8_bf16.cu", "sm80_int8_f16.cu", "sm80_int8_acc.cu")
OUT_KIND = {torch.bfloat16: 0, torch.float16: 1}


def int8_library(path: str, arch: str) -> nvcc.Library:
    """The int8 library of code path `path` ("sm90" or "sm80") for GPU target `arch`."""
    if path == "sm90":
        return nvcc.Library("alibi_cutlass_int8_sm90", INT8_SM90_SOURCES, (nvcc.gencode_for("sm_90a"),))
    return nvcc.Library(f"alibi_cutlass_int8_sm80_{arch}", INT8_SM80_SOURCES, (nvcc.gencode_for(arch),))


def path_for(arch: str) -> str:
    """Which code path serves GPU target `arch`: sm_90/sm_90a → "sm90", anything else → "sm80"."""
    nvcc.gencode_for(arch)  # validates the name
    return "sm90" if arch in ("sm_90", "sm_90a") else "sm80"


def device_arch(device: torch.device | None = None) -> str:
    """`sm_XY` of `device` (default: the current one), asked once per device and process (each launch asks)."""
    index = None if device is None else torch.device(device).index
    major, minor = _capability(torch.cuda.current_device() if index is None else index)
    return f"sm_{major}{minor}"


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


# --- ctypes plumbing shared with alibi.kernels.fp8 ------------------------------------------------

def declare_entry_points(lib: ctypes.CDLL, fmt: str) -> None:
    """Attach C signatures (entry_points.h) to the functions of a loaded library."""
    p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_int
    scaled = getattr(lib, f"alibi_{fmt}_scaled_mm")
    scaled.argtypes = [i, p, p, p, p, p, p, i, i, i, i, ctypes.POINTER(i), p]
    scaled.restype = f
    acc = getattr(lib, f"alibi_{fmt}_accumulate")
    acc.argtypes = [p, p, p, i, i, i, i, ctypes.POINTER(i), p]
    acc.restype = f
    lib.alibi_choose_config.argtypes = [i, i]
    lib.alibi_choose_config.restype = i
    lib.alibi_config_name.argtypes = [i]
    lib.alibi_config_name.restype = ctypes.c_char_p
    lib.alibi_path.restype = ctypes.c_char_p
    lib.alibi_cutlass_version.restype = i
    lib.alibi_last_error.restype = ctypes.c_char_p


def aligned(t: torch.Tensor) -> torch.Tensor:
    """`t` contiguous and 16-byte aligned (a row slice of a larger tensor may start mid-vector)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def scale_vector(scale: torch.Tensor, n: int, label: str) -> torch.Tensor:
    """A float32 [n] scale vector; a per-tensor [1] scale is broadcast (the same value, exactly)."""
    if scale.dtype != torch.float32 or scale.dim() != 1 or scale.numel() not in (1, n):
        raise InputError(f"{label} must be a float32 vector of length {n} (or 1), "
                         f"got {scale.dtype} of shape {list(scale.shape)}")
    return scale.expand(n) if scale.numel() == 1 and n != 1 else scale


def pad_operands(a: torch.Tensor, w: torch.Tensor, s_w: torch.Tensor | None, bias: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None, dict[str, int]]:
    """Zero-pad K to a multiple of 16 and N to a multiple of 8 (exact; see the module docstring).

    Float8 tensors are padded through a uint8 view (F.pad has no float8 kernels); the zero byte
    is +0.0 in e4m3.
    """
    K = a.shape[1]
    N = w.shape[0]
    pad_k, pad_n = -K % K_MULTIPLE, -N % N_MULTIPLE

    def pad(t: torch.Tensor, spec: tuple[int, ...], value: float = 0.0) -> torch.Tensor:
        if t.dtype == torch.float8_e4m3fn:
            return F.pad(t.view(torch.uint8), spec, value=0).view(torch.float8_e4m3fn)
        return F.pad(t, spec, value=value)

    if pad_k:
        a, w = pad(a, (0, pad_k)), pad(w, (0, pad_k))
    if pad_n:
        w = pad(w, (0, 0, 0, pad_n))
        if s_w is not None:
            s_w = F.pad(s_w.contiguous(), (0, pad_n), value=1.0)
        if bias is not None:
            bias = F.pad(bias, (0, pad_n), value=0.0)
    return a, w, s_w, bias, {"pad_k": pad_k, "pad_n": pad_n}


class CutlassLibrary:
    """A loaded CUTLASS library for operand format `fmt` ("int8" or "fp8"): calls into its C entry points."""

    def __init__(self, library: nvcc.Library, fmt: str):
        self.library = library
        self.fmt = fmt
        # check: the cached .so's digest, verified against its build record before it was loaded
        self.handle, self.check = nvcc.load(library)
        self.path = self.check.path
        declare_entry_points(self.handle, fmt)

    def describe(self, config: int) -> str:
        return self.handle.alibi_config_name(config).decode()

    @functools.cached_property
    def evidence(self) -> dict[str, Any]:
        """What every launch through this library records about it, read once (the files do not change while it
        is loaded): its code path, file, build record, the CUTLASS version and the digest of the bytes loaded."""
        return {"code_path": self.handle.alibi_path().decode(), "library": str(self.path),
                "build": nvcc.build_record(self.path), "cutlass": nvcc.cutlass_version(),
                # a DigestSet, as manifests require of every `*_digest` key (kernel evidence is recorded in them)
                "build_digest": {"sha256": self.check.sha256}, "binary": self.check.to_json()}

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise KernelUnavailable(f"{self.library.name}: {what} failed: "
                                    f"{self.handle.alibi_last_error().decode()}")

    def scaled_mm(self, a: torch.Tensor, s_a: torch.Tensor, w: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None, out_dtype: torch.dtype, config: int = -1
                  ) -> tuple[torch.Tensor, dict[str, Any]]:
        M, N = a.shape[0], w.shape[0]
        s_a = aligned(scale_vector(s_a, M, "s_a"))
        s_w = scale_vector(s_w, N, "s_w")
        # Widening bf16/fp16 bias to fp32 is exact; the kernel reads fp32.
        bias32 = bias.to(torch.float32) if bias is not None else None
        a, w, s_w, bias32, padding = pad_operands(a, w, s_w, bias32)
        a, w, s_w = aligned(a), aligned(w), aligned(s_w)
        bias32 = aligned(bias32) if bias32 is not None else None
        Np, Kp = w.shape
        out = torch.empty((M, Np), dtype=out_dtype, device=a.device)
        ran = ctypes.c_int(-1)
        if M > 0:
            stream = torch.cuda.current_stream(a.device).cuda_stream
            status = getattr(self.handle, f"alibi_{self.fmt}_scaled_mm")(
                OUT_KIND[out_dtype], out.data_ptr(), a.data_ptr(), w.data_ptr(), s_a.data_ptr(),
                s_w.data_ptr(), bias32.data_ptr() if bias32 is not None else None,
                M, Np, Kp, config, ctypes.byref(ran), stream)
            self._check(status, f"scaled_mm M={M} N={Np} K={Kp}")
        out = out[:, :N] if padding["pad_n"] else out
        return out, {"config": ran.value, "config_name": self.describe(ran.value), **padding}

    def accumulate(self, a: torch.Tensor, w: torch.Tensor, config: int = -1) -> tuple[torch.Tensor, dict[str, Any]]:
        M, N = a.shape[0], w.shape[0]
        a, w, _, _, padding = pad_operands(a, w, None, None)
        a, w = aligned(a), aligned(w)
        Np, Kp = w.shape
        acc = torch.empty((M, Np), dtype=torch.int32 if self.fmt == "int8" else torch.float32, device=a.device)
        ran = ctypes.c_int(-1)
        if M > 0:
            stream = torch.cuda.current_stream(a.device).cuda_stream
            status = getattr(self.handle, f"alibi_{self.fmt}_accumulate")(
                acc.data_ptr(), a.data_ptr(), w.data_ptr(), M, Np, Kp, config, ctypes.byref(ran), stream)
            self._check(status, f"accumulate M={M} N={Np} K={Kp}")
        acc = acc[:, :N] if padding["pad_n"] else acc
        return acc, {"config": ran.value, "config_name": self.describe(ran.value), **padding}


def on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """`torch.cuda.device(device)`, or nothing to do when it is the current device already (the common case, and
    a switch costs more than the launch's own Python)."""
    if device.index is None or device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def check_operands(name: str, a_q: torch.Tensor, w_q: torch.Tensor, dtype: torch.dtype) -> None:
    if a_q.dtype != dtype or w_q.dtype != dtype:
        raise InputError(f"kernel {name!r} takes {dtype} operands, got {a_q.dtype} and {w_q.dtype}")
    if a_q.dim() != 2 or w_q.dim() != 2 or a_q.shape[1] != w_q.shape[1]:
        raise InputError(f"kernel {name!r}: operands must be A [M,K] and W [N,K] with one K; "
                         f"got {list(a_q.shape)} and {list(w_q.shape)}")
    if a_q.device.type != "cuda" or w_q.device != a_q.device:
        raise InputError(f"kernel {name!r} runs on CUDA tensors of one device; got {a_q.device} and {w_q.device}")
    if w_q.shape[0] == 0 or a_q.shape[1] == 0:
        raise InputError(f"kernel {name!r}: empty operands (K={a_q.shape[1]}, N={w_q.shape[0]})")


def toolchain_reason() -> str | None:
    """None if nvcc and the CUTLASS headers are present, else why not (and what to install)."""
    try:
        nvcc.find_nvcc()
        nvcc.cutlass_include_dirs()
    except KernelUnavailable as exc:
        return str(exc)
    return None


class CutlassKernel(Kernel):
    """What the CUTLASS kernels share: operands checked, the op run through the library that
    `library()` builds and loads at first use, and evidence naming the library that ran."""

    device = "cuda"
    operand_dtype: torch.dtype = torch.int8

    def __init__(self) -> None:
        self.last_run: dict[str, Any] = {}
        self._ran: CutlassLibrary | None = None

    def library(self) -> CutlassLibrary:
        raise NotImplementedError

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
                  config: int = -1) -> torch.Tensor:
        check_operands(self.name, a_q, w_q, self.operand_dtype)
        if out_dtype not in OUT_KIND:
            raise InputError(f"kernel {self.name!r}: out_dtype must be bfloat16 or float16, got {out_dtype}")
        if bias is not None and tuple(bias.shape) != (w_q.shape[0],):
            raise InputError(f"kernel {self.name!r}: bias must have shape [{w_q.shape[0]}], got {list(bias.shape)}")
        with on_device(a_q.device):
            self._ran = self.library()
            out, info = self._ran.scaled_mm(a_q, s_a, w_q, s_w, bias, out_dtype, config)
        self.last_run = {"op": "scaled_mm", **info}
        return out

    def accumulator(self, a_q: torch.Tensor, w_q: torch.Tensor, config: int = -1) -> torch.Tensor:
        """The accumulator (int32 for int8, fp32 for fp8) of the mainloop configuration `scaled_mm` uses,
        so for fp8 it is summed in the same order."""
        check_operands(self.name, a_q, w_q, self.operand_dtype)
        with on_device(a_q.device):
            self._ran = self.library()
            acc, info = self._ran.accumulate(a_q, w_q, config)
        self.last_run = {"op": "accumulate", **info}
        return acc

    def build_digest(self) -> str:
        """sha256 of the library bytes last run (verified against the build record, then loaded);
        before any run, the sources' digest (`Kernel.build_digest`)."""
        return super().build_digest() if self._ran is None else self._ran.check.sha256

    def evidence(self) -> dict[str, Any]:
        ev = super().evidence()
        if self._ran is not None:
            ev.update(self._ran.evidence)
        ev["last_run"] = dict(self.last_run)
        return ev


class CutlassInt8Kernel(CutlassKernel):
    """`cutlass`: CUTLASS int8 scaled GEMM (sm90 or sm80 path), vLLM's CUTLASS epilogue `w_then_a+fma`."""

    replayable = True  # every launch a function of the operands (alibi.conform.launches)

    name = "cutlass"
    formats = ("int8",)
    epilogue = VLLM_CUTLASS
    description = ("CUTLASS int8 scaled-mm built with nvcc at first use (sm90: CUTLASS 3 + EVT; sm80/sm89: "
                   "CUTLASS 2), vLLM CUTLASS epilogue: w_then_a, bias in one FMA")

    def __init__(self, path: str | None = None):
        if path not in (None, "sm90", "sm80"):
            raise InputError(f"CUTLASS code path {path!r} is unknown; choose sm90 or sm80 (or None: by GPU)")
        super().__init__()
        self.forced_path = path
        if path == "sm80":
            self.name = "cutlass-sm80"
        self._libraries: dict[tuple[str, str], CutlassLibrary] = {}

    # -- where and how it runs --------------------------------------------------------------------

    def _target(self) -> tuple[str, str]:
        """(path, arch) for the current GPU."""
        arch = device_arch()
        path = self.forced_path or ("sm90" if arch == "sm_90" else "sm80")
        return path, ("sm_90a" if path == "sm90" else arch)

    def available(self) -> tuple[bool, str]:
        if not torch.cuda.is_available():
            return False, ("no CUDA GPU here (torch.cuda.is_available() is False); "
                           f"'alibi kernels build {self.name} --arch sm_90' still compiles it with nvcc")
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) < (8, 0):
            return False, f"needs compute capability 8.0 or newer; this GPU is sm_{major}{minor}"
        if self.forced_path == "sm90" and (major, minor) != (9, 0):
            return False, f"the sm90 path needs an sm_90 GPU (H100/H200); this GPU is sm_{major}{minor}"
        problem = toolchain_reason()
        if problem:
            return False, problem
        path, arch = self._target()
        return True, (f"CUTLASS {nvcc.cutlass_version()} {path} path for {arch} on {torch.cuda.get_device_name()}, "
                      "built with nvcc at first use")

    def build(self, arch: str) -> Path:
        """Compile the library for GPU target `arch` (no GPU needed); returns the cached `.so`."""
        path = self.forced_path or path_for(arch)
        if path == "sm90" and arch not in ("sm_90", "sm_90a"):
            raise InputError(f"the sm90 path targets sm_90a only, not {arch}")
        return nvcc.build(int8_library(path, "sm_90a" if path == "sm90" else arch))

    def library(self) -> CutlassLibrary:
        """The loaded library for the current GPU (availability is checked once, when it is first loaded)."""
        key = self._target()
        if key not in self._libraries:
            self.require_available()
            self._libraries[key] = CutlassLibrary(int8_library(*key), "int8")
        return self._libraries[key]


class CutlassSm80Int8Kernel(CutlassInt8Kernel):
    """`cutlass-sm80`: the CUTLASS 2 path forced on any GPU of compute capability 8.0 or newer."""

    replayable = True  # every launch a function of the operands (alibi.conform.launches)

    def __init__(self) -> None:
        super().__init__(path="sm80")
