// Scaled int8 GEMM for Ampere and Ada (sm_80, sm_86, sm_89; it also runs on later GPUs that keep
// the warp-level mma.sync instructions), written against the CUTLASS 2 API with an sm80
// epilogue visitor tree. The epilogue is the same program as the sm90 path
// (sm90_scaled_mm.h), step for step:
//
//   out[m, n] = cast_RN( fma_rn( s_a[m], mul_rn( s_w[n], float(acc[m, n]) ), bias[n] ) )
//
// with bias = -0.0f when absent (the exact identity of addition, see sm90_scaled_mm.h).
//
// The mainloop accumulates int8 products in int32 with mma.sync ... .satfinite
// (OpMultiplyAddSaturate, as vLLM's c2x kernels). Saturation can only act when a partial sum
// leaves the int32 range; below the int32 bound of science.md §2 (|acc| <= b*K < 2^31) it is
// never reached, and the accumulator is the exact integer sum.

#pragma once

#include <cuda_runtime.h>

#include <cstdint>

// Include order matters: the sm80 visitor headers use cutlass::gemm::GemmCoord and
// NumericArrayConverter without including them.
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm_coord.h"
#include "cutlass/numeric_conversion.h"
#include "cutlass/numeric_types.h"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/threadblock/threadblock_swizzle.h"
#include "cutlass/epilogue/threadblock/fusion/visitors.hpp"
#include "cutlass/gemm/kernel/default_gemm_universal_with_visitor.h"

#include "alibi_status.h"
#include "problem.h"
#include "rn_functors.h"

namespace alibi::sm80 {

using namespace cute;
namespace tb = cutlass::epilogue::threadblock;

using alibi::Problem;

constexpr auto RN = cutlass::FloatRoundStyle::round_to_nearest;
using StrideD = Stride<int64_t, _1, _0>;

// The scaled output. ThreadMap describes how the epilogue's threads walk the output tile.
template <class ThreadMap, class ElementOut>
struct ScaledEpilogue {
  using ScaleW = tb::VisitorRowBroadcast<ThreadMap, float, Stride<_0, _1, _0>>;
  using ScaleA = tb::VisitorColBroadcast<ThreadMap, float, Stride<_1, _0, _0>>;
  using Bias = tb::VisitorRowBroadcast<ThreadMap, float, Stride<_0, _1, _0>>;
  using WeightScaled =
      tb::Sm80EVT<tb::VisitorCompute<alibi::MulRn, float, float, RN>, ScaleW, tb::VisitorAccFetch>;
  using Scaled = tb::Sm80EVT<tb::VisitorCompute<alibi::FmaRn, ElementOut, float, RN>, ScaleA,
                             WeightScaled, Bias>;
  using Store = tb::VisitorAuxStore<ThreadMap, ElementOut, RN, StrideD>;
  using Tree = tb::Sm80EVT<Store, Scaled>;

  static typename Tree::Arguments arguments(Problem const& p) {
    return {{
                {p.s_a, 0.0f, {}},            // ScaleA
                {{p.s_w, 0.0f, {}}, {}, {}},  // WeightScaled = (ScaleW, acc, multiply)
                {p.bias, -0.0f, {}},          // Bias: null reads as -0.0f, the exact identity
                {}},                          // fma
            {static_cast<ElementOut*>(p.d), StrideD{p.N, _1{}, _0{}}}};
  }
};

// The raw int32 accumulator, stored without conversion.
template <class ThreadMap, class ElementAcc>
struct AccumulatorEpilogue {
  using Store = tb::VisitorAuxStore<ThreadMap, ElementAcc, RN, StrideD>;
  using Tree = tb::Sm80EVT<Store, tb::VisitorAccFetch>;
  static typename Tree::Arguments arguments(Problem const& p) {
    return {{}, {static_cast<ElementAcc*>(p.d), StrideD{p.N, _1{}, _0{}}}};
  }
};

template <template <class, class> class Epilogue, class ElementD, class TileShape, class WarpShape,
          int Stages>
struct Gemm {
  // The epilogue visits fp32-sized elements four at a time (16-byte accesses).
  using ThreadMap = tb::OutputTileThreadLayout<TileShape, WarpShape, float, 4, 1>;
  using Epi = Epilogue<ThreadMap, ElementD>;
  using Kernel = typename cutlass::gemm::kernel::DefaultGemmWithVisitor<
      int8_t, cutlass::layout::RowMajor, cutlass::ComplexTransform::kNone, 16,     // A [M,K]
      int8_t, cutlass::layout::ColumnMajor, cutlass::ComplexTransform::kNone, 16,  // W [N,K]
      float, cutlass::layout::RowMajor, 4,                                         // (no C)
      int32_t, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80, TileShape, WarpShape,
      cutlass::gemm::GemmShape<16, 8, 32>, typename Epi::Tree,
      cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>, Stages,
      cutlass::arch::OpMultiplyAddSaturate, 1>::GemmKernel;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static int run(Problem const& p, const char* what) {
    typename Device::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                    cutlass::gemm::GemmCoord{p.M, p.N, p.K},
                                    1,  // batch count
                                    Epi::arguments(p),
                                    p.a,
                                    p.b,
                                    nullptr,
                                    nullptr,
                                    0,
                                    0,
                                    0,
                                    0,
                                    p.K,  // lda: A row-major [M,K]
                                    p.K,  // ldb: W row-major [N,K] = column-major [K,N]
                                    p.N,
                                    p.N};
    return launch<Device>(args, p.stream, what);
  }
};

// Configuration ids, chosen by shape in sm80_int8_api.cu the way vLLM's sm80 dispatch does
// (scaled_mm_c2x_sm80_dispatch.cuh): 0 M<=16, 1 M<=32, 2 M<=64 (or M<=128 with N<8192), 3 else.

inline int max_shared_memory_optin() {
  int device = 0, bytes = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  return bytes;
}

// Runs configuration `config`; a configuration whose shared memory does not fit this GPU (the
// 64x128x128 and 128x128x64 tiles need 120 KiB and 80 KiB, more than sm_86/sm_89 parts allow
// for the former) falls back to the 32x64x128 tile, as vLLM's dispatch does. *ran reports
// which configuration actually ran.
template <template <class, class> class Epilogue, class ElementD>
int run_config(int config, Problem const& p, const char* what, int* ran) {
  using cutlass::gemm::GemmShape;
  using C0 = Gemm<Epilogue, ElementD, GemmShape<16, 64, 128>, GemmShape<16, 64, 64>, 5>;
  using C1 = Gemm<Epilogue, ElementD, GemmShape<32, 64, 128>, GemmShape<32, 64, 64>, 5>;
  using C2 = Gemm<Epilogue, ElementD, GemmShape<64, 128, 128>, GemmShape<64, 64, 64>, 5>;
  using C3 = Gemm<Epilogue, ElementD, GemmShape<128, 128, 64>, GemmShape<64, 64, 64>, 5>;
  int const smem = max_shared_memory_optin();
  auto fits = [smem](size_t bytes) { return bytes <= static_cast<size_t>(smem); };
  if (config == 2 && !fits(sizeof(typename C2::Kernel::SharedStorage))) config = 1;
  if (config == 3 && !fits(sizeof(typename C3::Kernel::SharedStorage))) config = 1;
  if (ran != nullptr) *ran = config;
  switch (config) {
    case 0: return C0::run(p, what);
    case 1: return C1::run(p, what);
    case 2: return C2::run(p, what);
    case 3: return C3::run(p, what);
    default: return fail(kBadArgument, what, "unknown configuration id");
  }
}

}  // namespace alibi::sm80
