//===- Optim.cu - global_norm, adamw, sgd ---------------------------------===//
//
// Updates follow torch.optim.AdamW / SGD (single-tensor path) operation by
// operation in fp32, as the CPU backend does. Each update also rewrites the
// parameter's bf16 shadow (the copy the forward/backward GEMMs read), so no
// separate cast pass runs after the optimizer. The clipping coefficient is
// computed on the device when the plan passes the norm as an operand.
//
//===----------------------------------------------------------------------===//
#include "CudaBackend.h"

#include <cmath>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

struct Clip {
  float maxNorm;       // <= 0: no clipping
  float hostNorm;      // used when normDev is null
  const float *normDev;
  __device__ __forceinline__ float coef() const {
    if (!(maxNorm > 0))
      return 1.0f;
    float n = normDev ? *normDev : hostNorm;
    if (isnan(n))
      return 1.0f;
    return fminf(maxNorm / (n + 1e-6f), 1.0f);
  }
};

struct AdamW {
  float decay, b1, b2, omb1, omb2, stepSize, bc2Sqrt, eps;
};

__global__ void adamwKernel(float *p, const float *g, float *m, float *v,
                            __nv_bfloat16 *shadow, int64_t n, AdamW h, Clip c) {
  float coef = c.coef();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
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
}

__global__ void sgdKernel(float *p, const float *g, float *buf,
                          __nv_bfloat16 *shadow, int64_t n, float lr, float mom,
                          float damp, float wd, bool first, Clip c) {
  float coef = c.coef();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float d = coef == 1.0f ? g[i] : g[i] * coef;
    if (wd != 0)
      d += wd * p[i];
    if (mom != 0) {
      float b = first ? d : buf[i] * mom + (1 - damp) * d;
      buf[i] = b;
      d = b;
    }
    float pi = p[i] + -lr * d;
    p[i] = pi;
    if (shadow)
      shadow[i] = __float2bfloat16(pi);
  }
}

__global__ void sumSq(DView x, int64_t n, double *out) {
  double s = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    double v = x.ld(i);
    s += v * v;
  }
  for (int o = 16; o > 0; o >>= 1)
    s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0)
    atomicAdd(out, s);
}

__global__ void sqrtToF32(const double *s, float *out) {
  *out = static_cast<float>(sqrt(*s));
}

Clip clipOf(const KernelArgs &a, int normOperand) {
  Clip c;
  c.maxNorm = static_cast<float>(a.attrs.getFloat("max_norm", a.ctx.maxGradNorm));
  c.hostNorm = static_cast<float>(a.ctx.gradNorm);
  c.normDev = a.numIn > normOperand ? a.in[normOperand].f32() : nullptr;
  return c;
}

void checkF32(const KernelArgs &a, const char *k) {
  for (int i = 0; i < a.numIn; ++i)
    if (isBf16(a.in[i]))
      fail(k, ": operand ", i, " must be stored fp32");
}

} // namespace

void cuda::global_norm(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  double *acc = static_cast<double *>(be.scratch(sizeof(double), 1));
  MAPP_CUDA_CHECK(cudaMemsetAsync(acc, 0, sizeof(double), be.stream()));
  for (int i = 0; i < a.numIn; ++i) {
    int64_t n = a.in[i].numel();
    if (!n)
      continue;
    sumSq<<<gridFor(n, 256, be.smCount() * 4), 256, 0, be.stream()>>>(
        view(a.in[i]), n, acc);
    MAPP_CUDA_LAUNCHED();
  }
  if (isBf16(a.out[0]))
    fail("global_norm: the result must be stored fp32");
  sqrtToF32<<<1, 1, 0, be.stream()>>>(acc, a.out[0].f32());
  MAPP_CUDA_LAUNCHED();
}

void cuda::adamw(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  checkF32(a, "adamw");
  double lr = scheduledLr(a.attrs, a.ctx.step);
  double beta1 = a.attrs.getFloat("beta1", 0.9);
  double beta2 = a.attrs.getFloat("beta2", 0.999);
  double eps = a.attrs.getFloat("eps", 1e-8);
  double wd = a.attrs.getFloat("weight_decay", 0.01);
  double t = static_cast<double>(a.ctx.step + 1);
  double bc1 = 1 - std::pow(beta1, t), bc2 = 1 - std::pow(beta2, t);
  AdamW h;
  h.decay = static_cast<float>(1 - lr * wd);
  h.b1 = static_cast<float>(beta1);
  h.b2 = static_cast<float>(beta2);
  h.omb1 = static_cast<float>(1 - beta1);
  h.omb2 = static_cast<float>(1 - beta2);
  h.stepSize = static_cast<float>(lr / bc1);
  h.bc2Sqrt = static_cast<float>(std::sqrt(bc2));
  h.eps = static_cast<float>(eps);
  int64_t n = a.in[0].numel();
  if (!n)
    return;
  adamwKernel<<<gridFor(n, 256), 256, 0, be.stream()>>>(
      a.in[0].f32(), a.in[1].f32(), a.in[2].f32(), a.in[3].f32(),
      be.shadowOf(a.in[0].data), n, h, clipOf(a, 4));
  MAPP_CUDA_LAUNCHED();
}

void cuda::sgd(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  checkF32(a, "sgd");
  float lr = static_cast<float>(scheduledLr(a.attrs, a.ctx.step));
  float mom = static_cast<float>(a.attrs.getFloat("momentum", 0));
  float damp = static_cast<float>(a.attrs.getFloat("dampening", 0));
  float wd = static_cast<float>(a.attrs.getFloat("weight_decay", 0));
  int64_t n = a.in[0].numel();
  if (!n)
    return;
  sgdKernel<<<gridFor(n, 256), 256, 0, be.stream()>>>(
      a.in[0].f32(), a.in[1].f32(), a.in[2].f32(), be.shadowOf(a.in[0].data), n,
      lr, mom, damp, wd, a.ctx.step == 0, clipOf(a, 3));
  MAPP_CUDA_LAUNCHED();
}
