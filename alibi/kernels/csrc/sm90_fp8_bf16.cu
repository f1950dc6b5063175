// sm90 e4m3 scaled GEMM (fp32 fast accumulation), bfloat16 output.
#include "sm90_scaled_mm.h"

namespace alibi::sm90 {
int fp8_scaled_mm_bf16(Problem const& p, int config) {
  return run_config<cutlass::float_e4m3_t, float, cutlass::bfloat16_t,
                    Scaled<cutlass::bfloat16_t>::Epilogue>(config, p,
                                                           "alibi_fp8_scaled_mm (sm90, bf16)");
}
}  // namespace alibi::sm90
