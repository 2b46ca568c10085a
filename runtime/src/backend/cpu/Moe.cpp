//===- Moe.cpp - mixture-of-experts kernels (docs/moe.md) -----------------===//
//
// Router, slot assignment, permute/unpermute, grouped expert GEMMs and the
// two router losses, forward and backward. Shapes were checked at load time
// (KernelSpecs.cpp); these check the data: expert ids in [0, E), slots in
// [-1, rows), counts >= 0 with Σ counts <= rows. Sums run in double.
//
//===----------------------------------------------------------------------===//
#include "CpuKernels.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/MoeRouting.h"

#include <cblas.h>
#include <cmath>
#include <cstring>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cpu;

namespace {

void checkExperts(const char *kernel, const int32_t *ex, int64_t n,
                  int64_t experts) {
  for (int64_t i = 0; i < n; ++i)
    if (ex[i] < 0 || ex[i] >= experts)
      fail(kernel, ": expert id ", ex[i], " at choice ", i,
           " is outside [0, ", experts, ")");
}

void checkSlots(const char *kernel, const int32_t *slots, int64_t n,
                int64_t rows) {
  for (int64_t i = 0; i < n; ++i)
    if (slots[i] < -1 || slots[i] >= rows)
      fail(kernel, ": slot ", slots[i], " at choice ", i,
           " is outside [-1, ", rows, ") (rows of the permuted buffer)");
}

/// Row offsets of each expert's group; Error when a count is negative or
/// the groups do not fit in `rows`.
std::vector<int64_t> groupOffsets(const char *kernel, const Tensor &counts,
                                  int64_t rows) {
  int64_t e = counts.numel();
  std::vector<int64_t> off(e + 1, 0);
  for (int64_t i = 0; i < e; ++i) {
    if (counts.i32()[i] < 0)
      fail(kernel, ": count ", counts.i32()[i], " of expert ", i,
           " is negative");
    off[i + 1] = off[i] + counts.i32()[i];
  }
  if (off[e] > rows)
    fail(kernel, ": the experts' counts sum to ", off[e],
         " rows, more than the ", rows, " rows of x");
  return off;
}

/// Softmax of one row in double; returns logsumexp.
double softmaxRow(const float *x, int64_t n, double *s) {
  double mx = -INFINITY;
  for (int64_t c = 0; c < n; ++c)
    mx = std::max(mx, static_cast<double>(x[c]));
  double sum = 0;
  for (int64_t c = 0; c < n; ++c)
    sum += s[c] = std::exp(x[c] - mx);
  for (int64_t c = 0; c < n; ++c)
    s[c] /= sum;
  return mx + std::log(sum);
}

/// Choices per expert from experts [n, k]: the f_e numerator of aux loss.
std::vector<double> choiceCounts(const char *kernel, const Tensor &ex,
                                 int64_t experts) {
  checkExperts(kernel, ex.i32(), ex.numel(), experts);
  std::vector<double> c(experts, 0);
  for (int64_t i = 0; i < ex.numel(); ++i)
    c[ex.i32()[i]] += 1;
  return c;
}

} // namespace

void cpu::moe_router(const KernelArgs &a) {
  const float *l = a.in[0].f32();
  float *p = a.out[0].f32();
  int32_t *ex = a.out[1].i32();
  int64_t n = a.in[0].dim(0), e = a.in[0].dim(1), k = a.out[0].dim(1);
  parFor(a, n, 16, [&](int64_t b, int64_t end) {
    std::vector<int32_t> top(k);
    for (int64_t r = b; r < end; ++r) {
      topkRow(l + r * e, e, k, top.data());
      // softmax over the top-k logits = renormalized top-k of softmax.
      double mx = l[r * e + top[0]], sum = 0;
      for (int64_t j = 0; j < k; ++j)
        sum += std::exp(static_cast<double>(l[r * e + top[j]]) - mx);
      for (int64_t j = 0; j < k; ++j) {
        ex[r * k + j] = top[j];
        p[r * k + j] = static_cast<float>(
            std::exp(static_cast<double>(l[r * e + top[j]]) - mx) / sum);
      }
    }
  });
}

void cpu::moe_router_grad(const KernelArgs &a) {
  const float *dp = a.in[0].f32(), *p = a.in[1].f32();
  const int32_t *ex = a.in[2].i32();
  float *dl = a.out[0].f32();
  int64_t n = a.in[1].dim(0), k = a.in[1].dim(1), e = a.out[0].dim(1);
  checkExperts("moe_router_grad", ex, n * k, e);
  std::memset(dl, 0, a.out[0].numel() * sizeof(float));
  for (int64_t r = 0; r < n; ++r) {
    double dot = 0;
    for (int64_t j = 0; j < k; ++j)
      dot += static_cast<double>(dp[r * k + j]) * p[r * k + j];
    for (int64_t j = 0; j < k; ++j)
      dl[r * e + ex[r * k + j]] += static_cast<float>(
          p[r * k + j] * (static_cast<double>(dp[r * k + j]) - dot));
  }
}

void cpu::moe_assign(const KernelArgs &a) {
  int64_t e = a.out[1].numel();
  checkExperts("moe_assign", a.in[1].i32(), a.in[1].numel(), e);
  int64_t cap = a.attrs.getInt("capacity", 0);
  assignSlots(a.in[0].f32(), a.in[1].i32(), a.in[0].dim(0), a.in[0].dim(1), e,
              cap, a.out[0].i32(), a.out[1].i32());
}

void cpu::moe_permute(const KernelArgs &a) {
  const float *x = a.in[0].f32();
  const int32_t *slots = a.in[1].i32();
  float *y = a.out[0].f32();
  int64_t n = a.in[1].dim(0), k = a.in[1].dim(1), h = a.in[0].dim(1),
          rows = a.out[0].dim(0);
  checkSlots("moe_permute", slots, n * k, rows);
  std::memset(y, 0, a.out[0].numel() * sizeof(float));
  for (int64_t i = 0; i < n * k; ++i)
    if (slots[i] >= 0)
      std::memcpy(y + slots[i] * h, x + (i / k) * h, h * sizeof(float));
}

void cpu::moe_permute_grad(const KernelArgs &a) {
  const float *dy = a.in[0].f32();
  const int32_t *slots = a.in[1].i32();
  float *dx = a.out[0].f32();
  int64_t n = a.in[1].dim(0), k = a.in[1].dim(1), h = a.out[0].dim(1),
          rows = a.in[0].dim(0);
  checkSlots("moe_permute_grad", slots, n * k, rows);
  parFor(a, n, 16, [&](int64_t b, int64_t end) {
    for (int64_t r = b; r < end; ++r)
      for (int64_t c = 0; c < h; ++c) {
        double s = 0;
        for (int64_t j = 0; j < k; ++j)
          if (int32_t sl = slots[r * k + j]; sl >= 0)
            s += dy[sl * h + c];
        dx[r * h + c] = static_cast<float>(s);
      }
  });
}

void cpu::moe_unpermute(const KernelArgs &a) {
  const float *y = a.in[0].f32(), *p = a.in[1].f32();
  const int32_t *slots = a.in[2].i32();
  float *out = a.out[0].f32();
  int64_t n = a.in[2].dim(0), k = a.in[2].dim(1), h = a.in[0].dim(1),
          rows = a.in[0].dim(0);
  checkSlots("moe_unpermute", slots, n * k, rows);
  parFor(a, n, 16, [&](int64_t b, int64_t end) {
    for (int64_t r = b; r < end; ++r)
      for (int64_t c = 0; c < h; ++c) {
        double s = 0;
        for (int64_t j = 0; j < k; ++j)
          if (int32_t sl = slots[r * k + j]; sl >= 0)
            s += static_cast<double>(p[r * k + j]) * y[sl * h + c];
        out[r * h + c] = static_cast<float>(s);
      }
  });
}

void cpu::moe_unpermute_grad(const KernelArgs &a) {
  const float *dout = a.in[0].f32(), *y = a.in[1].f32(), *p = a.in[2].f32();
  const int32_t *slots = a.in[3].i32();
  float *dy = a.out[0].f32(), *dp = a.out[1].f32();
  int64_t n = a.in[3].dim(0), k = a.in[3].dim(1), h = a.in[1].dim(1),
          rows = a.in[1].dim(0);
  checkSlots("moe_unpermute_grad", slots, n * k, rows);
  std::memset(dy, 0, a.out[0].numel() * sizeof(float));
  // Each kept choice owns its slot, so rows are written by one choice only.
  parFor(a, n, 16, [&](int64_t b, int64_t end) {
    for (int64_t r = b; r < end; ++r)
      for (int64_t j = 0; j < k; ++j) {
        int32_t sl = slots[r * k + j];
        if (sl < 0) {
          dp[r * k + j] = 0;
          continue;
        }
        double dot = 0;
        float pj = p[r * k + j];
        for (int64_t c = 0; c < h; ++c) {
          dot += static_cast<double>(dout[r * h + c]) * y[sl * h + c];
          dy[sl * h + c] += pj * dout[r * h + c];
        }
        dp[r * k + j] = static_cast<float>(dot);
      }
  });
}

void cpu::moe_grouped_matmul(const KernelArgs &a) {
  const float *x = a.in[0].f32(), *w = a.in[1].f32();
  float *y = a.out[0].f32();
  bool tb = a.attrs.getInt("transpose_b", 0) != 0;
  int64_t rows = a.in[0].dim(0), kd = a.in[0].dim(1), nd = a.out[0].dim(1);
  std::vector<int64_t> off = groupOffsets("moe_grouped_matmul", a.in[2], rows);
  int64_t e = a.in[1].dim(0);
  for (int64_t g = 0; g < e; ++g) {
    int64_t m = off[g + 1] - off[g];
    if (m == 0)
      continue;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                m, nd, kd, 1.0f, x + off[g] * kd, kd, w + g * kd * nd,
                tb ? kd : nd, 0.0f, y + off[g] * nd, nd);
  }
  std::memset(y + off[e] * nd, 0, (rows - off[e]) * nd * sizeof(float));
}

void cpu::moe_grouped_matmul_wgrad(const KernelArgs &a) {
  const float *x = a.in[0].f32(), *dy = a.in[1].f32();
  float *dw = a.out[0].f32();
  int64_t rows = a.in[0].dim(0), kd = a.in[0].dim(1), nd = a.in[1].dim(1);
  std::vector<int64_t> off =
      groupOffsets("moe_grouped_matmul_wgrad", a.in[2], rows);
  int64_t e = a.out[0].dim(0);
  for (int64_t g = 0; g < e; ++g) {
    int64_t m = off[g + 1] - off[g];
    float *dst = dw + g * kd * nd;
    if (m == 0) {
      std::memset(dst, 0, kd * nd * sizeof(float));
      continue;
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kd, nd, m, 1.0f,
                x + off[g] * kd, kd, dy + off[g] * nd, nd, 0.0f, dst, nd);
  }
}

void cpu::moe_aux_loss(const KernelArgs &a) {
  const float *l = a.in[0].f32();
  int64_t n = a.in[0].dim(0), e = a.in[0].dim(1), k = a.in[1].dim(1);
  std::vector<double> c = choiceCounts("moe_aux_loss", a.in[1], e);
  std::vector<double> s(e), ps(e, 0);
  for (int64_t r = 0; r < n; ++r) {
    softmaxRow(l + r * e, e, s.data());
    for (int64_t i = 0; i < e; ++i)
      ps[i] += s[i];
  }
  double sum = 0;
  for (int64_t i = 0; i < e; ++i)
    sum += ps[i] * c[i];
  double coeff = a.attrs.getFloat("coeff", 0);
  a.out[0].f32()[0] = static_cast<float>(
      sum * coeff * static_cast<double>(e) / (double(n) * double(n) * double(k)));
}

void cpu::moe_aux_loss_grad(const KernelArgs &a) {
  double dloss = a.in[0].f32()[0];
  const float *l = a.in[1].f32();
  float *dl = a.out[0].f32();
  int64_t n = a.in[1].dim(0), e = a.in[1].dim(1), k = a.in[2].dim(1);
  std::vector<double> g = choiceCounts("moe_aux_loss_grad", a.in[2], e);
  double scale = dloss * a.attrs.getFloat("coeff", 0) * static_cast<double>(e) /
                 (double(n) * double(n) * double(k));
  for (double &v : g)
    v *= scale;
  parFor(a, n, 16, [&](int64_t b, int64_t end) {
    std::vector<double> s(e);
    for (int64_t r = b; r < end; ++r) {
      softmaxRow(l + r * e, e, s.data());
      double dot = 0;
      for (int64_t i = 0; i < e; ++i)
        dot += s[i] * g[i];
      for (int64_t i = 0; i < e; ++i)
        dl[r * e + i] = static_cast<float>(s[i] * (g[i] - dot));
    }
  });
}

void cpu::moe_z_loss(const KernelArgs &a) {
  const float *l = a.in[0].f32();
  int64_t n = a.in[0].dim(0), e = a.in[0].dim(1);
  std::vector<double> s(e);
  double sum = 0;
  for (int64_t r = 0; r < n; ++r) {
    double lse = softmaxRow(l + r * e, e, s.data());
    sum += lse * lse;
  }
  a.out[0].f32()[0] =
      static_cast<float>(a.attrs.getFloat("coeff", 0) * sum / double(n));
}

void cpu::moe_z_loss_grad(const KernelArgs &a) {
  double dloss = a.in[0].f32()[0];
  const float *l = a.in[1].f32();
  float *dl = a.out[0].f32();
  int64_t n = a.in[1].dim(0), e = a.in[1].dim(1);
  double scale = dloss * a.attrs.getFloat("coeff", 0) * 2.0 / double(n);
  parFor(a, n, 16, [&](int64_t b, int64_t end) {
    std::vector<double> s(e);
    for (int64_t r = b; r < end; ++r) {
      double lse = softmaxRow(l + r * e, e, s.data());
      for (int64_t i = 0; i < e; ++i)
        dl[r * e + i] = static_cast<float>(scale * lse * s[i]);
    }
  });
}
