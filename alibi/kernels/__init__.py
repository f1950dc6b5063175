"""Kernels: the scaled GEMM implementations under test, and how a name becomes one.

- `base`: the interface (`Kernel`, `KernelOutput`, the declared epilogue model, `available()`);
- `catalog`: which kernel names exist, without importing any kernel (or torch);
- `registry`: `get_kernel(name)`, `kernel_names()`, `register(name, factory)` and the `alibi.kernels`
  entry-point group for third-party kernels;
- one module per implementation: `cpu` (torch-cpu, the emulator), `triton_int8`, `triton_fp8`,
  `cutlass` and `fp8` (built with `nvcc`), `cublas`, `vllm` and `vllm_cpu`, `torchao`, `bnb`,
  `fbgemm`, `sglang`, and `mutants` (deliberately faulty kernels, the positive controls);
- `bench`: throughput of the GPU kernels side by side (`alibi bench`).

Importing this package imports nothing: `alibi.kernels.catalog` answers "is this a kernel name?"
before torch is loaded. The names this package exported before its modules were split (`from alibi.kernels import
Kernel`, the plugin API of earlier READMEs) keep working, imported on first use, with a DeprecationWarning naming
the import to use now (`from alibi.kernels.base import Kernel`).
"""

import importlib
import warnings

# name -> the module it lives in now
_MOVED = {"Kernel": "alibi.kernels.base", "KernelOutput": "alibi.kernels.base", "get_kernel": "alibi.kernels.registry",
          "kernel_names": "alibi.kernels.registry", "register": "alibi.kernels.registry"}


def __getattr__(name: str) -> object:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"'from alibi.kernels import {name}' is the old import; use 'from {module} import {name}'",
                  DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(module), name)
