//===- Optim.cpp - global_norm, adamw, sgd --------------------------------===//
//
// Updates follow torch.optim.AdamW / torch.optim.SGD (single-tensor path)
// operation by operation in float, so parameters agree with PyTorch to
// rounding. Clipping scales the gradient as clip_grad_norm_ does.
//
//===----------------------------------------------------------------------===//
#include "CpuKernels.h"

#include <algorithm>
#include <cmath>

using namespace mapp::rt;
using namespace mapp::rt::cpu;

namespace {

/// 1 / the loss scale for an instr under loss scaling, else 1: gradients
/// arrive scaled (a power of two, so unscaling is exact).
float unscaleOf(const KernelArgs &a) {
  return a.attrs.has("loss_scale") ? static_cast<float>(1.0 / a.ctx.lossScale)
                                   : 1.0f;
}

/// min(1, max_norm / (norm + 1e-6)) when clipping is on, else 1. The norm
/// is the unscaled one (ctx.gradNorm is; a norm operand is unscaled here).
float clipCoef(const KernelArgs &a, int normOperand) {
  double maxNorm = a.attrs.getFloat("max_norm", a.ctx.maxGradNorm);
  if (!(maxNorm > 0))
    return 1.0f;
  double norm = a.numIn > normOperand
                    ? a.in[normOperand].f32()[0] * unscaleOf(a)
                    : a.ctx.gradNorm;
  if (std::isnan(norm))
    return 1.0f;
  // clip_grad_norm_ computes the coefficient on float tensors.
  float coef = static_cast<float>(maxNorm) / (static_cast<float>(norm) + 1e-6f);
  return std::min(coef, 1.0f);
}

/// ZeRO-1: the update touches only elements [zero_begin, zero_end) of the
/// parameter (this rank's part of its bucket slice); default all of it.
template <typename Fn>
void forUpdated(const KernelArgs &a, Fn &&fn) {
  int64_t n = a.in[0].numel();
  int64_t lo = std::clamp<int64_t>(a.attrs.getInt("zero_begin", 0), 0, n);
  int64_t hi = std::clamp<int64_t>(a.attrs.getInt("zero_end", n), lo, n);
  parFor(a, hi - lo, 1 << 14,
         [&](int64_t b, int64_t e) { fn(lo + b, lo + e); });
}

} // namespace

void cpu::global_norm(const KernelArgs &a) {
  double s = 0;
  for (int i = 0; i < a.numIn; ++i) {
    const float *g = a.in[i].f32();
    for (int64_t j = 0, n = a.in[i].numel(); j < n; ++j)
      s += static_cast<double>(g[j]) * g[j];
  }
  a.out[0].f32()[0] = static_cast<float>(std::sqrt(s));
}

void cpu::adamw(const KernelArgs &a) {
  float *p = a.in[0].f32(), *m = a.in[2].f32(), *v = a.in[3].f32();
  const float *g = a.in[1].f32();
  double lr = scheduledLr(a.attrs, a.ctx.step);
  double beta1 = a.attrs.getFloat("beta1", 0.9);
  double beta2 = a.attrs.getFloat("beta2", 0.999);
  double eps = a.attrs.getFloat("eps", 1e-8);
  double wd = a.attrs.getFloat("weight_decay", 0.01);
  float coef = clipCoef(a, 4), inv = unscaleOf(a);
  double t = static_cast<double>(a.ctx.step + 1);
  double bc1 = 1 - std::pow(beta1, t), bc2 = 1 - std::pow(beta2, t);
  float decay = static_cast<float>(1 - lr * wd);
  float b1 = static_cast<float>(beta1), b2 = static_cast<float>(beta2);
  float omb1 = static_cast<float>(1 - beta1),
        omb2 = static_cast<float>(1 - beta2);
  float stepSize = static_cast<float>(lr / bc1);
  float bc2Sqrt = static_cast<float>(std::sqrt(bc2));
  float epsF = static_cast<float>(eps);
  forUpdated(a, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float gi = inv == 1.0f ? g[i] : g[i] * inv;
      if (coef != 1.0f)
        gi *= coef;
      p[i] *= decay;
      m[i] = m[i] * b1 + gi * omb1;
      v[i] = v[i] * b2 + omb2 * gi * gi;
      float denom = std::sqrt(v[i]) / bc2Sqrt + epsF;
      p[i] += -stepSize * (m[i] / denom);
    }
  });
}

void cpu::sgd(const KernelArgs &a) {
  float *p = a.in[0].f32(), *buf = a.in[2].f32();
  const float *g = a.in[1].f32();
  float lr = static_cast<float>(scheduledLr(a.attrs, a.ctx.step));
  float mom = static_cast<float>(a.attrs.getFloat("momentum", 0));
  float damp = static_cast<float>(a.attrs.getFloat("dampening", 0));
  float wd = static_cast<float>(a.attrs.getFloat("weight_decay", 0));
  float coef = clipCoef(a, 3), inv = unscaleOf(a);
  // torch.optim.SGD starts the momentum buffer as the first gradient.
  bool first = a.ctx.step == 0;
  forUpdated(a, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float d = inv == 1.0f ? g[i] : g[i] * inv;
      if (coef != 1.0f)
        d *= coef;
      if (wd != 0)
        d += wd * p[i];
      if (mom != 0) {
        buf[i] = first ? d : buf[i] * mom + (1 - damp) * d;
        d = buf[i];
      }
      p[i] += -lr * d;
    }
  });
}
