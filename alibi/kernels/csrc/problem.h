// One GEMM invocation as the C++ side sees it, and the per-output-type functions that the
// translation units of each library define (split so nvcc can compile them in parallel; the
// *_api.cu units hold the C entry points of entry_points.h and dispatch to these).

#pragma once

#include <cuda_runtime.h>

namespace alibi {

// a row-major [M,K]; b = weights row-major [N,K] (column-major [K,N]); d row-major [M,N];
// s_a [M], s_w [N], bias [N] (or null) in fp32.
struct Problem {
  void* d;
  void const* a;
  void const* b;
  float const* s_a;
  float const* s_w;
  float const* bias;
  int M, N, K;
  cudaStream_t stream;
};

namespace sm90 {
int int8_scaled_mm_bf16(Problem const& p, int config);
int int8_scaled_mm_f16(Problem const& p, int config);
int int8_accumulate(Problem const& p, int config);
int fp8_scaled_mm_bf16(Problem const& p, int config);
int fp8_scaled_mm_f16(Problem const& p, int config);
int fp8_accumulate(Problem const& p, int config);
}  // namespace sm90

namespace sm80 {
int int8_scaled_mm_bf16(Problem const& p, int config, int* ran);
int int8_scaled_mm_f16(Problem const& p, int config, int* ran);
int int8_accumulate(Problem const& p, int config, int* ran);
}  // namespace sm80

}  // namespace alibi
