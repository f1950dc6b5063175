// sm90 int8 GEMM writing the raw int32 accumulator, with the same mainloop configurations as
// the scaled kernels (check 4 compares it with the exact int64 reference).
#include "sm90_scaled_mm.h"

namespace alibi::sm90 {
int int8_accumulate(Problem const& p, int config) {
  return run_config<int8_t, int32_t, int32_t, Accumulator<int32_t>::Epilogue>(
      config, p, "alibi_int8_accumulate (sm90)");
}
}  // namespace alibi::sm90
