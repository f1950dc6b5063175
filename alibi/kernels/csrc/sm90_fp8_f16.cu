// sm90 e4m3 scaled GEMM (fp32 fast accumulation), float16 output.
#include "sm90_scaled_mm.h"

namespace alibi::sm90 {
int fp8_scaled_mm_f16(Problem const& p, int config) {
  return run_config<cutlass::float_e4m3_t, float, cutlass::half_t,
                    Scaled<cutlass::half_t>::Epilogue>(config, p,
                                                       "alibi_fp8_scaled_mm (sm90, fp16)");
}
}  // namespace alibi::sm90
