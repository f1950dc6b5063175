"""`fbgemm-fp8-row`: FBGEMM's pure-Triton row-wise FP8 GEMM, `matmul_fp8_row`, loaded without FBGEMM's library.

`fbgemm_gpu/experimental/gemm/triton_gemm/fp8_gemm.py` (fbgemm-gpu-genai 1.6.0) is Triton source that
imports only its two siblings (`matmul_perf_model.py`, `utils.py`), torch, triton and packaging. FBGEMM's
compiled library is tied to one torch build (1.6 ↔ torch 2.11), so alibi never imports the
`fbgemm_gpu` package itself: it puts a stand-in package `fbgemm_gpu` into `sys.modules` whose path is
the folder holding the wheel's `fbgemm_gpu/` tree, and imports `fbgemm_gpu.experimental.gemm.triton_gemm.
fp8_gemm` from there (the subfolders have no `__init__.py` above `triton_gemm`, so nothing else runs).
Where the tree is: `ALIBI_FBGEMM_ROOT` (a folder holding `fbgemm_gpu/experimental/gemm/triton_gemm/`,
e.g. the unpacked wheel), else an installed fbgemm-gpu-genai, located without importing it.

Which of its kernels runs. On NVIDIA GPUs `matmul_fp8_row` defaults to its TMA-persistent kernel, whose
launcher fills TMA descriptors through `triton.runtime.driver.active.utils.fill_1d_tma_descriptor`. Triton 3.6
(the release torch 2.11 ships) no longer has that function: on the H200 every call of the default path raised
`AttributeError: 'CudaUtils' object has no attribute 'fill_1d_tma_descriptor'` (2026-12-06). So alibi passes
`tma_persistent=False`, which selects FBGEMM's persistent kernel with ordinary loads (`_kernel_matmul_fp8_row`,
the same epilogue); the choice is recorded in the evidence (`last_run.tma_persistent`). A user of this FBGEMM
release on this Triton gets the same error from the default call. That kernel is autotuned over FBGEMM's 88
configurations per shape (`MATMUL_CONFIGS`: each compiled and timed), which took minutes for the handful of
shapes of one conformance matrix on the H100 (2026-12-06); for the duration of a call alibi offers the
autotuner the first of them (FBGEMM's own first choice for compute-bound shapes) and records it in the evidence
(`last_run.triton_config`). The tile configuration changes the fp8 accumulation order, which is
implementation-defined anyway, not the epilogue.

What runs: `matmul_fp8_row(a, b, a_scale, b_scale, bias, tma_persistent=False)` with e4m3 `a [M,K]`, `b [N,K]`, fp32 scales
`[M]`, `[N]` with `A·a_scale = original A` (alibi's convention), bias `[N]`; fp32 accumulation, output
bf16 only. Every variant of its epilogue does `scale = a_scale[:, None] * b_scale[None, :]`,
`acc *= scale`, `acc += bias[None, :]`, then the cast: the scale product first. Triton contracts a
multiply followed by an add into one FMA by default (`enable_fp_fusion`), so the declared model is
`product_first+fma`; as for every fp8 kernel, the accumulator itself rounds in an
implementation-defined order, so conform cannot hold the arm to its model without an exposed
accumulator, and the declaration is checked on the H200 with operands whose fp32 sums are exact
(analysis/h200/ecosystem.sh).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Any

import torch

from alibi.errors import InputError, KernelUnavailable
from alibi.exact.emulator import EpilogueModel
from alibi.exact.fp8_mma import FAST_ACCUM
from alibi.io.digests import sha256_file
from alibi.kernels.base import Kernel, availability, cuda_problem

ENV_ROOT = "ALIBI_FBGEMM_ROOT"
PINNED_VERSION = "1.6.0"
TRITON_DIR = Path("fbgemm_gpu/experimental/gemm/triton_gemm")
MODULE = "fbgemm_gpu.experimental.gemm.triton_gemm.fp8_gemm"
FILES = ("fp8_gemm.py", "utils.py", "matmul_perf_model.py", "__init__.py")
# sha256 of the files in fbgemm_gpu_genai-1.6.0-cp311-cp311-manylinux_2_28_x86_64.whl (the same Python source in
# every wheel of the release): how a tree named by ALIBI_FBGEMM_ROOT is tied to a release.
KNOWN_FP8_GEMM = {"f08dea1a1f65ce2a375adebb5f456dd1a66f92a71e7323b99a992d1d1ae5f237": "1.6.0"}
FBGEMM_FP8_ROW = EpilogueModel("product_first", "fma")
INSTALL = (f"set {ENV_ROOT} to a folder holding {TRITON_DIR}/ from the fbgemm-gpu-genai=={PINNED_VERSION} wheel "
           "(analysis/h200/ecosystem.sh unpacks it), or pip install fbgemm-gpu-genai matching your torch")


def locate_root() -> tuple[Path, str]:
    """(folder holding fbgemm_gpu/, where it came from); KernelUnavailable when there is none."""
    named = os.environ.get(ENV_ROOT)
    if named:
        root = Path(named).expanduser()
        if not (root / TRITON_DIR / "fp8_gemm.py").is_file():
            raise KernelUnavailable(f"{ENV_ROOT}={named}: no {TRITON_DIR}/fp8_gemm.py there; {INSTALL}")
        return root, ENV_ROOT
    try:
        spec = importlib.util.find_spec("fbgemm_gpu")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise KernelUnavailable(f"FBGEMM's Triton fp8 GEMM not found: fbgemm-gpu-genai is not installed and {ENV_ROOT} "
                                f"is not set; {INSTALL}")
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / TRITON_DIR.relative_to("fbgemm_gpu") / "fp8_gemm.py").is_file():
        raise KernelUnavailable(f"the installed fbgemm_gpu at {folder} has no {TRITON_DIR}/fp8_gemm.py; {INSTALL}")
    return folder.parent, "installed fbgemm_gpu"


_MODULE: dict[str, Any] = {}


def load_fp8_gemm() -> Any:
    """FBGEMM's fp8_gemm module, imported through a stand-in `fbgemm_gpu` package (module docstring)."""
    if "module" in _MODULE:
        return _MODULE["module"]
    root, _origin = locate_root()
    if "fbgemm_gpu" not in sys.modules:
        stub = types.ModuleType("fbgemm_gpu")
        stub.__doc__ = "alibi's stand-in for the fbgemm_gpu package: only its pure-Triton GEMM files are imported"
        stub.__path__ = [str(root / "fbgemm_gpu")]
        sys.modules["fbgemm_gpu"] = stub
    digests = {name: sha256_file(root / TRITON_DIR / name) for name in FILES if (root / TRITON_DIR / name).is_file()}
    try:
        module = importlib.import_module(MODULE)
    except Exception as exc:  # noqa: BLE001 - foreign code: any import failure is a refusal
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise KernelUnavailable(f"importing FBGEMM's {TRITON_DIR}/fp8_gemm.py failed: {type(exc).__name__}: {first}") from None
    if not callable(getattr(module, "matmul_fp8_row", None)):
        raise KernelUnavailable(f"{TRITON_DIR}/fp8_gemm.py defines no matmul_fp8_row: not FBGEMM's file")
    _MODULE.update(module=module, root=root, digests=digests)
    return module


class FbgemmFp8RowKernel(Kernel):
    """`fbgemm-fp8-row`: FBGEMM's Triton `matmul_fp8_row` (e4m3, row-wise scales, bf16 output)."""

    name = "fbgemm-fp8-row"
    formats = ("fp8_e4m3",)
    # `_kernel_matmul_fp8_row` chains `acc = tl.dot(a, b, acc)` over every K tile of an output tile (SPLIT_K 1 in
    # the configuration offered): Triton's sm90 default never promotes the chain.
    accumulation = FAST_ACCUM
    device = "cuda"
    epilogue = FBGEMM_FP8_ROW
    description = ("FBGEMM's pure-Triton matmul_fp8_row (fbgemm-gpu-genai 1.6.0 fp8_gemm.py): fp32 accumulation, "
                   "scale product first, bias in fp32, bf16 output")

    def __init__(self) -> None:
        self.last_run: dict[str, Any] = {}

    def available(self) -> tuple[bool, str]:
        return availability(locate_root, lambda: cuda_problem(fp8=True),
                            lambda found: f"FBGEMM Triton fp8_gemm.py from {found[1]} ({found[0]}) on "
                                          f"{torch.cuda.get_device_name()}")

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        if a_q.dtype != torch.float8_e4m3fn or w_q.dtype != torch.float8_e4m3fn:
            raise InputError(f"kernel {self.name!r} takes float8_e4m3fn operands, got {a_q.dtype} and {w_q.dtype}")
        if out_dtype != torch.bfloat16:
            raise InputError(f"kernel {self.name!r}: FBGEMM's matmul_fp8_row writes bfloat16 only; got "
                             f"{str(out_dtype).removeprefix('torch.')} tiles: use bfloat16 tiles")
        M, N = a_q.shape[0], w_q.shape[0]
        a_scale = (s_a.expand(M) if s_a.numel() == 1 else s_a.reshape(M)).to(torch.float32).contiguous()
        b_scale = (s_w.expand(N) if s_w.numel() == 1 else s_w.reshape(N)).to(torch.float32).contiguous()
        module = load_fp8_gemm()
        autotuner, config = module._kernel_matmul_fp8_row, module.MATMUL_CONFIGS[0]
        self.last_run = {"M": M, "op": "matmul_fp8_row", "tma_persistent": False,
                         "triton_config": {**config.kwargs, "num_stages": config.num_stages,
                                           "num_warps": config.num_warps},
                         "bias_dtype": None if bias is None else str(bias.dtype).removeprefix("torch.")}
        # tma_persistent=False: the TMA launcher needs a Triton API that Triton 3.6 removed; one configuration
        # offered to the autotuner (module docstring).
        offered = autotuner.configs
        autotuner.configs = [config]
        try:
            return module.matmul_fp8_row(a_q.contiguous(), w_q.contiguous(), a_scale, b_scale,
                                         bias=None if bias is None else bias.contiguous(), tma_persistent=False)
        finally:
            autotuner.configs = offered

    def evidence(self) -> dict[str, Any]:
        ev = super().evidence()
        digests = _MODULE.get("digests", {})
        release = KNOWN_FP8_GEMM.get(digests.get("fp8_gemm.py", ""))
        try:
            installed = importlib.metadata.version("fbgemm-gpu-genai")
        except importlib.metadata.PackageNotFoundError:
            installed = None
        ev["fbgemm"] = {"root": str(_MODULE.get("root")), "sha256": digests, "installed_version": installed,
                        "release_matching_sha256": release, "pinned": PINNED_VERSION}
        ev["last_run"] = dict(self.last_run)
        try:
            # deferred: keeps triton out of start-up
            import triton
            ev["triton"] = triton.__version__
        except ImportError:
            ev["triton"] = None
        return ev


__all__ = ["ENV_ROOT", "FBGEMM_FP8_ROW", "FbgemmFp8RowKernel", "load_fp8_gemm", "locate_root"]
