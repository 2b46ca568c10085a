//===- Algebra.cpp - the tensor algebra's kernels (MappTensorOps.td) ------===//
//
// Math functions are evaluated in double and rounded once, as in
// Elementwise.cpp (within an ulp of PyTorch's float kernels); +, −, ×, ÷
// are single float operations, exactly as PyTorch does them.
//
//===----------------------------------------------------------------------===//
#include "CpuKernels.h"
#include "../../plan/AlgebraKernelChecks.h"
#include "mapp/rt/DType.h"
#include "mapp/rt/Error.h"

#include <cmath>

using namespace mapp::rt;
using namespace mapp::rt::cpu;

namespace {

constexpr int64_t kGrain = 1 << 14;

template <typename Fn> void unary(const KernelArgs &a, Fn fn) {
  const float *x = a.in[0].f32();
  float *o = a.out[0].f32();
  parFor(a, a.out[0].numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      o[i] = static_cast<float>(fn(static_cast<double>(x[i])));
  });
}

template <typename Fn> void binary(const KernelArgs &a, Fn fn) {
  const float *x = a.in[0].f32(), *y = a.in[1].f32();
  float *o = a.out[0].f32();
  parFor(a, a.out[0].numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      o[i] = fn(x[i], y[i]);
  });
}

double sign(double v) { return v > 0 ? 1.0 : v < 0 ? -1.0 : 0.0; }

/// Element i of a float or integer tensor as double.
double loadAny(const Tensor &t, int64_t i) {
  switch (t.type.dtype) {
  case DType::F32: return t.f32()[i];
  case DType::BF16: return bf16ToFloat(static_cast<const uint16_t *>(t.data)[i]);
  case DType::F16: return f16ToFloat(static_cast<const uint16_t *>(t.data)[i]);
  case DType::I32: return t.i32()[i];
  case DType::I64: return static_cast<double>(static_cast<const int64_t *>(t.data)[i]);
  }
  return 0;
}

void storeFloat(const Tensor &t, int64_t i, double v) {
  float f = static_cast<float>(v);
  switch (t.type.dtype) {
  case DType::BF16: static_cast<uint16_t *>(t.data)[i] = floatToBf16(f); break;
  case DType::F16: static_cast<uint16_t *>(t.data)[i] = floatToF16(f); break;
  default: t.f32()[i] = f; break;
  }
}

} // namespace

void cpu::neg(const KernelArgs &a) { unary(a, [](double v) { return -v; }); }
void cpu::abs(const KernelArgs &a) { unary(a, [](double v) { return std::fabs(v); }); }
void cpu::sign(const KernelArgs &a) { unary(a, [](double v) { return ::sign(v); }); }
void cpu::exp(const KernelArgs &a) { unary(a, [](double v) { return std::exp(v); }); }
void cpu::log(const KernelArgs &a) { unary(a, [](double v) { return std::log(v); }); }
void cpu::sqrt(const KernelArgs &a) { unary(a, [](double v) { return std::sqrt(v); }); }
void cpu::rsqrt(const KernelArgs &a) { unary(a, [](double v) { return 1.0 / std::sqrt(v); }); }
void cpu::tanh(const KernelArgs &a) { unary(a, [](double v) { return std::tanh(v); }); }
void cpu::sin(const KernelArgs &a) { unary(a, [](double v) { return std::sin(v); }); }
void cpu::cos(const KernelArgs &a) { unary(a, [](double v) { return std::cos(v); }); }
void cpu::sigmoid(const KernelArgs &a) {
  unary(a, [](double v) { return 1.0 / (1.0 + std::exp(-v)); });
}
void cpu::pow(const KernelArgs &a) {
  double e = a.attrs.getFloat("exponent", 1);
  unary(a, [e](double v) { return std::pow(v, e); });
}

void cpu::sub(const KernelArgs &a) { binary(a, [](float x, float y) { return x - y; }); }
void cpu::div(const KernelArgs &a) { binary(a, [](float x, float y) { return x / y; }); }
// NaN propagates as in torch.maximum / torch.minimum.
void cpu::maximum(const KernelArgs &a) {
  binary(a, [](float x, float y) { return x != x || y != y ? x + y : (x > y ? x : y); });
}
void cpu::minimum(const KernelArgs &a) {
  binary(a, [](float x, float y) { return x != x || y != y ? x + y : (x < y ? x : y); });
}
void cpu::lt(const KernelArgs &a) { binary(a, [](float x, float y) { return x < y ? 1.f : 0.f; }); }
void cpu::le(const KernelArgs &a) { binary(a, [](float x, float y) { return x <= y ? 1.f : 0.f; }); }
void cpu::gt(const KernelArgs &a) { binary(a, [](float x, float y) { return x > y ? 1.f : 0.f; }); }
void cpu::ge(const KernelArgs &a) { binary(a, [](float x, float y) { return x >= y ? 1.f : 0.f; }); }
void cpu::eq(const KernelArgs &a) { binary(a, [](float x, float y) { return x == y ? 1.f : 0.f; }); }
void cpu::ne(const KernelArgs &a) { binary(a, [](float x, float y) { return x != y ? 1.f : 0.f; }); }

void cpu::select(const KernelArgs &a) {
  const float *c = a.in[0].f32(), *t = a.in[1].f32(), *f = a.in[2].f32();
  float *o = a.out[0].f32();
  parFor(a, a.out[0].numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      o[i] = c[i] != 0.0f ? t[i] : f[i];
  });
}

void cpu::broadcast(const KernelArgs &a) {
  const Tensor &x = a.in[0], &y = a.out[0];
  int r = y.rank(), lead = r - x.rank();
  // Stride of each result dim in x (0 where repeated).
  std::vector<int64_t> stride(r, 0);
  int64_t s = 1;
  for (int d = r - 1; d >= lead; --d) {
    int64_t xd = x.type.shape[d - lead];
    stride[d] = xd == 1 ? 0 : s;
    s *= xd;
  }
  const float *src = x.f32();
  float *dst = y.f32();
  int64_t n = y.numel();
  parFor(a, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int64_t rest = i, off = 0;
      for (int d = r - 1; d >= 0; --d) {
        int64_t yd = y.type.shape[d];
        off += (rest % yd) * stride[d];
        rest /= yd;
      }
      dst[i] = src[off];
    }
  });
}

void cpu::constant(const KernelArgs &a) {
  const std::vector<double> &v = algebra::constantValues(a.attrs);
  float *o = a.out[0].f32();
  for (size_t i = 0; i < v.size(); ++i)
    o[i] = static_cast<float>(v[i]);
}

void cpu::cast(const KernelArgs &a) {
  const Tensor &x = a.in[0], &y = a.out[0];
  parFor(a, y.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      storeFloat(y, i, loadAny(x, i));
  });
}
