//===- LogitLens.cpp - the `lens` probe reduction --------------------------===//
//
// Logit lens (nostalgebraist 2020): a layer's residual stream read through
// the model's final norm and unembedding, as if the layers after it were
// skipped. Per selected position of batch row 0 it records the k most likely
// tokens and their probabilities: k ids + k floats per position instead of a
// vocabulary-wide row of logits. Arithmetic in double, so the result is the
// exact softmax of the fp32 inputs to fp32 precision.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Error.h"
#include "mapp/rt/ProbeReduce.h"

#include <algorithm>
#include <cmath>
#include <numeric>

using namespace mapp::rt;

LensSpec mapp::rt::lensSpec(const Attrs &a, int64_t T, int64_t vocab) {
  LensSpec l;
  l.k = std::min<int64_t>(a.getInt("k", 10), vocab);
  if (l.k < 1)
    fail("probe: 'lens' needs a positive size");
  std::string norm = a.getStr("norm", "layer_norm");
  if (norm != "layer_norm" && norm != "rms_norm")
    fail("probe: lens norm must be layer_norm or rms_norm");
  l.rms = norm == "rms_norm";
  l.eps = a.getFloat("eps", 1e-5);
  l.positions = a.getInts("tokens");
  if (l.positions.empty())
    for (int64_t t = 0; t < T; ++t)
      l.positions.push_back(t);
  for (int64_t t : l.positions)
    if (t < 0 || t >= T)
      fail("probe: lens position ", t, " outside the sequence of ", T);
  return l;
}

ProbeSample mapp::rt::logitLens(const Attrs &a, const float *x,
                                const float *gamma, const float *beta,
                                const float *w, const Shape &xShape,
                                int64_t vocab) {
  int64_t H = xShape[2];
  const LensSpec l = lensSpec(a, xShape[1], vocab);
  const int64_t k = l.k, R = static_cast<int64_t>(l.positions.size());
  const bool rms = l.rms;
  const double eps = l.eps;
  ProbeSample s;
  s.reduction = "lens";
  s.shape = {R, k};
  std::vector<double> y(H), logit(vocab);
  std::vector<int64_t> order(vocab);
  for (int64_t t : l.positions) {
    const float *xr = x + t * H; // batch row 0
    double mean = 0, ss = 0;
    if (!rms) {
      for (int64_t h = 0; h < H; ++h)
        mean += xr[h];
      mean /= H;
    }
    for (int64_t h = 0; h < H; ++h)
      ss += (xr[h] - mean) * (xr[h] - mean);
    double inv = 1.0 / std::sqrt(ss / H + eps);
    for (int64_t h = 0; h < H; ++h)
      y[h] = (xr[h] - mean) * inv * gamma[h] + (beta ? beta[h] : 0.0);
    double m = -INFINITY;
    for (int64_t v = 0; v < vocab; ++v) {
      const float *wv = w + v * H;
      double acc = 0;
      for (int64_t h = 0; h < H; ++h)
        acc += y[h] * wv[h];
      logit[v] = acc;
      m = std::max(m, acc);
    }
    double z = 0;
    for (int64_t v = 0; v < vocab; ++v)
      z += std::exp(logit[v] - m);
    std::iota(order.begin(), order.end(), 0);
    // Most likely first; ties keep the lower id first (as topk).
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int64_t i, int64_t j) {
                        return logit[i] > logit[j] ||
                               (logit[i] == logit[j] && i < j);
                      });
    for (int64_t i = 0; i < k; ++i) {
      s.data.push_back(static_cast<float>(std::exp(logit[order[i]] - m) / z));
      s.index.push_back(order[i]);
    }
  }
  return s;
}
