//===- Attention.cpp - fused multi-head / grouped-query attention ---------===//
//
// One (batch, head) pair per work item: S = scale·Q·Kᵀ (+ causal mask),
// P = softmax(S), O = P·V, all through cblas_sgemm on strided views of the
// [B,T,H] operands (head h = columns h·D..h·D+D−1, leading dimension H).
// The gradient recomputes P rather than storing it. cached_attention is
// the KV-cache form generation decodes with.
//
//===----------------------------------------------------------------------===//
#include "CpuKernels.h"
#include "mapp/rt/Error.h"

#include <algorithm>
#include <cblas.h>
#include <cmath>
#include <limits>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cpu;

namespace {

struct Dims {
  int64_t b, t, h, heads, d;
  int64_t hk, kvHeads, group; // k/v width, key/value heads, q heads per kv head
  float scale;
  bool causal, rotary;
  double base;
  int64_t rotDim;  // rotated columns of each head (GPT-NeoX: a fraction of D)
  double softcap;  // 0: off; else scores become softcap·tanh(s/softcap)
  int64_t window;  // 0: off; else query i sees keys j with i − j < window
  double dropP;    // attention dropout probability (0: off)
  uint64_t dropSeed, step;
  /// Dropout's factor for P[b, head, i, j]: 0 or 1/(1 − p) (the mask of
  /// docs/semantics.md over the element index ((b·heads + head)·T + i)·T + j).
  float dropFactor(int64_t b, int64_t head, int64_t i, int64_t j) const {
    uint64_t n = static_cast<uint64_t>(((b * heads + head) * t + i) * t + j);
    return dropoutUniform(dropSeed, step, n) >= dropP
               ? static_cast<float>(1.0 / (1.0 - dropP))
               : 0.0f;
  }
  /// s[T,T] of (b, head) times the dropout factors.
  void dropRows(float *s, int64_t b, int64_t head) const {
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j < t; ++j)
        s[i * t + j] *= dropFactor(b, head, i, j);
  }
  /// Keys [lo, hi) query row i (at absolute position `pos`) may see among
  /// `n` columns.
  std::pair<int64_t, int64_t> visible(int64_t pos, int64_t n) const {
    int64_t hi = causal ? std::min(pos + 1, n) : n;
    int64_t lo = window ? std::max<int64_t>(0, pos - window + 1) : 0;
    return {std::min(lo, hi), hi};
  }
};

// Grouped-query attention: k and v are [B,T,Hk] with Hk = kvHeads·D; query
// head i reads key/value head i / (heads / kvHeads), as in Megatron and HF.
Dims dimsOf(const KernelArgs &a, const Tensor &q, const Tensor &k) {
  Dims d;
  d.b = q.dim(0);
  d.t = q.dim(1);
  d.h = q.dim(2);
  d.heads = a.attrs.getInt("heads", 1);
  d.d = d.h / d.heads;
  d.hk = k.dim(2);
  d.kvHeads = d.d ? d.hk / d.d : 1;
  d.group = d.kvHeads ? d.heads / d.kvHeads : 1;
  d.scale = static_cast<float>(a.attrs.getFloat("scale", 1.0));
  d.causal = a.attrs.flag("causal");
  d.rotary = a.attrs.flag("rotary");
  d.base = a.attrs.getFloat("rotary_base", 10000.0);
  d.rotDim = a.attrs.getInt("rotary_dim", d.d);
  d.softcap = a.attrs.getFloat("softcap", 0.0);
  d.window = a.attrs.getInt("sliding_window", 0);
  d.dropP = a.attrs.getFloat("dropout", 0.0);
  d.dropSeed = static_cast<uint64_t>(a.attrs.getInt("dropout_seed", 0));
  d.step = static_cast<uint64_t>(a.ctx.step);
  return d;
}

/// cos/sin tables [T, R/2] of the rotary angles t·base^(−2i/R), R the
/// rotated columns (R = D but for partial rotary).
struct Rotary {
  std::vector<double> cos, sin;
  int64_t rotDim = 0;
  Rotary(const Dims &d) {
    if (!d.rotary)
      return;
    rotDim = d.rotDim;
    int64_t half = rotDim / 2;
    cos.resize(d.t * half);
    sin.resize(d.t * half);
    for (int64_t t = 0; t < d.t; ++t)
      for (int64_t i = 0; i < half; ++i) {
        double theta = std::pow(d.base, -2.0 * i / rotDim);
        cos[t * half + i] = std::cos(t * theta);
        sin[t * half + i] = std::sin(t * theta);
      }
  }
  /// dst[T,D] = rotate(src rows with leading dim ld); inverse = transpose.
  void apply(const float *src, int64_t ld, float *dst, int64_t T, int64_t D,
             bool inverse) const {
    applyAt(src, ld, dst, D, T, D, inverse, 0);
  }
  /// Rows at positions first..first+T−1 into dst rows with leading dim ldd;
  /// columns past rotDim are copied unchanged.
  void applyAt(const float *src, int64_t ld, float *dst, int64_t ldd,
               int64_t T, int64_t D, bool inverse, int64_t first) const {
    int64_t half = rotDim / 2;
    double sgn = inverse ? -1.0 : 1.0;
    for (int64_t r = 0; r < T; ++r) {
      for (int64_t c = rotDim; c < D; ++c)
        dst[r * ldd + c] = src[r * ld + c];
      for (int64_t i = 0; i < half; ++i) {
        int64_t t = first + r;
        double c = cos[t * half + i], s = sgn * sin[t * half + i];
        double x0 = src[r * ld + i], x1 = src[r * ld + i + half];
        dst[r * ldd + i] = static_cast<float>(x0 * c - x1 * s);
        dst[r * ldd + i + half] = static_cast<float>(x1 * c + x0 * s);
      }
    }
  }
};

/// A row of n scores becomes softmax probabilities over [lo, hi) (masked
/// entries exactly 0). With a softcap the scores are capped first, and
/// tanh(s/cap) is kept in `tanhRow` (when given) for the gradient.
void softmaxRow(float *row, int64_t n, std::pair<int64_t, int64_t> seen,
                double softcap, float *tanhRow) {
  auto [lo, hi] = seen;
  if (softcap > 0)
    for (int64_t j = lo; j < hi; ++j) {
      double t = std::tanh(row[j] / softcap);
      if (tanhRow)
        tanhRow[j] = static_cast<float>(t);
      row[j] = static_cast<float>(softcap * t);
    }
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = lo; j < hi; ++j)
    mx = std::max(mx, static_cast<double>(row[j]));
  double sum = 0;
  for (int64_t j = lo; j < hi; ++j)
    sum += std::exp(row[j] - mx);
  for (int64_t j = 0; j < n; ++j)
    row[j] = j >= lo && j < hi
                 ? static_cast<float>(std::exp(row[j] - mx) / sum)
                 : 0.0f;
}

void softmaxRows(const Dims &d, float *s, float *tanhS) {
  for (int64_t i = 0; i < d.t; ++i)
    softmaxRow(s + i * d.t, d.t, d.visible(i, d.t), d.softcap,
               tanhS ? tanhS + i * d.t : nullptr);
}

/// Runs fn(bh, scratch) for every (batch, head) on the pool. OpenBLAS is held
/// to one thread meanwhile so the head-parallel GEMMs do not oversubscribe.
template <typename Fn>
void forEachHead(const KernelArgs &a, const Dims &d, size_t scratchFloats,
                 Fn fn, bool kvHeads = false) {
  int threads = a.ctx.pool ? a.ctx.pool->size() : 1;
  int64_t items = d.b * (kvHeads ? d.kvHeads : d.heads);
  bool parallel = threads > 1 && items > 1;
  if (parallel)
    openblas_set_num_threads(1);
  try {
    parFor(a, items, 1, [&](int64_t b, int64_t e) {
      std::vector<float> scratch(scratchFloats);
      for (int64_t bh = b; bh < e; ++bh)
        fn(bh, scratch.data());
    });
  } catch (...) {
    if (parallel)
      openblas_set_num_threads(threads);
    throw;
  }
  if (parallel)
    openblas_set_num_threads(threads);
}

/// Q/K operand of one head: either the strided original or a rotated copy.
struct HeadView {
  const float *p;
  int64_t ld;
};

HeadView headQK(const Dims &d, const Rotary &rot, const float *base,
                float *rotBuf, int64_t ld) {
  if (!d.rotary)
    return {base, ld};
  rot.apply(base, ld, rotBuf, d.t, d.d, /*inverse=*/false);
  return {rotBuf, d.d};
}

/// P = softmax(mask(softcap(scale·Q·Kᵀ))) into s[T,T] (and tanh of the
/// capped scores into tanhS, for the gradient).
void probs(const Dims &d, HeadView q, HeadView k, float *s,
           float *tanhS = nullptr) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d.t, d.t, d.d, d.scale,
              q.p, q.ld, k.p, k.ld, 0.0f, s, d.t);
  softmaxRows(d, s, tanhS);
}

} // namespace

void cpu::attention(const KernelArgs &a) {
  Dims d = dimsOf(a, a.in[0], a.in[1]);
  Rotary rot(d);
  const float *q = a.in[0].f32(), *k = a.in[1].f32(), *v = a.in[2].f32();
  float *o = a.out[0].f32();
  if (d.t == 0 || d.d == 0)
    return;
  size_t tt = d.t * d.t, td = d.t * d.d;
  forEachHead(a, d, tt + 2 * td, [&](int64_t bh, float *scratch) {
    int64_t off = (bh / d.heads) * d.t * d.h + (bh % d.heads) * d.d;
    int64_t koff = (bh / d.heads) * d.t * d.hk + (bh % d.heads) / d.group * d.d;
    float *s = scratch, *qr = scratch + tt, *kr = qr + td;
    HeadView qv = headQK(d, rot, q + off, qr, d.h),
             kv = headQK(d, rot, k + koff, kr, d.hk);
    probs(d, qv, kv, s);
    if (d.dropP > 0)
      d.dropRows(s, bh / d.heads, bh % d.heads);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d.t, d.d, d.t, 1.0f,
                s, d.t, v + koff, d.hk, 0.0f, o + off, d.h);
  });
}

// One work item per (batch, key/value head): dK and dV sum over the query
// heads of the group, so no two items write the same columns.
void cpu::attention_grad(const KernelArgs &a) {
  Dims d = dimsOf(a, a.in[1], a.in[2]);
  Rotary rot(d);
  const float *dout = a.in[0].f32(), *q = a.in[1].f32(), *k = a.in[2].f32(),
              *v = a.in[3].f32();
  float *dq = a.out[0].f32(), *dk = a.out[1].f32(), *dv = a.out[2].f32();
  if (d.t == 0 || d.d == 0)
    return;
  size_t tt = d.t * d.t, td = d.t * d.d;
  auto unrotate = [&](const float *src, float *dst, int64_t ld, float *tmp) {
    rot.apply(src, d.d, tmp, d.t, d.d, /*inverse=*/true);
    for (int64_t t = 0; t < d.t; ++t)
      std::copy(tmp + t * d.d, tmp + (t + 1) * d.d, dst + t * ld);
  };
  size_t capped = d.softcap > 0 ? tt : 0, dropped = d.dropP > 0 ? tt : 0;
  forEachHead(a, d, 2 * tt + capped + dropped + 5 * td,
              [&](int64_t bk, float *scratch) {
    int64_t b = bk / d.kvHeads, kvh = bk % d.kvHeads;
    int64_t koff = b * d.t * d.hk + kvh * d.d;
    float *tanhS = capped ? scratch + 2 * tt : nullptr;
    float *pd = dropped ? scratch + 2 * tt + capped : nullptr;
    float *p = scratch, *dp = p + tt, *qr = dp + tt + capped + dropped,
          *kr = qr + td,
          *dqr = kr + td, *dkr = dqr + td, *tmp = dkr + td;
    HeadView kv = headQK(d, rot, k + koff, kr, d.hk);
    float *dkDst = d.rotary ? dkr : dk + koff;
    int64_t ldK = d.rotary ? d.d : d.hk;
    for (int64_t g = 0; g < d.group; ++g) {
      int64_t head = kvh * d.group + g;
      int64_t off = b * d.t * d.h + head * d.d;
      float beta = g == 0 ? 0.0f : 1.0f;
      HeadView qv = headQK(d, rot, q + off, qr, d.h);
      probs(d, qv, kv, p, tanhS);
      // With dropout O = D(P)·V: dV uses the dropped D(P), and the gradient
      // reaching P is D applied to dO·Vᵀ.
      const float *pv = p;
      if (pd) {
        std::copy(p, p + tt, pd);
        d.dropRows(pd, b, head);
        pv = pd;
      }
      // dV += D(P)ᵀ·dO ; dP = D(dO·Vᵀ)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d.t, d.d, d.t, 1.0f,
                  pv, d.t, dout + off, d.h, beta, dv + koff, d.hk);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d.t, d.t, d.d, 1.0f,
                  dout + off, d.h, v + koff, d.hk, 0.0f, dp, d.t);
      if (pd)
        d.dropRows(dp, b, head);
      // dS = P ∘ (dP − rowsum(dP ∘ P)); masked entries have P = 0.
      for (int64_t i = 0; i < d.t; ++i) {
        float *pr = p + i * d.t, *dpr = dp + i * d.t;
        double dot = 0;
        for (int64_t j = 0; j < d.t; ++j)
          dot += static_cast<double>(dpr[j]) * pr[j];
        for (int64_t j = 0; j < d.t; ++j)
          dpr[j] = static_cast<float>(pr[j] * (dpr[j] - dot));
        // Through the cap: d(c·tanh(s/c))/ds = 1 − tanh²(s/c).
        if (tanhS)
          for (int64_t j = 0; j < d.t; ++j) {
            double t = pr[j] != 0 ? tanhS[i * d.t + j] : 0.0;
            dpr[j] = static_cast<float>(dpr[j] * (1 - t * t));
          }
      }
      // dQ = scale·dS·K ; dK += scale·dSᵀ·Q (w.r.t. the rotated operands).
      float *dqDst = d.rotary ? dqr : dq + off;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d.t, d.d, d.t,
                  d.scale, dp, d.t, kv.p, kv.ld, 0.0f, dqDst,
                  d.rotary ? d.d : d.h);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d.t, d.d, d.t,
                  d.scale, dp, d.t, qv.p, qv.ld, beta, dkDst, ldK);
      // The rotation is orthogonal: its gradient is the inverse rotation.
      if (d.rotary)
        unrotate(dqr, dq + off, d.h, tmp);
    }
    if (d.rotary)
      unrotate(dkr, dk + koff, d.hk, tmp);
  }, /*kvHeads=*/true);
}

// The key/value cache variant (KV-cache generation, runtime/README.md): the S
// new tokens of each batch row sit at positions p0..p0+S−1 (`positions`);
// their rotated keys and values are written into rows p0.. of the caches
// [B,Tmax,H], then query i attends to cache rows 0..p0+i. With p0 = 0 and
// S = T this is `attention` on the same operands, value for value.
void cpu::cached_attention(const KernelArgs &a) {
  Dims d = dimsOf(a, a.in[0], a.in[1]);
  const float *q = a.in[0].f32(), *k = a.in[1].f32(), *v = a.in[2].f32();
  const int32_t *pos = a.in[3].i32();
  float *kc = a.in[4].f32(), *vc = a.in[5].f32(), *o = a.out[0].f32();
  int64_t tmax = a.in[4].dim(1);
  Dims table = d;
  table.t = tmax;
  Rotary rot(table);
  if (d.t == 0 || d.d == 0)
    return;
  std::vector<int64_t> first(d.b);
  for (int64_t b = 0; b < d.b; ++b) {
    first[b] = pos[b * d.t];
    for (int64_t i = 0; i < d.t; ++i)
      if (pos[b * d.t + i] != first[b] + i)
        fail("cached_attention: positions of batch row ", b,
             " must be consecutive, got ", pos[b * d.t + i], " after ",
             first[b] + i - 1);
    if (first[b] < 0 || first[b] + d.t > tmax)
      fail("cached_attention: positions ", first[b], "..", first[b] + d.t - 1,
           " outside the cache of ", tmax);
    // The caches hold only the key/value heads: [B,Tmax,Hk].
    int64_t row = (b * tmax + first[b]) * d.hk, src = b * d.t * d.hk;
    std::copy(v + src, v + src + d.t * d.hk, vc + row);
    if (!d.rotary) {
      std::copy(k + src, k + src + d.t * d.hk, kc + row);
      continue;
    }
    for (int64_t h = 0; h < d.kvHeads; ++h)
      rot.applyAt(k + src + h * d.d, d.hk, kc + row + h * d.d, d.hk, d.t, d.d,
                  /*inverse=*/false, first[b]);
  }
  int64_t nmax = 0;
  for (int64_t f : first)
    nmax = std::max(nmax, f + d.t);
  forEachHead(a, d, d.t * nmax + d.t * d.d, [&](int64_t bh, float *scratch) {
    int64_t b = bh / d.heads, head = bh % d.heads, p0 = first[b];
    int64_t n = p0 + d.t; // cache rows visible to the last query
    int64_t off = b * d.t * d.h + head * d.d;
    const float *kh = kc + b * tmax * d.hk + head / d.group * d.d;
    const float *vh = vc + b * tmax * d.hk + head / d.group * d.d;
    float *s = scratch, *qr = scratch + d.t * n;
    HeadView qv{q + off, d.h};
    if (d.rotary) {
      rot.applyAt(q + off, d.h, qr, d.d, d.t, d.d, /*inverse=*/false, p0);
      qv = {qr, d.d};
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d.t, n, d.d, d.scale,
                qv.p, qv.ld, kh, d.hk, 0.0f, s, n);
    // Query i sees rows ..p0+i: the causal mask (and window) shifted by p0.
    for (int64_t i = 0; i < d.t; ++i)
      softmaxRow(s + i * n, n, d.visible(p0 + i, n), d.softcap, nullptr);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d.t, d.d, n, 1.0f,
                s, n, vh, d.hk, 0.0f, o + off, d.h);
  });
}
