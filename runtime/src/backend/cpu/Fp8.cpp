//===- Fp8.cpp - fp8 GEMMs with delayed scaling, emulated exactly ---------===//
//
// The recipe of mapp/rt/Fp8.h in fp32: each operand is scaled by its meta
// row's scale and rounded to its fp8 grid (saturating, nearest even), the
// rounded values are multiplied by cblas_sgemm (every fp8 product is exact
// in fp32, only the fp32 accumulation rounds) and the sums scaled by the
// two descales. The amaxes of the unscaled operands go into h[0] of their
// rows. This is what the CUDA backend's cuBLASLt fp8 GEMMs compute, up to
// the order of the fp32 accumulation.
//
//===----------------------------------------------------------------------===//
#include "CpuKernels.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Fp8.h"

#include <cblas.h>
#include <cstring>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cpu;

namespace {

struct Fp8Operand {
  std::vector<float> q; // the rounded values v·scale
  float descale;        // 1 / scale
};

/// Quantizes `t` with meta row `row` in format `fmt`; records its amax.
Fp8Operand quantize(const KernelArgs &a, const Tensor &t, float *meta,
                    int64_t rowLen, const char *rowKey, const char *fmtKey) {
  int64_t row = a.attrs.getInt(rowKey, -1);
  Fp8Format fmt = Fp8Format::E4M3;
  if (!parseFp8Format(a.attrs.getStr(fmtKey, ""), fmt) || row < 0 || row > 2)
    fail("fp8 GEMM: bad ", fmtKey, " / ", rowKey);
  float *r = meta + row * rowLen;
  const float *v = t.f32();
  int64_t n = t.numel();
  uint32_t amax = amaxBits(v, n);
  if (amax > absBits(r[1]))
    r[1] = fromBits(amax);
  float scale = r[0];
  Fp8Operand o{std::vector<float>(static_cast<size_t>(n)), 1.0f / scale};
  float *q = o.q.data();
  parFor(a, n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      q[i] = fp8Round(v[i] * scale, fmt);
  });
  return o;
}

int64_t metaRowLen(const Tensor &meta) { return meta.numel() / 3; }

} // namespace

void cpu::fp8_linear(const KernelArgs &a) {
  const Tensor &metaT = a.in[a.numIn - 1];
  float *meta = const_cast<float *>(metaT.f32());
  int64_t rl = metaRowLen(metaT);
  Fp8Operand x = quantize(a, a.in[0], meta, rl, "meta_a", "fp8_a");
  Fp8Operand w = quantize(a, a.in[1], meta, rl, "meta_b", "fp8_b");
  float *y = a.out[0].f32();
  int64_t k = a.in[0].dim(-1), n = a.in[1].dim(0);
  int64_t m = a.out[0].numel() / (n ? n : 1);
  if (m == 0 || n == 0)
    return;
  if (k == 0)
    std::memset(y, 0, m * n * sizeof(float));
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k,
                x.descale * w.descale, x.q.data(), k, w.q.data(), k, 0.0f, y,
                n);
  if (a.numIn == 4) {
    const float *bias = a.in[2].f32();
    parFor(a, m, 64, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        for (int64_t c = 0; c < n; ++c)
          y[r * n + c] += bias[c];
    });
  }
}

void cpu::fp8_matmul(const KernelArgs &a) {
  const Tensor &A = a.in[0], &B = a.in[1], &metaT = a.in[2];
  float *meta = const_cast<float *>(metaT.f32());
  int64_t rl = metaRowLen(metaT);
  Fp8Operand qa = quantize(a, A, meta, rl, "meta_a", "fp8_a");
  Fp8Operand qb = quantize(a, B, meta, rl, "meta_b", "fp8_b");
  bool ta = a.attrs.flag("transpose_a");
  // b is [K, N]; a is [..., M, K] (rows flattened) or, with transpose_a, [K, M].
  int64_t k = B.dim(0), n = B.dim(1);
  int64_t m = ta ? A.dim(1) : (k ? A.numel() / k : 0);
  float *c = a.out[0].f32();
  if (m == 0 || n == 0)
    return;
  if (k == 0) {
    std::memset(c, 0, a.out[0].numel() * sizeof(float));
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, CblasNoTrans, m,
              n, k, qa.descale * qb.descale, qa.q.data(), ta ? m : k,
              qb.q.data(), n, 0.0f, c, n);
}

void cpu::fp8_update(const KernelArgs &a) {
  float *meta = const_cast<float *>(a.in[0].f32());
  int64_t rl = metaRowLen(a.in[0]);
  int64_t h = a.attrs.getInt("history", 0), margin = a.attrs.getInt("margin", 0);
  const char *keys[3] = {"format_x", "format_w", "format_dy"};
  for (int r = 0; r < 3; ++r) {
    Fp8Format f = Fp8Format::E4M3;
    if (!parseFp8Format(a.attrs.getStr(keys[r], ""), f))
      fail("fp8_update: bad ", keys[r]);
    fp8UpdateRow(meta + r * rl, h, margin, f);
  }
}
