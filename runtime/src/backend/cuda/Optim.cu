//===- Optim.cu - global_norm, adamw, sgd ---------------------------------===//
//
// Updates follow torch.optim.AdamW / SGD (single-tensor path) operation by
// operation in fp32, as the CPU backend does. Each update also rewrites the
// parameter's bf16 shadow (the copy the forward/backward GEMMs read), so no
// separate cast pass runs after the optimizer. The clipping coefficient is
// computed on the device when the plan passes the norm as an operand. The
// norm's squared sums are added with atomics, or under
// MAPP_CUDA_DETERMINISTIC=1 go through per-block partials. The
// element math lives in Optim.h, shared with the multi-tensor launches of
// OptimGroup.cu. ZeRO-1 (zero_begin/zero_end) updates only that range.
//
//===----------------------------------------------------------------------===//
#include "CudaBackend.h"
#include "Optim.h"

#include <algorithm>
#include <cmath>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

__global__ void adamwKernel(float *p, const float *g, float *m, float *v,
                            __nv_bfloat16 *shadow, int64_t n, AdamWStep h,
                            ClipSource c) {
  float coef = c.coef();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    adamwElement(p, g, m, v, shadow, i, h, coef);
}

__global__ void sgdKernel(float *p, const float *g, float *buf,
                          __nv_bfloat16 *shadow, int64_t n, SgdStep h,
                          ClipSource c) {
  float coef = c.coef();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    sgdElement(p, g, buf, shadow, i, h, coef);
}

/// Σ x² of this block's share of x: added to *out (atomics, the default)
/// or written to parts[blockIdx.x] (the order of every sum fixed by the
/// launch shape: deterministic).
__global__ void sumSq(DView x, int64_t n, double *parts, double *out) {
  double s = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    double v = x.ld(i);
    s += v * v;
  }
  s = blockReduce(s, Sum());
  if (threadIdx.x == 0) {
    if (parts)
      parts[blockIdx.x] = s;
    else
      atomicAdd(out, s);
  }
}

__global__ void sqrtToF32(const double *s, float *out) {
  *out = static_cast<float>(::sqrt(*s));
}

void checkF32(const KernelArgs &a, const char *k) {
  for (int i = 0; i < a.numIn; ++i)
    if (isBf16(a.in[i]))
      fail(k, ": operand ", i, " must be stored fp32");
}

} // namespace

void cuda::global_norm(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  if (isBf16(a.out[0]))
    fail("global_norm: the result must be stored fp32");
  // Per-block partials of every tensor, in operand order, then one
  // fixed-order sum (slot 1: the partials, then the double result).
  int maxBlocks = be.smCount() * 4;
  int64_t total = 0;
  for (int i = 0; i < a.numIn; ++i)
    if (int64_t n = a.in[i].numel())
      total += gridFor(n, 256, maxBlocks);
  const bool det = be.config().deterministic;
  double *parts = static_cast<double *>(be.scratch((total + 1) * sizeof(double), 1));
  double *acc = parts + total;
  if (!det)
    MAPP_CUDA_CHECK(cudaMemsetAsync(acc, 0, sizeof(double), be.stream()));
  int64_t at = 0;
  for (int i = 0; i < a.numIn; ++i) {
    int64_t n = a.in[i].numel();
    if (!n)
      continue;
    int blocks = gridFor(n, 256, maxBlocks);
    sumSq<<<blocks, 256, 0, be.stream()>>>(view(a.in[i]), n,
                                           det ? parts + at : nullptr, acc);
    MAPP_CUDA_LAUNCHED();
    at += blocks;
  }
  if (det)
    sumPartials(parts, total, acc, be.stream());
  sqrtToF32<<<1, 1, 0, be.stream()>>>(acc, a.out[0].f32());
  MAPP_CUDA_LAUNCHED();
}

ClipSource cuda::clipOf(const KernelArgs &a, int normOperand) {
  ClipSource c;
  c.maxNorm =
      static_cast<float>(a.attrs.getFloat("max_norm", a.ctx.maxGradNorm));
  c.hostNorm = static_cast<float>(a.ctx.gradNorm);
  c.normDev = a.numIn > normOperand ? a.in[normOperand].f32() : nullptr;
  return c;
}

void cuda::updateRange(const Attrs &attrs, int64_t n, int64_t &lo,
                       int64_t &hi) {
  lo = std::clamp<int64_t>(attrs.getInt("zero_begin", 0), 0, n);
  hi = std::clamp<int64_t>(attrs.getInt("zero_end", n), lo, n);
}

AdamWStep cuda::adamwStep(const Attrs &attrs, int64_t step) {
  double lr = scheduledLr(attrs, step);
  double beta1 = attrs.getFloat("beta1", 0.9);
  double beta2 = attrs.getFloat("beta2", 0.999);
  double eps = attrs.getFloat("eps", 1e-8);
  double wd = attrs.getFloat("weight_decay", 0.01);
  double t = static_cast<double>(step + 1);
  double bc1 = 1 - std::pow(beta1, t), bc2 = 1 - std::pow(beta2, t);
  AdamWStep h;
  h.decay = static_cast<float>(1 - lr * wd);
  h.b1 = static_cast<float>(beta1);
  h.b2 = static_cast<float>(beta2);
  h.omb1 = static_cast<float>(1 - beta1);
  h.omb2 = static_cast<float>(1 - beta2);
  h.stepSize = static_cast<float>(lr / bc1);
  h.bc2Sqrt = static_cast<float>(std::sqrt(bc2));
  h.eps = static_cast<float>(eps);
  return h;
}

SgdStep cuda::sgdStep(const Attrs &attrs, int64_t step) {
  SgdStep h;
  h.lr = static_cast<float>(scheduledLr(attrs, step));
  h.mom = static_cast<float>(attrs.getFloat("momentum", 0));
  h.damp = static_cast<float>(attrs.getFloat("dampening", 0));
  h.wd = static_cast<float>(attrs.getFloat("weight_decay", 0));
  h.first = step == 0;
  return h;
}

// ZeRO-1: only [zero_begin, zero_end) is updated; the pointers start there.
void cuda::adamw(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  checkF32(a, "adamw");
  int64_t lo, hi;
  updateRange(a.attrs, a.in[0].numel(), lo, hi);
  if (lo == hi)
    return;
  __nv_bfloat16 *shadow = be.shadowOf(a.in[0].data);
  adamwKernel<<<gridFor(hi - lo, 256), 256, 0, be.stream()>>>(
      a.in[0].f32() + lo, a.in[1].f32() + lo, a.in[2].f32() + lo,
      a.in[3].f32() + lo, shadow ? shadow + lo : nullptr, hi - lo,
      adamwStep(a.attrs, a.ctx.step), clipOf(a, 4));
  MAPP_CUDA_LAUNCHED();
}

void cuda::sgd(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  checkF32(a, "sgd");
  int64_t lo, hi;
  updateRange(a.attrs, a.in[0].numel(), lo, hi);
  if (lo == hi)
    return;
  __nv_bfloat16 *shadow = be.shadowOf(a.in[0].data);
  sgdKernel<<<gridFor(hi - lo, 256), 256, 0, be.stream()>>>(
      a.in[0].f32() + lo, a.in[1].f32() + lo, a.in[2].f32() + lo,
      shadow ? shadow + lo : nullptr, hi - lo, sgdStep(a.attrs, a.ctx.step),
      clipOf(a, 3));
  MAPP_CUDA_LAUNCHED();
}
