//===- Norm.cpp - layer_norm, rms_norm and their gradients ----------------===//
//
// Row statistics and the parameter-gradient sums accumulate in double; each
// worker owns a slice of rows and its own partial dgamma/dbeta, merged in a
// fixed order so results do not depend on timing.
//
//===----------------------------------------------------------------------===//
#include "CpuKernels.h"

#include <cmath>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cpu;

namespace {

struct RowStats {
  double mean, rstd;
};

RowStats layerStats(const float *x, int64_t h, double eps) {
  double s = 0;
  for (int64_t c = 0; c < h; ++c)
    s += x[c];
  double mean = h ? s / h : 0;
  double v = 0;
  for (int64_t c = 0; c < h; ++c)
    v += (x[c] - mean) * (x[c] - mean);
  double var = h ? v / h : 0;
  return {mean, 1.0 / std::sqrt(var + eps)};
}

double rmsRstd(const float *x, int64_t h, double eps) {
  double s = 0;
  for (int64_t c = 0; c < h; ++c)
    s += static_cast<double>(x[c]) * x[c];
  return 1.0 / std::sqrt((h ? s / h : 0) + eps);
}

/// Splits rows into one part per worker and sums per-part partial vectors
/// (`width` doubles each, `count` of them) in part order into `out`.
template <typename RowFn>
void rowsWithPartials(const KernelArgs &a, int64_t rows, int64_t width,
                      int count, float *const *out, RowFn rowFn) {
  int parts = a.ctx.pool ? a.ctx.pool->size() : 1;
  if (rows < 4 * parts)
    parts = 1;
  std::vector<double> partial(static_cast<size_t>(parts) * count * width, 0.0);
  parFor(a, parts, 1, [&](int64_t pb, int64_t pe) {
    for (int64_t p = pb; p < pe; ++p) {
      double *acc = partial.data() + p * count * width;
      for (int64_t r = rows * p / parts; r < rows * (p + 1) / parts; ++r)
        rowFn(r, acc);
    }
  });
  for (int j = 0; j < count; ++j)
    for (int64_t c = 0; c < width; ++c) {
      double s = 0;
      for (int p = 0; p < parts; ++p)
        s += partial[(static_cast<size_t>(p) * count + j) * width + c];
      out[j][c] = static_cast<float>(s);
    }
}

} // namespace

void cpu::layer_norm(const KernelArgs &a) {
  const float *x = a.in[0].f32(), *g = a.in[1].f32(), *b = a.in[2].f32();
  float *y = a.out[0].f32();
  int64_t h = a.in[0].dim(-1), rows = rowsOf(a.in[0]);
  double eps = a.attrs.getFloat("eps", 1e-5);
  parFor(a, rows, 16, [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      const float *xr = x + r * h;
      RowStats st = layerStats(xr, h, eps);
      for (int64_t c = 0; c < h; ++c)
        y[r * h + c] =
            static_cast<float>((xr[c] - st.mean) * st.rstd * g[c] + b[c]);
    }
  });
}

void cpu::layer_norm_grad(const KernelArgs &a) {
  const float *dy = a.in[0].f32(), *x = a.in[1].f32(), *g = a.in[2].f32();
  float *dx = a.out[0].f32();
  int64_t h = a.in[1].dim(-1), rows = rowsOf(a.in[1]);
  double eps = a.attrs.getFloat("eps", 1e-5);
  float *outs[2] = {a.out[1].f32(), a.out[2].f32()};
  rowsWithPartials(a, rows, h, 2, outs, [&](int64_t r, double *acc) {
    const float *xr = x + r * h, *dyr = dy + r * h;
    RowStats st = layerStats(xr, h, eps);
    // dx = rstd * (gdy - mean(gdy) - xhat * mean(gdy * xhat))
    double sg = 0, sgx = 0;
    for (int64_t c = 0; c < h; ++c) {
      double xhat = (xr[c] - st.mean) * st.rstd;
      double gdy = static_cast<double>(dyr[c]) * g[c];
      sg += gdy;
      sgx += gdy * xhat;
      acc[c] += dyr[c] * xhat;
      acc[h + c] += dyr[c];
    }
    sg /= h;
    sgx /= h;
    for (int64_t c = 0; c < h; ++c) {
      double xhat = (xr[c] - st.mean) * st.rstd;
      double gdy = static_cast<double>(dyr[c]) * g[c];
      dx[r * h + c] = static_cast<float>(st.rstd * (gdy - sg - xhat * sgx));
    }
  });
}

void cpu::rms_norm(const KernelArgs &a) {
  const float *x = a.in[0].f32(), *g = a.in[1].f32();
  float *y = a.out[0].f32();
  int64_t h = a.in[0].dim(-1), rows = rowsOf(a.in[0]);
  double eps = a.attrs.getFloat("eps", 1e-5);
  // Gemma's gain is 1 + weight; the offset is added in double, once.
  double offset = a.attrs.getFloat("weight_offset", 0.0);
  parFor(a, rows, 16, [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      const float *xr = x + r * h;
      double rstd = rmsRstd(xr, h, eps);
      for (int64_t c = 0; c < h; ++c)
        y[r * h + c] = static_cast<float>(xr[c] * rstd * (g[c] + offset));
    }
  });
}

void cpu::rms_norm_grad(const KernelArgs &a) {
  const float *dy = a.in[0].f32(), *x = a.in[1].f32(), *g = a.in[2].f32();
  float *dx = a.out[0].f32();
  int64_t h = a.in[1].dim(-1), rows = rowsOf(a.in[1]);
  double eps = a.attrs.getFloat("eps", 1e-5);
  double offset = a.attrs.getFloat("weight_offset", 0.0);
  float *outs[1] = {a.out[1].f32()};
  rowsWithPartials(a, rows, h, 1, outs, [&](int64_t r, double *acc) {
    const float *xr = x + r * h, *dyr = dy + r * h;
    double rstd = rmsRstd(xr, h, eps);
    // y = x * rstd * g'; dx = rstd * g'dy - x * rstd^3 * mean(g'dy * x),
    // g' = g + offset (d g'/d g = 1).
    double sgx = 0;
    for (int64_t c = 0; c < h; ++c) {
      double gdy = static_cast<double>(dyr[c]) * (g[c] + offset);
      sgx += gdy * xr[c];
      acc[c] += dyr[c] * xr[c] * rstd;
    }
    sgx /= h;
    for (int64_t c = 0; c < h; ++c) {
      double gdy = static_cast<double>(dyr[c]) * (g[c] + offset);
      dx[r * h + c] =
          static_cast<float>(rstd * gdy - xr[c] * rstd * rstd * rstd * sgx);
    }
  });
}
