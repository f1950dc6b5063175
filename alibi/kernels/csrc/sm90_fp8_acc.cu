// sm90 e4m3 GEMM writing the raw fp32 accumulator, with the same mainloop configurations (and
// therefore the same summation order) as the scaled kernels.
#include "sm90_scaled_mm.h"

namespace alibi::sm90 {
int fp8_accumulate(Problem const& p, int config) {
  return run_config<cutlass::float_e4m3_t, float, float, Accumulator<float>::Epilogue>(
      config, p, "alibi_fp8_accumulate (sm90)");
}
}  // namespace alibi::sm90
