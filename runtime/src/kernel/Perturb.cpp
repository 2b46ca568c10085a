//===- Perturb.cpp - perturbation kinds of the perturb kernel -------------===//
#include "ProbeRng.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/ProbeReduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

using namespace mapp::rt;
namespace rng = mapp::rt::probe_rng;

namespace {

/// Nearest OCP fp8 e4m3fn value (saturating at ±448, no infinities), ties to
/// even: 3 mantissa bits, exponents down to 2^-6, subnormal step 2^-9.
float roundFp8E4M3(float x) {
  if (std::isnan(x))
    return x;
  double a = std::fabs(static_cast<double>(x));
  double q = a >= 0.015625 ? std::ldexp(1.0, std::ilogb(a) - 3) : 0.001953125;
  double r = std::nearbyint(a / q) * q;
  return static_cast<float>(std::copysign(std::min(r, 448.0), x));
}

} // namespace

// Here rather than in ProbeControl.cpp: the plan verifier (MappPlan) checks
// perturb attributes with it, without the control server.
std::string mapp::rt::magnitudeProblem(const std::string &kind, double m) {
  std::ostringstream os;
  if (!std::isfinite(m) || std::fabs(m) > kMaxMagnitude) {
    os << "\"magnitude\" " << m << " is out of bounds: it must be finite and "
       << "within [-" << kMaxMagnitude << ", " << kMaxMagnitude << "]";
    return os.str();
  }
  if (kind == "gaussian" && m < 0) {
    os << "\"magnitude\" " << m
       << " is out of bounds for gaussian: the noise's standard deviation "
          "must be in [0, "
       << kMaxMagnitude << "]";
    return os.str();
  }
  if (kind == "uniform" && (m < 0 || m > 1)) {
    os << "\"magnitude\" " << m
       << " is out of bounds for uniform: the relative spread must be in "
          "[0, 1]";
    return os.str();
  }
  return "";
}

void mapp::rt::checkPerturbAttrs(const Attrs &a,
                                 const std::vector<TensorType> &in) {
  a.requireInt("switch_id");
  std::string k = a.getStr("kind", "");
  static const char *kinds[] = {"gaussian", "uniform", "offset", "mask",
                                "bitflip",  "int8",    "fp8"};
  if (std::find_if(std::begin(kinds), std::end(kinds),
                   [&](const char *s) { return k == s; }) == std::end(kinds))
    fail("perturb: unknown kind '", k, "'");
  std::string why = magnitudeProblem(k, a.getFloat("magnitude", 0));
  if (!why.empty())
    fail("perturb: ", why);
  double p = a.getFloat("p", 0);
  if (!(p >= 0 && p <= 1))
    fail("perturb: p must be in [0, 1]");
  if (in[0].dtype != DType::F32)
    fail("perturb: input must be f32");
  int64_t last = in[0].rank() ? in[0].dim(-1) : 1;
  for (int64_t c : a.getInts("channels"))
    if (c < 0 || c >= last)
      fail("perturb: mask channel ", c, " outside the last dim ", last);
  if (k == "mask" && a.getInts("channels").empty())
    fail("perturb: mask needs channels");
}

void mapp::rt::applyPerturbation(const Attrs &a, const SwitchState &s,
                                 int64_t step, int microbatch, const float *x,
                                 float *y, int64_t n, int64_t lastDim) {
  if (y != x)
    std::memcpy(y, x, n * sizeof(float));
  if (!s.enabled)
    return;
  std::string kind = a.getStr("kind", "");
  double m = s.magnitude;
  uint64_t key = rng::stepKey(static_cast<uint64_t>(a.getInt("seed", 0)), step,
                              microbatch);
  if (kind == "gaussian") {
    for (int64_t i = 0; i < n; ++i)
      y[i] = static_cast<float>(y[i] + m * rng::normal(key, i));
  } else if (kind == "uniform") {
    for (int64_t i = 0; i < n; ++i)
      y[i] = static_cast<float>(y[i] * (1.0 - m + 2.0 * m * rng::uniform(key, i)));
  } else if (kind == "offset") {
    for (int64_t i = 0; i < n; ++i)
      y[i] = static_cast<float>(y[i] + m);
  } else if (kind == "mask") {
    std::vector<int64_t> ch = a.getInts("channels");
    for (int64_t r = 0; r < n / lastDim; ++r)
      for (int64_t c : ch)
        y[r * lastDim + c] = 0.f;
  } else if (kind == "bitflip") {
    double p = a.getFloat("p", 0);
    for (int64_t i = 0; i < n; ++i) {
      if (rng::uniform(key, 2 * i) >= p)
        continue;
      uint32_t bits;
      std::memcpy(&bits, &y[i], 4);
      bits ^= 1u << static_cast<int>(rng::uniform(key, 2 * i + 1) * 32);
      std::memcpy(&y[i], &bits, 4);
    }
  } else if (kind == "int8") {
    // Per-tensor symmetric absmax quantization, round half to even.
    float amax = 0;
    for (int64_t i = 0; i < n; ++i)
      amax = std::max(amax, std::fabs(y[i]));
    if (amax == 0 || !std::isfinite(amax))
      return;
    float sc = amax / 127.f;
    for (int64_t i = 0; i < n; ++i)
      y[i] = std::clamp(std::nearbyint(y[i] / sc), -127.f, 127.f) * sc;
  } else if (kind == "fp8") {
    for (int64_t i = 0; i < n; ++i)
      y[i] = roundFp8E4M3(y[i]);
  }
}
