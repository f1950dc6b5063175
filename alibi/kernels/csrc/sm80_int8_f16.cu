// sm80/sm89 int8 scaled GEMM, float16 output (all mainloop configurations).
#include "sm80_scaled_mm.h"

namespace alibi::sm80 {
int int8_scaled_mm_f16(Problem const& p, int config, int* ran) {
  return run_config<ScaledEpilogue, cutlass::half_t>(config, p, "alibi_int8_scaled_mm (sm80, fp16)",
                                                     ran);
}
}  // namespace alibi::sm80
