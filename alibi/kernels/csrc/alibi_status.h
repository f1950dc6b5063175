// Status reporting and the one launch path shared by every CUTLASS kernel in this folder.
//
// The libraries are loaded with ctypes, so nothing may throw across the C boundary: each entry
// point returns an int status (0 = success) and leaves a message in a per-thread buffer that
// alibi_last_error() returns.

#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#include "cutlass/cutlass.h"

namespace alibi {

enum Status : int { kOk = 0, kCannotImplement = 1, kCudaError = 2, kBadArgument = 3 };

inline char* error_buffer() {
  static thread_local char buffer[512] = {0};
  return buffer;
}

inline int fail(int status, const char* what, const char* detail) {
  std::snprintf(error_buffer(), 512, "%s: %s", what, detail);
  return status;
}

// Runs a CUTLASS device GEMM (2.x or 3.x GemmUniversalAdapter) on `stream`. Workspace, when a
// kernel asks for one, is stream-ordered memory, so no host synchronisation is needed.
template <class Device>
int launch(typename Device::Arguments const& args, cudaStream_t stream, const char* what) {
  Device gemm;
  cutlass::Status st = gemm.can_implement(args);
  if (st != cutlass::Status::kSuccess) {
    return fail(kCannotImplement, what, cutlass::cutlassGetStatusString(st));
  }
  size_t workspace_size = Device::get_workspace_size(args);
  void* workspace = nullptr;
  if (workspace_size > 0) {
    cudaError_t e = cudaMallocAsync(&workspace, workspace_size, stream);
    if (e != cudaSuccess) return fail(kCudaError, what, cudaGetErrorString(e));
  }
  // initialize() then run(stream): the one sequence both the CUTLASS 2 and 3 adapters offer.
  st = gemm.initialize(args, workspace, stream);
  if (st == cutlass::Status::kSuccess) st = gemm.run(stream);
  if (workspace != nullptr) cudaFreeAsync(workspace, stream);
  if (st != cutlass::Status::kSuccess) {
    cudaError_t e = cudaGetLastError();
    return fail(kCudaError, what,
                e != cudaSuccess ? cudaGetErrorString(e) : cutlass::cutlassGetStatusString(st));
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return fail(kCudaError, what, cudaGetErrorString(e));
  return kOk;
}

// Multiprocessor count of the current device, queried once per device (persistent schedulers
// size their grid with it; querying on every call would cost a driver round trip).
inline int sm_count() {
  static int counts[64] = {0};
  int device = 0;
  cudaGetDevice(&device);
  if (device < 0 || device >= 64) return 0;
  if (counts[device] == 0) {
    cudaDeviceGetAttribute(&counts[device], cudaDevAttrMultiProcessorCount, device);
  }
  return counts[device];
}

}  // namespace alibi
