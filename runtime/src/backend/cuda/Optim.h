//===- Optim.h - optimizer math shared by the CUDA kernels ------*- C++ -*-===//
//
// The per-element AdamW / SGD updates, the clipping coefficient and the
// per-step scalars, shared by the per-parameter kernels (Optim.cu) and the
// multi-tensor launches (OptimGroup.cu): both run this very code, so a
// grouped update is bit-identical to the per-parameter one.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CUDA_OPTIM_H
#define MAPP_RT_CUDA_OPTIM_H

#include "CudaCommon.h"
#include "mapp/rt/Kernels.h"

#include <cuda_bf16.h>

#include <cstdint>

namespace mapp::rt::cuda {

/// The gradient-clipping coefficient, computed on the device so that a norm
/// produced by an earlier kernel needs no host round trip.
struct ClipSource {
  float maxNorm;        // <= 0: no clipping
  float hostNorm;       // used when normDev is null
  const float *normDev; // the plan's norm operand, if any
  __device__ __forceinline__ float coef() const {
    if (!(maxNorm > 0))
      return 1.0f;
    float n = normDev ? *normDev : hostNorm;
    if (isnan(n))
      return 1.0f;
    return fminf(maxNorm / (n + 1e-6f), 1.0f);
  }
};

/// AdamW's per-step scalars (torch single-tensor formulas, in fp32).
struct AdamWStep {
  float decay, b1, b2, omb1, omb2, stepSize, bc2Sqrt, eps;
};

/// SGD's per-step scalars.
struct SgdStep {
  float lr, mom, damp, wd;
  bool first; // step 0: the momentum buffer starts as the gradient
};

/// Element i of one AdamW update.
__device__ __forceinline__ void adamwElement(float *p, const float *g, float *m,
                                             float *v, __nv_bfloat16 *shadow,
                                             int64_t i, const AdamWStep &h,
                                             float coef) {
  float gi = coef == 1.0f ? g[i] : g[i] * coef;
  float pi = p[i] * h.decay;
  float mi = m[i] * h.b1 + gi * h.omb1;
  float vi = v[i] * h.b2 + h.omb2 * gi * gi;
  float denom = sqrtf(vi) / h.bc2Sqrt + h.eps;
  pi += -h.stepSize * (mi / denom);
  p[i] = pi;
  m[i] = mi;
  v[i] = vi;
  if (shadow)
    shadow[i] = __float2bfloat16(pi);
}

/// Element i of one SGD update (buf: the momentum buffer).
__device__ __forceinline__ void sgdElement(float *p, const float *g, float *buf,
                                           __nv_bfloat16 *shadow, int64_t i,
                                           const SgdStep &h, float coef) {
  float d = coef == 1.0f ? g[i] : g[i] * coef;
  if (h.wd != 0)
    d += h.wd * p[i];
  if (h.mom != 0) {
    float b = h.first ? d : buf[i] * h.mom + (1 - h.damp) * d;
    buf[i] = b;
    d = b;
  }
  float pi = p[i] + -h.lr * d;
  p[i] = pi;
  if (shadow)
    shadow[i] = __float2bfloat16(pi);
}

/// The step scalars of an adamw / sgd instr at `step` (its lr schedule).
AdamWStep adamwStep(const Attrs &attrs, int64_t step);
SgdStep sgdStep(const Attrs &attrs, int64_t step);

/// The clip source of an optimizer call: the norm operand `normOperand`
/// when the plan passes one, else the executor's norm.
ClipSource clipOf(const KernelArgs &a, int normOperand);

/// ZeRO-1: the elements [lo, hi) of an n-element parameter this rank
/// updates (`zero_begin` / `zero_end`, clamped as the CPU backend does).
void updateRange(const Attrs &attrs, int64_t n, int64_t &lo, int64_t &hi);

} // namespace mapp::rt::cuda

#endif
