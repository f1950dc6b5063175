// The C interface of every library built from this folder (loaded with ctypes by
// alibi/kernels/cutlass.py and alibi/kernels/fp8.py), and the C++ functions behind it.
//
// Conventions shared by all entry points:
//   * pointers are device pointers; a = activations row-major [M,K], w = weights row-major [N,K],
//     out/acc row-major [M,N]; s_a [M] and s_w [N] fp32; bias [N] fp32 or NULL.
//   * out_kind: 0 = bfloat16, 1 = float16.
//   * config: a mainloop configuration id, or -1 to choose by shape (alibi_choose_config);
//     *ran (may be NULL) receives the configuration that actually ran.
//   * the return value is 0 on success; otherwise alibi_last_error() says what failed.
//   * work is enqueued on `stream` and not synchronised.

#pragma once

#include <cuda_runtime.h>

#include <cstdint>

extern "C" {
// int8 operands, int32 accumulator (libraries alibi_cutlass_int8_sm90, alibi_cutlass_int8_sm80).
int alibi_int8_scaled_mm(int out_kind, void* out, void const* a, void const* w, float const* s_a,
                         float const* s_w, float const* bias, int M, int N, int K, int config,
                         int* ran, cudaStream_t stream);
int alibi_int8_accumulate(int32_t* acc, void const* a, void const* w, int M, int N, int K,
                          int config, int* ran, cudaStream_t stream);

// e4m3 operands, fp32 accumulator (library alibi_cutlass_fp8_sm90).
int alibi_fp8_scaled_mm(int out_kind, void* out, void const* a, void const* w, float const* s_a,
                        float const* s_w, float const* bias, int M, int N, int K, int config,
                        int* ran, cudaStream_t stream);
int alibi_fp8_accumulate(float* acc, void const* a, void const* w, int M, int N, int K, int config,
                         int* ran, cudaStream_t stream);

// Present in every library.
int alibi_choose_config(int M, int N);
char const* alibi_config_name(int config);
char const* alibi_path(void);  // which code path this library is, in words
int alibi_cutlass_version(void);
char const* alibi_last_error(void);
}
