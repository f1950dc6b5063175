// C entry points of the sm90 e4m3 library (CUTLASS 3, FP8 fast accumulation, same epilogue tree).
#include "common_api.h"
#include "problem.h"

namespace {
char const* const kConfigNames[] = {
    "unused", "unused",
    "tile 64x64x128, cluster 1x8x1, TMA warp-specialized ping-pong FP8 fast-accum (M<=64)",
    "tile 64x128x128, cluster 2x1x1, TMA warp-specialized ping-pong FP8 fast-accum (M<=128)",
    "tile 128x128x128, cluster 2x1x1, TMA warp-specialized ping-pong FP8 fast-accum (M>128)",
};
}

extern "C" int alibi_choose_config(int M, int N) {
  (void)N;
  if (M <= 64) return 2;
  if (M <= 128) return 3;
  return 4;
}

extern "C" char const* alibi_config_name(int config) {
  return (config >= 2 && config < 5) ? kConfigNames[config] : "unknown";
}

extern "C" char const* alibi_path(void) {
  return "sm90: CUTLASS 3 collective builder, FP8 fast accumulation, epilogue visitor tree, sm_90a";
}

extern "C" int alibi_fp8_scaled_mm(int out_kind, void* out, void const* a, void const* w,
                                   float const* s_a, float const* s_w, float const* bias, int M,
                                   int N, int K, int config, int* ran, cudaStream_t stream) {
  char const* what = "alibi_fp8_scaled_mm (sm90)";
  if (int st = alibi::check_shape(what, M, N, K, 16, 8)) return st;
  if (config < 0) config = alibi_choose_config(M, N);
  if (ran != nullptr) *ran = config;
  alibi::Problem p{out, a, w, s_a, s_w, bias, M, N, K, stream};
  if (out_kind == 0) return alibi::sm90::fp8_scaled_mm_bf16(p, config);
  if (out_kind == 1) return alibi::sm90::fp8_scaled_mm_f16(p, config);
  return alibi::fail(alibi::kBadArgument, what, "out_kind must be 0 (bf16) or 1 (fp16)");
}

extern "C" int alibi_fp8_accumulate(float* acc, void const* a, void const* w, int M, int N, int K,
                                    int config, int* ran, cudaStream_t stream) {
  char const* what = "alibi_fp8_accumulate (sm90)";
  if (int st = alibi::check_shape(what, M, N, K, 16, 8)) return st;
  if (config < 0) config = alibi_choose_config(M, N);
  if (ran != nullptr) *ran = config;
  alibi::Problem p{acc, a, w, nullptr, nullptr, nullptr, M, N, K, stream};
  return alibi::sm90::fp8_accumulate(p, config);
}
