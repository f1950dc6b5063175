// The entry points every library shares: error text and CUTLASS version. Included by exactly
// one *_api.cu translation unit per library.

#pragma once

#include "alibi_status.h"
#include "cutlass/version.h"
#include "entry_points.h"

extern "C" char const* alibi_last_error(void) { return alibi::error_buffer(); }

extern "C" int alibi_cutlass_version(void) {
  return CUTLASS_MAJOR * 10000 + CUTLASS_MINOR * 100 + CUTLASS_PATCH;
}

namespace alibi {
// Validates the shape arguments common to every entry point; the Python side pads operands so
// these never fire in normal use (see alibi/kernels/cutlass.py).
inline int check_shape(char const* what, int M, int N, int K, int k_multiple, int n_multiple) {
  if (M < 1 || N < 1 || K < 1) return fail(kBadArgument, what, "M, N and K must be positive");
  if (K % k_multiple != 0) return fail(kBadArgument, what, "K must be a multiple of 16 (16-byte rows)");
  if (N % n_multiple != 0) return fail(kBadArgument, what, "N must be a multiple of 8 (16-byte output rows)");
  return kOk;
}
}  // namespace alibi
