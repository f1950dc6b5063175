// sm80/sm89 int8 scaled GEMM, bfloat16 output (all mainloop configurations).
#include "sm80_scaled_mm.h"

namespace alibi::sm80 {
int int8_scaled_mm_bf16(Problem const& p, int config, int* ran) {
  return run_config<ScaledEpilogue, cutlass::bfloat16_t>(config, p,
                                                         "alibi_int8_scaled_mm (sm80, bf16)", ran);
}
}  // namespace alibi::sm80
