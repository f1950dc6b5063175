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
before torch is loaded.
"""
