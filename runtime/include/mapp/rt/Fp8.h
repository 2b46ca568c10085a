//===- Fp8.h - the fp8 recipe's numerics (host reference) -------*- C++ -*-===//
//
// OCP 8-bit floating point (OFP8, v1.0): E4M3 as E4M3FN (bias 7, no
// infinities, max 448, smallest subnormal 2^-9) and E5M2 (bias 15, max
// 57344, smallest subnormal 2^-16). Conversion is round to nearest, ties to
// even, saturating: any magnitude above the largest finite value (infinity
// included) becomes that value, NaN stays NaN (CUDA's __NV_SATFINITE).
//
// The delayed-scaling state of one fp8 linear layer ("meta", f32[3·(1+H)])
// is three rows of (scale, h[0..H-1]): row 0 the input x, row 1 the weight,
// row 2 the output gradient. GEMMs quantize q(v·scale), multiply the fp8
// values exactly and scale the fp32 sums by (1/scale_a)·(1/scale_b); they
// record amax = max |v| (before scaling; NaN sticks) into h[0]. Once per
// step fp8UpdateRow turns the history into the next scale and rolls it.
// The CPU backend's kernels, the CUDA kernels' checks and the tests use
// these functions; the CUDA backend computes the same in its kernels.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_FP8_H
#define MAPP_RT_FP8_H

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

namespace mapp::rt {

enum class Fp8Format : uint8_t { E4M3 = 0, E5M2 = 1 };

/// "e4m3" / "e5m2"; false on anything else.
inline bool parseFp8Format(const std::string &s, Fp8Format &out) {
  if (s == "e4m3")
    out = Fp8Format::E4M3;
  else if (s == "e5m2")
    out = Fp8Format::E5M2;
  else
    return false;
  return true;
}

/// The largest finite value.
inline float fp8Max(Fp8Format f) {
  return f == Fp8Format::E4M3 ? 448.0f : 57344.0f;
}

/// v rounded to the format's grid (nearest, ties to even), saturated.
inline float fp8Round(float v, Fp8Format f) {
  if (std::isnan(v))
    return v;
  const int mant = f == Fp8Format::E4M3 ? 3 : 2;
  const int emin = f == Fp8Format::E4M3 ? -6 : -14; // smallest normal exponent
  const float max = fp8Max(f);
  float a = std::fabs(v);
  if (a >= max)
    return std::copysign(max, v);
  if (a == 0)
    return v;
  int ex;
  std::frexp(a, &ex); // a = m·2^ex, m in [0.5, 1)
  int e = ex - 1;
  if (e < emin)
    e = emin; // subnormals: the quantum of the smallest binade
  float quantum = std::ldexp(1.0f, e - mant);
  // a / quantum is exact (a power-of-two divide of a normal float) and
  // nearbyint rounds half to even in the default rounding mode.
  float q = std::nearbyint(a / quantum) * quantum;
  if (q > max)
    q = max;
  return std::copysign(q, v);
}

/// The bits of |v| as an unsigned integer: ordered like |v| for every
/// float, with NaN above infinity. Max over these is the amax that the CUDA
/// kernels take with atomicMax on the same bits.
inline uint32_t absBits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b & 0x7FFFFFFFu;
}
inline float fromBits(uint32_t b) {
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}

/// amax(|v|) over n values, NaN if any is NaN; as absBits.
inline uint32_t amaxBits(const float *v, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b = absBits(v[i]);
    m = b > m ? b : m;
  }
  return m;
}

/// One row (scale, h[0..H-1]) of a meta after a step: a = max(h); with a
/// finite and > 0, scale = fp8_max / a / 2^margin when that is finite (else
/// kept); then h[i] = h[i-1] (i = H-1..1), h[0] = 0.
inline void fp8UpdateRow(float *row, int64_t history, int64_t margin,
                         Fp8Format f) {
  uint32_t m = 0;
  for (int64_t i = 0; i < history; ++i) {
    uint32_t b = absBits(row[1 + i]);
    m = b > m ? b : m;
  }
  float amax = fromBits(m);
  if (std::isfinite(amax) && amax > 0) {
    float s = (fp8Max(f) / amax) / std::ldexp(1.0f, static_cast<int>(margin));
    if (std::isfinite(s))
      row[0] = s;
  }
  for (int64_t i = history - 1; i >= 1; --i)
    row[1 + i] = row[i];
  row[1] = 0.0f;
}

} // namespace mapp::rt

#endif
