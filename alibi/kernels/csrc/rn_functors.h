// The epilogue's two arithmetic steps as explicit round-to-nearest-even fp32 intrinsics.
//
// __fmul_rn is never contracted into an FMA (nvcc's -fmad only fuses plain `*` and `+`), and
// __fmaf_rn rounds once after an exact product. With these, the order of vLLM's CUTLASS epilogue
// (scale by s_w, then by s_a, bias inside one FMA) is fixed by the source, not by the compiler.
//
// CUTLASS compute visitors (sm80 VisitorCompute, sm90 Sm90Compute) call Fn<Array<float, N>> on
// register fragments; Sm90Compute also instantiates Fn<float> to look for an Arguments member,
// so the scalar form is defined too.

#pragma once

#include "cutlass/array.h"
#include "cutlass/cutlass.h"

namespace alibi {

template <class T>
struct MulRn {
  CUTLASS_HOST_DEVICE T operator()(T a, T b) const { return a * b; }
};

template <int N>
struct MulRn<cutlass::Array<float, N>> {
  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& a,
                                                     cutlass::Array<float, N> const& b) const {
    cutlass::Array<float, N> r;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) r[i] = __fmul_rn(a[i], b[i]);
    return r;
  }
};

template <class T>
struct FmaRn {
  CUTLASS_HOST_DEVICE T operator()(T a, T b, T c) const { return a * b + c; }
};

template <int N>
struct FmaRn<cutlass::Array<float, N>> {
  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& a,
                                                     cutlass::Array<float, N> const& b,
                                                     cutlass::Array<float, N> const& c) const {
    cutlass::Array<float, N> r;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) r[i] = __fmaf_rn(a[i], b[i], c[i]);
    return r;
  }
};

}  // namespace alibi
