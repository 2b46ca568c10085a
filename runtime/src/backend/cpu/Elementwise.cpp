//===- Elementwise.cpp - pointwise kernels --------------------------------===//
//
// Activations are evaluated in double and rounded once, so they agree with
// PyTorch's float kernels to about one ulp.
//
//===----------------------------------------------------------------------===//
#include "CpuKernels.h"

#include <cmath>
#include <cstring>

using namespace mapp::rt;
using namespace mapp::rt::cpu;

namespace {

constexpr int64_t kGrain = 1 << 14;

template <typename Fn> void pointwise(const KernelArgs &a, Fn fn) {
  parFor(a, a.out[0].numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      fn(i);
  });
}

bool tanhApprox(const KernelArgs &a) {
  return a.attrs.getStr("approximate", "none") == "tanh";
}

constexpr double kSqrt2OverPi = 0.79788456080286535588; // sqrt(2/pi)
constexpr double kGeluKappa = 0.044715;

} // namespace

void cpu::add(const KernelArgs &a) {
  const float *x = a.in[0].f32(), *y = a.in[1].f32();
  float *o = a.out[0].f32();
  int64_t nb = a.in[1].numel();
  pointwise(a, [&](int64_t i) { o[i] = x[i] + y[i % nb]; });
}

void cpu::mul(const KernelArgs &a) {
  const float *x = a.in[0].f32(), *y = a.in[1].f32();
  float *o = a.out[0].f32();
  int64_t nb = a.in[1].numel();
  pointwise(a, [&](int64_t i) { o[i] = x[i] * y[i % nb]; });
}

void cpu::scale(const KernelArgs &a) {
  const float *x = a.in[0].f32();
  float *o = a.out[0].f32();
  // PyTorch multiplies a float tensor by a Python float in float precision.
  float f = static_cast<float>(a.attrs.getFloat("factor", 1));
  pointwise(a, [&](int64_t i) { o[i] = x[i] * f; });
}

void cpu::gelu(const KernelArgs &a) {
  const float *x = a.in[0].f32();
  float *o = a.out[0].f32();
  if (tanhApprox(a))
    pointwise(a, [&](int64_t i) {
      double v = x[i];
      double inner = kSqrt2OverPi * (v + kGeluKappa * v * v * v);
      o[i] = static_cast<float>(0.5 * v * (1 + std::tanh(inner)));
    });
  else
    pointwise(a, [&](int64_t i) {
      double v = x[i];
      o[i] = static_cast<float>(0.5 * v * (1 + std::erf(v * M_SQRT1_2)));
    });
}

void cpu::gelu_grad(const KernelArgs &a) {
  const float *dy = a.in[0].f32(), *x = a.in[1].f32();
  float *dx = a.out[0].f32();
  if (tanhApprox(a))
    pointwise(a, [&](int64_t i) {
      double v = x[i];
      double inner = kSqrt2OverPi * (v + kGeluKappa * v * v * v);
      double t = std::tanh(inner);
      double dinner = kSqrt2OverPi * (1 + 3 * kGeluKappa * v * v);
      double d = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * dinner;
      dx[i] = static_cast<float>(dy[i] * d);
    });
  else
    pointwise(a, [&](int64_t i) {
      double v = x[i];
      double cdf = 0.5 * (1 + std::erf(v * M_SQRT1_2));
      double pdf = std::exp(-0.5 * v * v) * 0.39894228040143267794;
      dx[i] = static_cast<float>(dy[i] * (cdf + v * pdf));
    });
}

void cpu::silu(const KernelArgs &a) {
  const float *x = a.in[0].f32();
  float *o = a.out[0].f32();
  pointwise(a, [&](int64_t i) {
    double v = x[i];
    o[i] = static_cast<float>(v / (1 + std::exp(-v)));
  });
}

void cpu::silu_grad(const KernelArgs &a) {
  const float *dy = a.in[0].f32(), *x = a.in[1].f32();
  float *dx = a.out[0].f32();
  pointwise(a, [&](int64_t i) {
    double v = x[i];
    double s = 1 / (1 + std::exp(-v));
    dx[i] = static_cast<float>(dy[i] * s * (1 + v * (1 - s)));
  });
}

void cpu::softcap(const KernelArgs &a) {
  const float *x = a.in[0].f32();
  float *o = a.out[0].f32();
  double cap = a.attrs.requireFloat("cap");
  pointwise(a, [&](int64_t i) {
    o[i] = static_cast<float>(cap * std::tanh(x[i] / cap));
  });
}

void cpu::softcap_grad(const KernelArgs &a) {
  const float *dy = a.in[0].f32(), *x = a.in[1].f32();
  float *dx = a.out[0].f32();
  double cap = a.attrs.requireFloat("cap");
  pointwise(a, [&](int64_t i) {
    double t = std::tanh(x[i] / cap);
    dx[i] = static_cast<float>(dy[i] * (1 - t * t));
  });
}

// dropout and dropout_grad apply the same mask: both scale kept elements.
void cpu::dropout(const KernelArgs &a) {
  const float *x = a.in[0].f32();
  float *o = a.out[0].f32();
  double p = a.attrs.getFloat("p", 0);
  if (p == 0) {
    if (o != x)
      std::memmove(o, x, a.out[0].numel() * sizeof(float));
    return;
  }
  uint64_t seed = static_cast<uint64_t>(a.attrs.getInt("seed", 0));
  uint64_t step = static_cast<uint64_t>(a.ctx.step);
  float keepScale = static_cast<float>(1.0 / (1.0 - p));
  pointwise(a, [&](int64_t i) {
    // u is k / 2^24, exact in float; compare against p in double.
    bool keep = dropoutUniform(seed, step, static_cast<uint64_t>(i)) >= p;
    o[i] = keep ? x[i] * keepScale : 0.0f;
  });
}

void cpu::dropout_grad(const KernelArgs &a) { dropout(a); }

void cpu::fill(const KernelArgs &a) {
  double v = a.attrs.getFloat("value", 0);
  if (a.attrs.has("loss_scale")) // the loss-gradient seed, scaled
    v *= a.ctx.lossScale;
  const Tensor &o = a.out[0];
  if (o.type.dtype == DType::I32) {
    int32_t *p = o.i32();
    int32_t iv = static_cast<int32_t>(v);
    for (int64_t i = 0; i < o.numel(); ++i)
      p[i] = iv;
    return;
  }
  float *p = o.f32();
  float fv = static_cast<float>(v);
  pointwise(a, [&](int64_t i) { p[i] = fv; });
}

void cpu::grad_accumulate(const KernelArgs &a) {
  const float *g = a.in[0].f32();
  float *buf = a.out[0].f32();
  pointwise(a, [&](int64_t i) { buf[i] += g[i]; });
}
