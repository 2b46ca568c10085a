//===- CudaCommon.h - shared helpers of the CUDA backend (internal) -*- C++ -*-===//
//
// Included by the .cu kernel files and by CudaBackend.cpp. Storage views:
// every float operand arrives as a Tensor whose dtype says how it is stored
// (F32, or BF16 when the backend keeps the value in bf16; see
// docs/cuda-backend.md), so kernels read and write through DView, which
// converts to and from float registers.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CUDA_COMMON_H
#define MAPP_RT_CUDA_COMMON_H

#include "mapp/rt/Error.h"
#include "mapp/rt/Kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace mapp::rt::cuda {

#define MAPP_CUDA_CHECK(expr)                                                  \
  do {                                                                         \
    cudaError_t err_ = (expr);                                                 \
    if (err_ != cudaSuccess)                                                   \
      ::mapp::rt::fail("CUDA error in ", #expr, " (", __FILE__, ":", __LINE__, \
                       "): ", cudaGetErrorString(err_));                       \
  } while (0)

/// After every launch: configuration errors surface here, not at the next sync.
#define MAPP_CUDA_LAUNCHED() MAPP_CUDA_CHECK(cudaGetLastError())

/// A float tensor in storage: fp32 or bf16 elements.
struct DView {
  void *p;
  int bf16;
  __device__ __forceinline__ float ld(int64_t i) const {
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i])
                : static_cast<const float *>(p)[i];
  }
  __device__ __forceinline__ void st(int64_t i, float v) const {
    if (bf16)
      static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16(v);
    else
      static_cast<float *>(p)[i] = v;
  }
};

inline DView view(const Tensor &t) {
  return {t.data, t.type.dtype == DType::BF16 ? 1 : 0};
}
inline bool isBf16(const Tensor &t) { return t.type.dtype == DType::BF16; }
/// Bytes of one stored element.
inline size_t storedSize(const Tensor &t) { return dtypeSize(t.type.dtype); }

/// Asynchronous error report from kernels (bad ids/targets): the first
/// writer wins; the backend turns it into an Error at the next synchronize.
struct DeviceError {
  int code;   // 0 none, else a KernelError
  int64_t a;  // offending value
  int64_t b;  // position
  int64_t c;  // the bound it broke
};
enum KernelError : int { kErrNone = 0, kErrEmbeddingId = 1, kErrEmbeddingGradId = 2,
                         kErrCeTarget = 3, kErrCeGradTarget = 4 };

__device__ __forceinline__ void reportError(DeviceError *e, int code, int64_t a,
                                            int64_t b, int64_t c) {
  if (atomicCAS(&e->code, 0, code) == 0) {
    e->a = a;
    e->b = b;
    e->c = c;
  }
}

inline int gridFor(int64_t n, int threads, int maxBlocks = 132 * 16) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1)
    b = 1;
  return static_cast<int>(b < maxBlocks ? b : maxBlocks);
}

__device__ __forceinline__ float warpSum(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warpMax(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

} // namespace mapp::rt::cuda

#endif
