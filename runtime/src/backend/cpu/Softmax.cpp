//===- Softmax.cpp - softmax and cross-entropy ----------------------------===//
#include "CpuKernels.h"
#include "mapp/rt/Error.h"

#include <cmath>
#include <limits>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cpu;

namespace {

/// log(sum(exp(x))) of one row, in double, stable for any magnitude.
double logSumExp(const float *x, int64_t n) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t c = 0; c < n; ++c)
    mx = std::max(mx, static_cast<double>(x[c]));
  if (std::isinf(mx))
    return mx;
  double s = 0;
  for (int64_t c = 0; c < n; ++c)
    s += std::exp(x[c] - mx);
  return mx + std::log(s);
}

void checkTargets(const char *kernel, const int32_t *t, int64_t rows, int64_t v,
                  int64_t ignore) {
  for (int64_t r = 0; r < rows; ++r)
    if (t[r] != ignore && (t[r] < 0 || t[r] >= v))
      fail(kernel, ": target ", t[r], " at row ", r, " is outside [0, ", v,
           ") and is not ignore_index ", ignore);
}

} // namespace

void cpu::softmax(const KernelArgs &a) {
  const float *x = a.in[0].f32();
  float *y = a.out[0].f32();
  int64_t n = a.in[0].dim(-1), rows = rowsOf(a.in[0]);
  parFor(a, rows, 8, [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      double lse = logSumExp(x + r * n, n);
      for (int64_t c = 0; c < n; ++c)
        y[r * n + c] = static_cast<float>(std::exp(x[r * n + c] - lse));
    }
  });
}

void cpu::softmax_grad(const KernelArgs &a) {
  const float *dy = a.in[0].f32(), *y = a.in[1].f32();
  float *dx = a.out[0].f32();
  int64_t n = a.in[1].dim(-1), rows = rowsOf(a.in[1]);
  parFor(a, rows, 8, [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      const float *dyr = dy + r * n, *yr = y + r * n;
      double dot = 0;
      for (int64_t c = 0; c < n; ++c)
        dot += static_cast<double>(dyr[c]) * yr[c];
      for (int64_t c = 0; c < n; ++c)
        dx[r * n + c] = static_cast<float>(yr[c] * (dyr[c] - dot));
    }
  });
}

void cpu::cross_entropy(const KernelArgs &a) {
  const float *x = a.in[0].f32();
  const int32_t *t = a.in[1].i32();
  int64_t v = a.in[0].dim(-1), rows = rowsOf(a.in[0]);
  int64_t ignore = a.attrs.getInt("ignore_index", -100);
  checkTargets("cross_entropy", t, rows, v, ignore);
  std::vector<double> rowLoss(rows, 0.0);
  parFor(a, rows, 8, [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r)
      if (t[r] != ignore)
        rowLoss[r] = logSumExp(x + r * v, v) - x[r * v + t[r]];
  });
  double sum = 0;
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r)
    if (t[r] != ignore) {
      sum += rowLoss[r];
      ++count;
    }
  // Like PyTorch, a batch with every row ignored has loss 0/0 = nan.
  a.out[0].f32()[0] = static_cast<float>(
      count ? sum / count : std::numeric_limits<double>::quiet_NaN());
}

void cpu::cross_entropy_grad(const KernelArgs &a) {
  float dloss = a.in[0].f32()[0];
  const float *x = a.in[1].f32();
  const int32_t *t = a.in[2].i32();
  float *dx = a.out[0].f32();
  int64_t v = a.in[1].dim(-1), rows = rowsOf(a.in[1]);
  int64_t ignore = a.attrs.getInt("ignore_index", -100);
  checkTargets("cross_entropy_grad", t, rows, v, ignore);
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r)
    count += t[r] != ignore;
  double coef = count ? static_cast<double>(dloss) / count : 0.0;
  parFor(a, rows, 8, [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      float *dr = dx + r * v;
      if (t[r] == ignore) {
        std::fill(dr, dr + v, 0.0f);
        continue;
      }
      const float *xr = x + r * v;
      double lse = logSumExp(xr, v);
      for (int64_t c = 0; c < v; ++c)
        dr[c] = static_cast<float>(
            coef * (std::exp(xr[c] - lse) - (c == t[r] ? 1.0 : 0.0)));
    }
  });
}
