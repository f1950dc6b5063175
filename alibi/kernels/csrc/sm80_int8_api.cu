// C entry points of the sm80/sm89 int8 library (CUTLASS 2, mma.sync, sm80 epilogue visitor tree).
#include "common_api.h"
#include "problem.h"

namespace {
char const* const kConfigNames[] = {
    "tile 16x64x128, warp 16x64x64, 5 stages (M<=16)",
    "tile 32x64x128, warp 32x64x64, 5 stages (M<=32, or fallback)",
    "tile 64x128x128, warp 64x64x64, 5 stages (M<=64, or M<=128 with N<8192)",
    "tile 128x128x64, warp 64x64x64, 5 stages (otherwise)",
};
}

extern "C" int alibi_choose_config(int M, int N) {
  if (M <= 16) return 0;
  if (M <= 32) return 1;
  if (M <= 64 || (M <= 128 && N < 8192)) return 2;
  return 3;
}

extern "C" char const* alibi_config_name(int config) {
  return (config >= 0 && config < 4) ? kConfigNames[config] : "unknown";
}

extern "C" char const* alibi_path(void) {
  return "sm80: CUTLASS 2 GEMM (mma.sync int8, saturating int32), sm80 epilogue visitor tree";
}

extern "C" int alibi_int8_scaled_mm(int out_kind, void* out, void const* a, void const* w,
                                    float const* s_a, float const* s_w, float const* bias, int M,
                                    int N, int K, int config, int* ran, cudaStream_t stream) {
  char const* what = "alibi_int8_scaled_mm (sm80)";
  if (int st = alibi::check_shape(what, M, N, K, 16, 8)) return st;
  if (config < 0) config = alibi_choose_config(M, N);
  alibi::Problem p{out, a, w, s_a, s_w, bias, M, N, K, stream};
  if (out_kind == 0) return alibi::sm80::int8_scaled_mm_bf16(p, config, ran);
  if (out_kind == 1) return alibi::sm80::int8_scaled_mm_f16(p, config, ran);
  return alibi::fail(alibi::kBadArgument, what, "out_kind must be 0 (bf16) or 1 (fp16)");
}

extern "C" int alibi_int8_accumulate(int32_t* acc, void const* a, void const* w, int M, int N,
                                     int K, int config, int* ran, cudaStream_t stream) {
  char const* what = "alibi_int8_accumulate (sm80)";
  if (int st = alibi::check_shape(what, M, N, K, 16, 8)) return st;
  if (config < 0) config = alibi_choose_config(M, N);
  alibi::Problem p{acc, a, w, nullptr, nullptr, nullptr, M, N, K, stream};
  return alibi::sm80::int8_accumulate(p, config, ran);
}
