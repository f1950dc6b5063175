// sm80/sm89 int8 GEMM writing the raw int32 accumulator, same mainloop configurations.
#include "sm80_scaled_mm.h"

namespace alibi::sm80 {
int int8_accumulate(Problem const& p, int config, int* ran) {
  return run_config<AccumulatorEpilogue, int32_t>(config, p, "alibi_int8_accumulate (sm80)", ran);
}
}  // namespace alibi::sm80
