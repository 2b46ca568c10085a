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
#include <string>

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

// 8 consecutive elements (16 bytes of bf16, 32 of fp32) per access: the
// memory-bound kernels' fast path when sizes and pointers allow it.
template <typename T> __device__ __forceinline__ void load8(const void *p, int64_t i, float (&v)[8]);
template <> __device__ __forceinline__ void load8<__nv_bfloat16>(const void *p, int64_t i, float (&v)[8]) {
  uint4 u = *reinterpret_cast<const uint4 *>(static_cast<const __nv_bfloat16 *>(p) + i);
  const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float2 f = __bfloat1622float2(h[j]);
    v[2 * j] = f.x;
    v[2 * j + 1] = f.y;
  }
}
template <> __device__ __forceinline__ void load8<float>(const void *p, int64_t i, float (&v)[8]) {
  const float4 *f = reinterpret_cast<const float4 *>(static_cast<const float *>(p) + i);
  float4 x = f[0], y = f[1];
  v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w;
  v[4] = y.x; v[5] = y.y; v[6] = y.z; v[7] = y.w;
}
template <typename T> __device__ __forceinline__ void store8(void *p, int64_t i, const float (&v)[8]);
template <> __device__ __forceinline__ void store8<__nv_bfloat16>(void *p, int64_t i, const float (&v)[8]) {
  uint4 u;
  __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
#pragma unroll
  for (int j = 0; j < 4; ++j)
    h[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
  *reinterpret_cast<uint4 *>(static_cast<__nv_bfloat16 *>(p) + i) = u;
}
template <> __device__ __forceinline__ void store8<float>(void *p, int64_t i, const float (&v)[8]) {
  float4 *f = reinterpret_cast<float4 *>(static_cast<float *>(p) + i);
  f[0] = make_float4(v[0], v[1], v[2], v[3]);
  f[1] = make_float4(v[4], v[5], v[6], v[7]);
}

inline bool aligned16(const void *p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

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
  /// Elements i..i+7 (i a multiple of 8, p 16-byte aligned).
  __device__ __forceinline__ void ld8(int64_t i, float (&v)[8]) const {
    if (bf16)
      load8<__nv_bfloat16>(p, i, v);
    else
      load8<float>(p, i, v);
  }
  __device__ __forceinline__ void st8(int64_t i, const float (&v)[8]) const {
    if (bf16)
      store8<__nv_bfloat16>(p, i, v);
    else
      store8<float>(p, i, v);
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
                         kErrCeTarget = 3, kErrCeGradTarget = 4,
                         // Moe.cu (moeErrorText words them)
                         kErrMoeExpert = 5, kErrMoePermuteSlot = 6,
                         kErrMoeUnpermuteSlot = 7, kErrMoeStaleCounts = 8 };
/// The message of a Moe.cu DeviceError code ("" for other codes).
std::string moeErrorText(int code, int64_t a, int64_t b, int64_t c);

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

__device__ __forceinline__ double warpSumD(double v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Block-wide reduction of one value with a commutative `op` (blocks of up
/// to 1024 threads, a multiple of 32). Every thread gets the result. The
/// combining order is fixed by the block shape: deterministic.
template <typename T, typename Op> __device__ T blockReduce(T v, Op op) {
  __shared__ T part[32];
  for (int o = 16; o > 0; o >>= 1)
    v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0)
    part[w] = v;
  __syncthreads();
  T r = part[0];
  for (int i = 1; i < (int)(blockDim.x / 32); ++i)
    r = op(r, part[i]);
  return r;
}

struct Max {
  template <typename T> __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};
struct Sum {
  template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};

} // namespace mapp::rt::cuda

#endif
