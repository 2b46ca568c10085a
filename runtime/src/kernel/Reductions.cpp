//===- Reductions.cpp - probe reductions over host fp32 data --------------===//
//
// Statistics accumulate in double so a reduction over millions of elements
// matches numpy's float64 result to fp32 precision.
//
//===----------------------------------------------------------------------===//
#include "ProbeRng.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/ProbeReduce.h"

#include <algorithm>
#include <numeric>
#include <sstream>

using namespace mapp::rt;

namespace {

std::vector<std::string> splitReduce(const Attrs &a) {
  std::vector<std::string> out;
  std::stringstream ss(a.getStr("reduce", ""));
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty())
      out.push_back(item);
  return out;
}

ProbeSample scalar(const char *name, double v) {
  ProbeSample s;
  s.reduction = name;
  s.value = v;
  return s;
}

ProbeSample histogram(const Attrs &a, const std::vector<float> &x) {
  int64_t bins = a.getInt("bins", 32);
  double lo = a.getFloat("lo", -8), hi = a.getFloat("hi", 8);
  ProbeSample s;
  s.reduction = "hist";
  s.data.assign(bins, 0.f);
  s.shape = {bins};
  // numpy.histogram: bins over [lo, hi], the last one closed; values outside
  // (and NaN) are not counted.
  for (float f : x) {
    double v = f;
    if (!(v >= lo && v <= hi))
      continue;
    int64_t b = static_cast<int64_t>((v - lo) / (hi - lo) * bins);
    s.data[std::min(b, bins - 1)] += 1;
  }
  return s;
}

ProbeSample topk(const Attrs &a, const std::vector<float> &x) {
  int64_t k = std::min<int64_t>(a.getInt("k", 10), x.size());
  std::vector<int64_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  // Largest first; ties keep the lower index first (a stable order).
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int64_t i, int64_t j) {
                      return x[i] > x[j] || (x[i] == x[j] && i < j);
                    });
  ProbeSample s;
  s.reduction = "topk";
  for (int64_t i = 0; i < k; ++i) {
    s.data.push_back(x[idx[i]]);
    s.index.push_back(idx[i]);
  }
  s.shape = {k};
  return s;
}

/// Row r of the sketch is R·x_r with R[j][i] = N(0,1)/sqrt(dim) drawn by the
/// counter RNG from (seed, j·inner + i): the same projection at every step,
/// so sketches of different steps and layers of one width are comparable.
ProbeSample sketch(const Attrs &a, const std::vector<float> &x, int64_t inner) {
  int64_t dim = a.getInt("dim", 16);
  uint64_t seed = static_cast<uint64_t>(a.getInt("seed", 0));
  int64_t rows = inner ? static_cast<int64_t>(x.size()) / inner : 0;
  std::vector<double> r(dim * inner);
  double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  for (int64_t n = 0; n < dim * inner; ++n)
    r[n] = probe_rng::normal(seed, static_cast<uint64_t>(n)) * scale;
  ProbeSample s;
  s.reduction = "sketch";
  s.shape = {rows, dim};
  s.data.resize(rows * dim);
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t j = 0; j < dim; ++j) {
      double acc = 0;
      const float *xr = x.data() + row * inner;
      const double *rj = r.data() + j * inner;
      for (int64_t i = 0; i < inner; ++i)
        acc += rj[i] * xr[i];
      s.data[row * dim + j] = static_cast<float>(acc);
    }
  return s;
}

} // namespace

std::vector<float> mapp::rt::selectTokens(const Attrs &a, const float *x,
                                          const Shape &shape) {
  int64_t n = numel(shape);
  std::vector<int64_t> toks = a.getInts("tokens");
  if (toks.empty() || shape.size() < 2)
    return std::vector<float>(x, x + n);
  int64_t B = shape[0], T = shape[1], inner = n / std::max<int64_t>(B * T, 1);
  std::vector<float> out;
  out.reserve(B * toks.size() * inner);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t : toks) {
      const float *row = x + (b * T + t) * inner;
      out.insert(out.end(), row, row + inner);
    }
  return out;
}

std::vector<ProbeSample> mapp::rt::reduceValues(const Attrs &a,
                                                const std::vector<float> &x,
                                                int64_t inner) {
  std::vector<ProbeSample> out;
  std::vector<std::string> reds = splitReduce(a);
  bool needStats = false;
  for (const std::string &r : reds)
    needStats |= r == "max" || r == "min" || r == "mean" || r == "std" ||
                 r == "absmax" || r == "sparsity";
  double mx = -INFINITY, mn = INFINITY, sum = 0, amax = 0;
  int64_t small = 0;
  double eps = a.getFloat("eps", 1e-6);
  if (needStats)
    for (float f : x) {
      double v = f;
      mx = std::max(mx, v);
      mn = std::min(mn, v);
      sum += v;
      amax = std::max(amax, std::fabs(v));
      small += std::fabs(v) < eps;
    }
  double n = static_cast<double>(x.size());
  double mean = n ? sum / n : NAN;
  for (const std::string &r : reds) {
    if (r == "max")
      out.push_back(scalar("max", n ? mx : NAN));
    else if (r == "min")
      out.push_back(scalar("min", n ? mn : NAN));
    else if (r == "mean")
      out.push_back(scalar("mean", mean));
    else if (r == "std") {
      // Two-pass population std (numpy's default ddof=0).
      double ss = 0;
      for (float f : x)
        ss += (f - mean) * (f - mean);
      out.push_back(scalar("std", n ? std::sqrt(ss / n) : NAN));
    } else if (r == "absmax")
      out.push_back(scalar("absmax", amax));
    else if (r == "sparsity")
      out.push_back(scalar("sparsity", n ? small / n : NAN));
    else if (r == "hist")
      out.push_back(histogram(a, x));
    else if (r == "topk")
      out.push_back(topk(a, x));
    else if (r == "sketch")
      out.push_back(sketch(a, x, inner));
    else if (r == "raw") {
      ProbeSample s;
      s.reduction = "raw";
      int64_t cap = std::min<int64_t>(a.getInt("cap", 4096), x.size());
      s.data.assign(x.begin(), x.begin() + cap);
      s.shape = {cap};
      out.push_back(std::move(s));
    }
  }
  return out;
}

/// The probes recompute plain (optionally rotary) causal attention; the
/// family options would make their probabilities wrong, so they refuse.
static void refuseFamilyOptions(const Attrs &a) {
  for (const char *k : {"rotary_dim", "softcap", "sliding_window"})
    if (a.has(k))
      fail("probe: attention probabilities of an attention with '", k,
           "' are not supported");
}

ProbeSample mapp::rt::attentionProbs(const Attrs &a, const float *q,
                                     const float *k, const Shape &shape) {
  refuseFamilyOptions(a);
  int64_t T = shape[1], H = shape[2], heads = a.requireInt("heads");
  int64_t D = H / heads;
  double scale = a.getFloat("scale", 1.0);
  bool causal = a.flag("causal"), rotary = a.flag("rotary");
  double base = a.getFloat("rotary_base", 10000);
  std::vector<int64_t> rows = a.getInts("tokens");
  if (rows.empty())
    for (int64_t t = 0; t < T; ++t)
      rows.push_back(t);
  // Batch row 0 only: the heatmap of one sequence, as MegatronApp shows.
  auto rotated = [&](const float *src) {
    std::vector<double> v(src, src + T * H);
    if (!rotary)
      return v;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < D / 2; ++i) {
          double th = t * std::pow(base, -2.0 * i / D);
          double *p = v.data() + t * H + h * D;
          double x1 = src[t * H + h * D + i], x2 = src[t * H + h * D + i + D / 2];
          p[i] = x1 * std::cos(th) - x2 * std::sin(th);
          p[i + D / 2] = x2 * std::cos(th) + x1 * std::sin(th);
        }
    return v;
  };
  std::vector<double> qr = rotated(q), kr = rotated(k);
  ProbeSample s;
  s.reduction = "attn";
  int64_t R = rows.size();
  s.shape = {heads, R, T};
  s.data.assign(heads * R * T, 0.f);
  std::vector<double> sc(T);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t ri = 0; ri < R; ++ri) {
      int64_t i = rows[ri], last = causal ? i : T - 1;
      double m = -INFINITY;
      for (int64_t j = 0; j <= last; ++j) {
        double d = 0;
        for (int64_t c = 0; c < D; ++c)
          d += qr[i * H + h * D + c] * kr[j * H + h * D + c];
        sc[j] = d * scale;
        m = std::max(m, sc[j]);
      }
      double z = 0;
      for (int64_t j = 0; j <= last; ++j)
        z += (sc[j] = std::exp(sc[j] - m));
      for (int64_t j = 0; j <= last; ++j)
        s.data[(h * R + ri) * T + j] = static_cast<float>(sc[j] / z);
    }
  return s;
}

ProbeSample mapp::rt::attentionProbsCached(const Attrs &a, const float *q,
                                           const float *kcache,
                                           const int32_t *positions,
                                           const Shape &qShape, int64_t tmax) {
  refuseFamilyOptions(a);
  int64_t S = qShape[1], H = qShape[2], heads = a.requireInt("heads");
  int64_t D = H / heads;
  double scale = a.getFloat("scale", 1.0);
  bool rotary = a.flag("rotary");
  double base = a.getFloat("rotary_base", 10000);
  // Batch row 0; cached keys are already rotated, the queries are rotated
  // here at their own positions (the same formula as attentionProbs).
  ProbeSample s;
  s.reduction = "attn";
  s.shape = {heads, S, tmax};
  s.data.assign(heads * S * tmax, 0.f);
  std::vector<double> sc(tmax), qr(D);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < S; ++i) {
      int64_t p = positions[i];
      if (p < 0 || p >= tmax)
        fail("probe: position ", p, " outside the cache of ", tmax);
      const float *qi = q + i * H + h * D;
      for (int64_t c = 0; c < D; ++c)
        qr[c] = qi[c];
      if (rotary)
        for (int64_t c = 0; c < D / 2; ++c) {
          double th = p * std::pow(base, -2.0 * c / D);
          double x1 = qi[c], x2 = qi[c + D / 2];
          qr[c] = x1 * std::cos(th) - x2 * std::sin(th);
          qr[c + D / 2] = x2 * std::cos(th) + x1 * std::sin(th);
        }
      double m = -INFINITY;
      for (int64_t j = 0; j <= p; ++j) {
        double d = 0;
        for (int64_t c = 0; c < D; ++c)
          d += qr[c] * kcache[j * H + h * D + c];
        sc[j] = d * scale;
        m = std::max(m, sc[j]);
      }
      double z = 0;
      for (int64_t j = 0; j <= p; ++j)
        z += (sc[j] = std::exp(sc[j] - m));
      for (int64_t j = 0; j <= p; ++j)
        s.data[(h * S + i) * tmax + j] = static_cast<float>(sc[j] / z);
    }
  return s;
}

void mapp::rt::checkProbeAttrs(const Attrs &a,
                               const std::vector<TensorType> &in) {
  a.requireInt("probe_id");
  if (a.getInt("every", 1) < 1)
    fail("probe: every must be >= 1");
  std::vector<std::string> reds = splitReduce(a);
  if (reds.empty())
    fail("probe: no reductions");
  // A KV-cache attention probe (generation) also reads the query positions.
  bool cached = a.flag("kv_cache");
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].dtype != (cached && i == 2 ? DType::I32 : DType::F32))
      fail(cached && i == 2 ? "probe: positions must be i32"
                            : "probe: inputs must be f32");
  for (const std::string &r : reds) {
    static const char *known[] = {"max",  "min",  "mean",   "std", "absmax",
                                  "sparsity", "hist", "topk", "sketch",
                                  "raw", "attn", "lens"};
    if (std::find_if(std::begin(known), std::end(known), [&](const char *k) {
          return r == k;
        }) == std::end(known))
      fail("probe: unknown reduction '", r, "'");
    if (r == "attn" && cached) {
      if (in.size() != 3 || in[0].rank() != 3 || in[1].rank() != 3 ||
          in[0].dim(0) != in[1].dim(0) || in[0].dim(2) != in[1].dim(2) ||
          in[1].dim(1) < in[0].dim(1) ||
          in[2].shape != Shape{in[0].dim(0), in[0].dim(1)})
        fail("probe: cached attn needs q [B,S,H], a key cache [B,Tmax,H] and "
             "positions [B,S]");
      int64_t heads = a.requireInt("heads");
      if (heads < 1 || in[0].dim(2) % heads)
        fail("probe: heads must divide H");
    } else if (r == "lens") {
      // x [B,T,H], gamma [H], (beta [H] for layer_norm), w [vocab, H].
      bool rms = a.getStr("norm", "layer_norm") == "rms_norm";
      if (!rms && a.getStr("norm", "layer_norm") != "layer_norm")
        fail("probe: lens norm must be layer_norm or rms_norm");
      size_t want = rms ? 3 : 4;
      if (reds.size() != 1 || in.size() != want || in[0].rank() != 3)
        fail("probe: lens is the only reduction of its probe and needs x "
             "[B,T,H], the final norm's weights and the unembedding");
      int64_t H = in[0].dim(2);
      const TensorType &w = in.back();
      if (in[1].shape != Shape{H} || (!rms && in[2].shape != Shape{H}) ||
          w.rank() != 2 || w.dim(1) != H)
        fail("probe: lens weights do not match the hidden size ", H);
      if (a.getInt("k", 10) < 1)
        fail("probe: 'lens' needs a positive size");
    } else if (r == "attn") {
      if (in.size() != 2 || in[0].rank() != 3 || in[0].shape != in[1].shape)
        fail("probe: attn needs q and k of one [B,T,H] shape");
      int64_t heads = a.requireInt("heads");
      if (heads < 1 || in[0].dim(2) % heads)
        fail("probe: heads must divide H");
    } else if (in.size() != 1) {
      fail("probe: '", r, "' takes one input");
    }
    if (r == "hist" && (a.getInt("bins", 32) < 1 ||
                        !(a.getFloat("lo", -8) < a.getFloat("hi", 8))))
      fail("probe: hist needs bins >= 1 and lo < hi");
    if ((r == "topk" && a.getInt("k", 10) < 1) ||
        (r == "sketch" && a.getInt("dim", 16) < 1) ||
        (r == "raw" && a.getInt("cap", 4096) < 1))
      fail("probe: '", r, "' needs a positive size");
  }
  // Token positions index dim 1; out of range would read outside the input.
  for (int64_t t : a.getInts("tokens"))
    if (in[0].rank() < 2 || t < 0 || t >= in[0].dim(1))
      fail("probe: token position ", t, " outside the sequence");
}
