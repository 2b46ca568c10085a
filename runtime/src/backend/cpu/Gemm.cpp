//===- Gemm.cpp - embedding, linear, matmul -------------------------------===//
//
// Every matrix product goes through cblas_sgemm (OpenBLAS).
//
//===----------------------------------------------------------------------===//
#include "CpuKernels.h"
#include "mapp/rt/Error.h"

#include <cblas.h>
#include <cstring>

using namespace mapp::rt;
using namespace mapp::rt::cpu;

// With `group` the table is rank r's vocabulary slice [r·V, (r+1)·V): ids
// outside it give zero rows (embedding) or contribute nothing (grad).
void cpu::embedding(const KernelArgs &a) {
  const float *table = a.in[0].f32();
  const int32_t *ids = a.in[1].i32();
  float *y = a.out[0].f32();
  int64_t v = a.in[0].dim(0), h = a.in[0].dim(1), n = a.in[1].numel();
  auto [r, g] = groupPosition(a);
  int64_t lo = r * v;
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= v * g)
      fail("embedding: id ", ids[i], " at position ", i,
           " is outside the table's ", v * g, " rows");
  parFor(a, n, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int64_t row = ids[i] - lo;
      if (row >= 0 && row < v)
        std::memcpy(y + i * h, table + row * h, h * sizeof(float));
      else
        std::memset(y + i * h, 0, h * sizeof(float));
    }
  });
}

void cpu::embedding_grad(const KernelArgs &a) {
  const float *dy = a.in[0].f32();
  const int32_t *ids = a.in[1].i32();
  float *dt = a.out[0].f32();
  int64_t v = a.out[0].dim(0), h = a.out[0].dim(1), n = a.in[1].numel();
  auto [r, g] = groupPosition(a);
  int64_t lo = r * v;
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= v * g)
      fail("embedding_grad: id ", ids[i], " at position ", i,
           " is outside the table's ", v * g, " rows");
  std::memset(dt, 0, a.out[0].numel() * sizeof(float));
  // Columns are split across threads so each row's sum keeps id order:
  // deterministic and race-free.
  parFor(a, h, 16, [&](int64_t cb, int64_t ce) {
    for (int64_t i = 0; i < n; ++i) {
      int64_t row = ids[i] - lo;
      if (row < 0 || row >= v)
        continue;
      float *dst = dt + row * h;
      const float *src = dy + i * h;
      for (int64_t c = cb; c < ce; ++c)
        dst[c] += src[c];
    }
  });
}

void cpu::linear(const KernelArgs &a) {
  const float *x = a.in[0].f32(), *w = a.in[1].f32();
  float *y = a.out[0].f32();
  int64_t k = a.in[0].dim(-1), n = a.in[1].dim(0);
  int64_t m = a.out[0].numel() / (n ? n : 1);
  if (m == 0 || n == 0)
    return;
  if (k == 0)
    std::memset(y, 0, m * n * sizeof(float));
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w,
                k, 0.0f, y, n);
  if (a.numIn == 3) {
    const float *bias = a.in[2].f32();
    parFor(a, m, 64, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        for (int64_t c = 0; c < n; ++c)
          y[r * n + c] += bias[c];
    });
  }
}

void cpu::matmul(const KernelArgs &a) {
  const Tensor &A = a.in[0], &B = a.in[1];
  bool ta = a.attrs.flag("transpose_a"), tb = a.attrs.flag("transpose_b");
  int64_t m = ta ? A.dim(-1) : A.dim(-2), k = ta ? A.dim(-2) : A.dim(-1);
  int64_t n = tb ? B.dim(-2) : B.dim(-1);
  int64_t batch = 1;
  for (int i = 0; i + 2 < A.rank(); ++i)
    batch *= A.dim(i);
  float *c = a.out[0].f32();
  if (m == 0 || n == 0)
    return;
  if (k == 0) {
    std::memset(c, 0, a.out[0].numel() * sizeof(float));
    return;
  }
  CBLAS_TRANSPOSE opA = ta ? CblasTrans : CblasNoTrans;
  CBLAS_TRANSPOSE opB = tb ? CblasTrans : CblasNoTrans;
  int64_t lda = ta ? m : k, ldb = tb ? k : n;
  bool sharedB = B.rank() == 2;
  if (sharedB && !ta) {
    // [batch*M, K] x [K, N] in one call.
    cblas_sgemm(CblasRowMajor, opA, opB, batch * m, n, k, 1.0f, A.f32(), lda,
                B.f32(), ldb, 0.0f, c, n);
    return;
  }
  for (int64_t i = 0; i < batch; ++i)
    cblas_sgemm(CblasRowMajor, opA, opB, m, n, k, 1.0f, A.f32() + i * m * k,
                lda, B.f32() + (sharedB ? 0 : i * k * n), ldb, 0.0f,
                c + i * m * n, n);
}
