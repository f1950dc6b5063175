// sm90 int8 scaled GEMM, bfloat16 output (all mainloop configurations).
#include "sm90_scaled_mm.h"

namespace alibi::sm90 {
int int8_scaled_mm_bf16(Problem const& p, int config) {
  return run_config<int8_t, int32_t, cutlass::bfloat16_t, Scaled<cutlass::bfloat16_t>::Epilogue>(
      config, p, "alibi_int8_scaled_mm (sm90, bf16)");
}
}  // namespace alibi::sm90
