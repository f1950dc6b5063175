// Scaled GEMMs for Hopper (sm_90a), written against the CUTLASS 3 collective builders and an
// epilogue visitor tree (EVT):
//
//   out[m, n] = cast_RN( fma_rn( s_a[m], mul_rn( s_w[n], float(acc[m, n]) ), bias[n] ) )
//
// which is vLLM's CUTLASS order (scaled_mm_epilogues_c3x.hpp, ScaledEpilogue and
// ScaledEpilogueBias): the weight scale multiplies first, then the activation scale, and a bias
// joins in the same rounding as the activation scale (one fused multiply-add). vLLM gets that
// FMA from nvcc contracting `a * b + c`; here each step is an explicit round-to-nearest
// intrinsic (__fmul_rn cannot be contracted, __fmaf_rn is one rounding), so neither -fmad nor a
// CUTLASS functor's implementation can change the order.
//
// Without a bias the bias operand is a null pointer whose broadcast default is -0.0f, the exact
// identity of IEEE addition under round-to-nearest: fma computes p = s_a*t exactly, and
// p + (-0) = p for p != 0, (+0) + (-0) = +0, (-0) + (-0) = -0. So fma_rn(s_a, t, -0.0f) equals
// mul_rn(s_a, t) bit for bit, signed zeros and subnormals included, and one kernel serves both.
//
// The accumulator is int32 for int8 operands (integer MMA: exact, order-free) and fp32 for e4m3
// operands (vLLM's FP8 "fast accumulation" schedules: the rounding order is the tensor core's).
// A second family of kernels with the *same* mainloop configuration writes the raw accumulator
// instead of the scaled output, so the toolkit can compare it with an exact reference (check 4)
// and apply an epilogue model to exactly the value the epilogue saw.

#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/util/packed_stride.hpp"

#include "alibi_status.h"
#include "problem.h"
#include "rn_functors.h"

namespace alibi::sm90 {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

// One GEMM invocation: A row-major [M,K], B = W row-major [N,K] (i.e. column-major [K,N]),
// D row-major [M,N]. Scale and bias vectors are fp32; bias may be null.
using alibi::Problem;

constexpr auto RN = cutlass::FloatRoundStyle::round_to_nearest;

// The visitor tree for the scaled output. Children are visited left to right, then the node.
template <class TileShape, class ElementOut>
struct ScaledEpilogue {
  // s_w[n]: one value per output column, broadcast down the rows.
  using ScaleW = fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, _0>>;
  // s_a[m]: one value per output row, broadcast across the columns.
  using ScaleA = fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<_1, _0, _0>>;
  // bias[n] in fp32 (the caller widens a bf16/fp16 bias, which is exact); null -> -0.0f.
  using Bias = fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, _0>>;

  // t = RN32(s_w * float(acc)). The accumulator enters through a round-to-nearest conversion
  // (cvt.rn.f32.s32 for int32: exact while |acc| <= 2^24; identity for an fp32 accumulator).
  using WeightScaled =
      fusion::Sm90EVT<fusion::Sm90Compute<alibi::MulRn, float, float, RN>, ScaleW, fusion::Sm90AccFetch>;
  // out = cast_RN(fma_rn(s_a, t, bias)); bf16/fp16 conversion is round-to-nearest-even.
  using Tree = fusion::Sm90EVT<fusion::Sm90Compute<alibi::FmaRn, ElementOut, float, RN>, ScaleA,
                               WeightScaled, Bias>;

  static typename Tree::Arguments arguments(Problem const& p) {
    return {
        {p.s_a, 0.0f, {}},            // ScaleA
        {{p.s_w, 0.0f, {}}, {}, {}},  // WeightScaled = (ScaleW, acc, multiply)
        {p.bias, -0.0f, {}},          // Bias: a null pointer reads as -0.0f, the exact identity
        {}};                          // fma
  }
};

// The raw accumulator in its own type (int32 -> int32, fp32 -> fp32: no conversion at all).
template <class TileShape, class ElementAcc>
struct AccumulatorEpilogue {
  using Tree = fusion::Sm90EVT<
      fusion::Sm90Compute<cutlass::epilogue::thread::Identity, ElementAcc, ElementAcc, RN>,
      fusion::Sm90AccFetch>;
  static typename Tree::Arguments arguments(Problem const&) { return {{}, {}}; }
};

// Epilogues as one-parameter templates of the tile shape (what run_config takes).
template <class ElementOut>
struct Scaled {
  template <class TileShape>
  using Epilogue = ScaledEpilogue<TileShape, ElementOut>;
};
template <class ElementAcc>
struct Accumulator {
  template <class TileShape>
  using Epilogue = AccumulatorEpilogue<TileShape, ElementAcc>;
};

// ---------------------------------------------------------------------------------------------

template <class ElementAB, class ElementAcc, class ElementD, class Epilogue, class TileShape,
          class ClusterShape, class KernelSchedule>
struct Gemm {
  static constexpr int kAlignAB = 128 / cutlass::sizeof_bits<ElementAB>::value;  // 16-byte rows
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, float,
      void, cutlass::layout::RowMajor, kAlignD,  // no source operand C
      ElementD, cutlass::layout::RowMajor, kAlignD, cutlass::epilogue::TmaWarpSpecialized,
      typename Epilogue::Tree>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, cutlass::layout::RowMajor,
      kAlignAB, ElementAB, cutlass::layout::ColumnMajor, kAlignAB, ElementAcc, TileShape,
      ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                           CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static int run(Problem const& p, const char* what) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    StrideA stride_a = cutlass::make_cute_packed_stride(StrideA{}, make_shape(p.M, p.K, 1));
    StrideB stride_b = cutlass::make_cute_packed_stride(StrideB{}, make_shape(p.N, p.K, 1));
    StrideD stride_d = cutlass::make_cute_packed_stride(StrideD{}, make_shape(p.M, p.N, 1));

    cutlass::KernelHardwareInfo hw_info;
    hw_info.sm_count = alibi::sm_count();

    typename Device::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {p.M, p.N, p.K, 1},
        {static_cast<ElementAB const*>(p.a), stride_a, static_cast<ElementAB const*>(p.b),
         stride_b},
        {Epilogue::arguments(p), nullptr, stride_d, static_cast<ElementD*>(p.d), stride_d},
        hw_info};
    return launch<Device>(args, p.stream, what);
  }
};

// ---------------------------------------------------------------------------------------------
// Mainloop configurations, chosen by M (and N) the way vLLM chooses them on sm90
// (scaled_mm_c3x_sm90_int8_dispatch.cuh, scaled_mm_sm90_fp8_dispatch.cuh). A configuration
// cannot change an int32 accumulator (integer addition is associative); for fp8 it can, which
// is why the accumulator kernels take the same configuration as the scaled ones.

template <class ElementAB>
struct Schedules {  // int8
  using WarpSpecialized = cutlass::gemm::KernelTmaWarpSpecialized;
  using PingPong = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
};
template <>
struct Schedules<cutlass::float_e4m3_t> {  // e4m3: fast accumulation, as vLLM
  using WarpSpecialized = cutlass::gemm::KernelTmaWarpSpecializedFP8FastAccum;
  using PingPong = cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum;
};

// Configuration ids (see sm90_int8_api.cu / sm90_fp8_api.cu for the choice by shape):
//   0 64x64x256 1x8x1 WS, 1 64x128x256 1x4x1 WS   (int8 only: M <= 32)
//   2 int8: 64x64x256 1x1x1 WS; e4m3: 64x64x128 1x8x1 ping-pong   (M <= 64)
//   3 64x128x128 2x1x1 ping-pong (M <= 128),  4 128x128x128 2x1x1 ping-pong (M > 128)
template <class ElementAB, class ElementAcc, class ElementD, template <class> class Epi>
int run_config(int config, Problem const& p, const char* what) {
  // Every configuration fits the 227 KiB of shared memory of any sm_90 part.
  using S = Schedules<ElementAB>;
  constexpr bool kInt8 = std::is_same_v<ElementAB, int8_t>;
  if constexpr (kInt8) {
    if (config == 0) {
      using T = Shape<_64, _64, _256>;
      return Gemm<ElementAB, ElementAcc, ElementD, Epi<T>, T, Shape<_1, _8, _1>,
                  typename S::WarpSpecialized>::run(p, what);
    }
    if (config == 1) {
      using T = Shape<_64, _128, _256>;
      return Gemm<ElementAB, ElementAcc, ElementD, Epi<T>, T, Shape<_1, _4, _1>,
                  typename S::WarpSpecialized>::run(p, what);
    }
  }
  switch (config) {
    case 2: {
      if constexpr (kInt8) {
        using T = Shape<_64, _64, _256>;
        return Gemm<ElementAB, ElementAcc, ElementD, Epi<T>, T, Shape<_1, _1, _1>,
                    typename S::WarpSpecialized>::run(p, what);
      } else {
        using T = Shape<_64, _64, _128>;
        return Gemm<ElementAB, ElementAcc, ElementD, Epi<T>, T, Shape<_1, _8, _1>,
                    typename S::PingPong>::run(p, what);
      }
    }
    case 3: {
      using T = Shape<_64, _128, _128>;
      return Gemm<ElementAB, ElementAcc, ElementD, Epi<T>, T, Shape<_2, _1, _1>,
                  typename S::PingPong>::run(p, what);
    }
    case 4: {
      using T = Shape<_128, _128, _128>;
      return Gemm<ElementAB, ElementAcc, ElementD, Epi<T>, T, Shape<_2, _1, _1>,
                  typename S::PingPong>::run(p, what);
    }
    default:
      return fail(kBadArgument, what, "unknown configuration id");
  }
}

}  // namespace alibi::sm90
