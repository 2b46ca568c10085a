//===- Fp64Reference.cpp - double-precision kernel references -------------===//
#include "Fp64Reference.h"

#include <cmath>
#include <limits>

using namespace mapp::rt;
using namespace mapp::test;

double mapp::test::geluTanh(double v) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * v * (1.0 + std::tanh(k * (v + 0.044715 * v * v * v)));
}

Doubles mapp::test::linearRef(const float *x, const float *w, const float *b,
                              int64_t rows, int64_t n, int64_t k) {
  Doubles y(rows * n);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double s = b ? b[j] : 0.0;
      for (int64_t i = 0; i < k; ++i)
        s += double(x[r * k + i]) * w[j * k + i];
      y[r * n + j] = s;
    }
  return y;
}

namespace {

Doubles matmulRef(const Attrs &at, const TensorType &ta_, const float *A,
                  const TensorType &tb_, const float *B) {
  bool ta = at.flag("transpose_a"), tb = at.flag("transpose_b");
  int64_t m = ta ? ta_.dim(-1) : ta_.dim(-2), k = ta ? ta_.dim(-2) : ta_.dim(-1);
  int64_t n = tb ? tb_.dim(-2) : tb_.dim(-1);
  int64_t batch = ta_.numel() / (m * k);
  bool sharedB = tb_.rank() == 2;
  Doubles c(batch * m * n);
  for (int64_t bt = 0; bt < batch; ++bt) {
    const float *a = A + bt * m * k, *b = B + (sharedB ? 0 : bt * k * n);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t kk = 0; kk < k; ++kk)
          s += double(ta ? a[kk * m + i] : a[i * k + kk]) *
               (tb ? b[j * k + kk] : b[kk * n + j]);
        c[(bt * m + i) * n + j] = s;
      }
  }
  return c;
}

/// One (batch, head) of q/k/v as [T, D] doubles, rotary applied when asked
/// (rotate-half, angles t·base^(−2i/D), as docs/semantics.md specifies).
struct Heads {
  int64_t b, t, h, heads, d;
  bool causal, rotary;
  double scale, base;

  Doubles load(const float *x, int64_t bi, int64_t hi, bool rotate) const {
    Doubles o(t * d);
    for (int64_t ti = 0; ti < t; ++ti)
      for (int64_t di = 0; di < d; ++di)
        o[ti * d + di] = x[(bi * t + ti) * h + hi * d + di];
    if (rotate && rotary)
      rot(o, false);
    return o;
  }
  void rot(Doubles &x, bool inverse) const {
    int64_t half = d / 2;
    for (int64_t ti = 0; ti < t; ++ti)
      for (int64_t i = 0; i < half; ++i) {
        double th = ti * std::pow(base, -2.0 * i / d);
        double c = std::cos(th), s = (inverse ? -1 : 1) * std::sin(th);
        double x0 = x[ti * d + i], x1 = x[ti * d + i + half];
        x[ti * d + i] = x0 * c - x1 * s;
        x[ti * d + i + half] = x1 * c + x0 * s;
      }
  }
  void store(const Doubles &v, Doubles &out, int64_t bi, int64_t hi,
             bool add = false) const {
    for (int64_t ti = 0; ti < t; ++ti)
      for (int64_t di = 0; di < d; ++di) {
        double &o = out[(bi * t + ti) * h + hi * d + di];
        o = add ? o + v[ti * d + di] : v[ti * d + di];
      }
  }
  /// The key/value view of grouped-query attention: k, v [B,T,Hk].
  Heads kv(const TensorType &k) const {
    Heads g = *this;
    g.h = k.dim(2);
    g.heads = g.h / d;
    return g;
  }
  /// Softmax probabilities P[T,T] (masked entries 0).
  Doubles probs(const Doubles &q, const Doubles &k) const {
    Doubles p(t * t, 0.0);
    for (int64_t i = 0; i < t; ++i) {
      int64_t n = causal ? i + 1 : t;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t di = 0; di < d; ++di)
          s += q[i * d + di] * k[j * d + di];
        p[i * t + j] = s * scale;
        mx = std::max(mx, p[i * t + j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < n; ++j)
        sum += p[i * t + j] = std::exp(p[i * t + j] - mx);
      for (int64_t j = 0; j < n; ++j)
        p[i * t + j] /= sum;
    }
    return p;
  }
};

Heads headsOf(const Attrs &at, const TensorType &q) {
  Heads g{};
  g.b = q.dim(0);
  g.t = q.dim(1);
  g.h = q.dim(2);
  g.heads = at.getInt("heads", 1);
  g.d = g.h / g.heads;
  g.causal = at.flag("causal");
  g.rotary = at.flag("rotary");
  g.scale = at.getFloat("scale", 1.0 / std::sqrt(double(g.d)));
  g.base = at.getFloat("rotary_base", 10000.0);
  return g;
}

// Query head hi reads key/value head hi / (heads / kv heads).
void attentionRef(const Attrs &at, const TensorType &qt, const TensorType &kt,
                  const float *q, const float *k, const float *v, Doubles &o) {
  Heads g = headsOf(at, qt), gk = g.kv(kt);
  int64_t group = g.heads / gk.heads;
  o.assign(qt.numel(), 0.0);
  for (int64_t bi = 0; bi < g.b; ++bi)
    for (int64_t hi = 0; hi < g.heads; ++hi) {
      Doubles Q = g.load(q, bi, hi, true), K = gk.load(k, bi, hi / group, true),
              V = gk.load(v, bi, hi / group, false), O(g.t * g.d, 0.0);
      Doubles P = g.probs(Q, K);
      for (int64_t i = 0; i < g.t; ++i)
        for (int64_t j = 0; j < g.t; ++j)
          for (int64_t di = 0; di < g.d; ++di)
            O[i * g.d + di] += P[i * g.t + j] * V[j * g.d + di];
      g.store(O, o, bi, hi);
    }
}

void attentionGradRef(const Attrs &at, const TensorType &qt,
                      const TensorType &kt, const float *dout, const float *q,
                      const float *k, const float *v,
                      std::vector<Doubles> &out) {
  Heads g = headsOf(at, qt), gk = g.kv(kt);
  int64_t group = g.heads / gk.heads;
  out[0].assign(qt.numel(), 0.0);
  out[1].assign(kt.numel(), 0.0);
  out[2].assign(kt.numel(), 0.0);
  int64_t T = g.t, D = g.d;
  for (int64_t bi = 0; bi < g.b; ++bi)
    for (int64_t hi = 0; hi < g.heads; ++hi) {
      Doubles Q = g.load(q, bi, hi, true), K = gk.load(k, bi, hi / group, true),
              V = gk.load(v, bi, hi / group, false),
              dO = g.load(dout, bi, hi, false);
      Doubles P = g.probs(Q, K);
      Doubles dQ(T * D, 0.0), dK(T * D, 0.0), dV(T * D, 0.0), dS(T * T, 0.0);
      for (int64_t i = 0; i < T; ++i) {
        double rowDot = 0;
        for (int64_t j = 0; j < T; ++j) {
          double dp = 0;
          for (int64_t di = 0; di < D; ++di)
            dp += dO[i * D + di] * V[j * D + di];
          dS[i * T + j] = dp;
          rowDot += dp * P[i * T + j];
        }
        for (int64_t j = 0; j < T; ++j)
          dS[i * T + j] = P[i * T + j] * (dS[i * T + j] - rowDot) * g.scale;
      }
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < T; ++j)
          for (int64_t di = 0; di < D; ++di) {
            dV[j * D + di] += P[i * T + j] * dO[i * D + di];
            dQ[i * D + di] += dS[i * T + j] * K[j * D + di];
            dK[j * D + di] += dS[i * T + j] * Q[i * D + di];
          }
      if (g.rotary) { // gradients of the rotated q/k, rotated back
        g.rot(dQ, true);
        g.rot(dK, true);
      }
      g.store(dQ, out[0], bi, hi);
      gk.store(dK, out[1], bi, hi / group, /*add=*/true);
      gk.store(dV, out[2], bi, hi / group, /*add=*/true);
    }
}

} // namespace

bool mapp::test::fp64Reference(const std::string &kernel, const Attrs &attrs,
                               const std::vector<TensorType> &inTypes,
                               const std::vector<const float *> &in,
                               const std::vector<TensorType> &outTypes,
                               std::vector<Doubles> &out) {
  out.assign(outTypes.size(), {});
  if (kernel == "fused")
    return fusedFp64(attrs, inTypes, in, out);
  if (kernel == "linear") {
    int64_t k = inTypes[0].dim(-1), n = inTypes[1].dim(0);
    out[0] = linearRef(in[0], in[1], in.size() > 2 ? in[2] : nullptr,
                       inTypes[0].numel() / k, n, k);
    return true;
  }
  if (kernel == "matmul") {
    out[0] = matmulRef(attrs, inTypes[0], in[0], inTypes[1], in[1]);
    return true;
  }
  // The family options (sliding_window, softcap, rotary_dim, dropout) are
  // checked against the CPU backend, which test_kernels_families.py checks
  // against PyTorch.
  if (kernel.rfind("attention", 0) == 0)
    for (const char *k : {"sliding_window", "softcap", "rotary_dim", "dropout"})
      if (attrs.has(k))
        return false;
  if (kernel == "attention") {
    attentionRef(attrs, inTypes[0], inTypes[1], in[0], in[1], in[2], out[0]);
    return true;
  }
  if (kernel == "attention_grad") {
    attentionGradRef(attrs, inTypes[1], inTypes[2], in[0], in[1], in[2], in[3],
                     out);
    return true;
  }
  return false;
}
