// sm90 int8 scaled GEMM, float16 output (all mainloop configurations).
#include "sm90_scaled_mm.h"

namespace alibi::sm90 {
int int8_scaled_mm_f16(Problem const& p, int config) {
  return run_config<int8_t, int32_t, cutlass::half_t, Scaled<cutlass::half_t>::Epilogue>(
      config, p, "alibi_int8_scaled_mm (sm90, fp16)");
}
}  // namespace alibi::sm90
