//===- DType.cpp ----------------------------------------------------------===//
#include "mapp/rt/DType.h"

#include <cmath>
#include <cstring>

using namespace mapp::rt;

size_t mapp::rt::dtypeSize(DType t) {
  switch (t) {
  case DType::F32:
  case DType::I32:
    return 4;
  case DType::BF16:
  case DType::F16:
    return 2;
  case DType::I64:
    return 8;
  }
  return 0;
}

const char *mapp::rt::dtypeName(DType t) {
  switch (t) {
  case DType::F32:
    return "f32";
  case DType::BF16:
    return "bf16";
  case DType::F16:
    return "f16";
  case DType::I32:
    return "i32";
  case DType::I64:
    return "i64";
  }
  return "?";
}

bool mapp::rt::parseDType(const std::string &s, DType &out) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64})
    if (s == dtypeName(t)) {
      out = t;
      return true;
    }
  return false;
}

int64_t mapp::rt::numel(const Shape &s) {
  int64_t n = 1;
  for (int64_t d : s)
    n *= d;
  return n;
}

std::string mapp::rt::shapeStr(const Shape &s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i)
      r += ",";
    r += std::to_string(s[i]);
  }
  return r + "]";
}

float mapp::rt::bf16ToFloat(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t mapp::rt::floatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f))
    return 0x7FC0;
  uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float mapp::rt::f16ToFloat(uint16_t h) {
  uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  float v;
  if (exp == 0)
    v = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31)
    v = man ? NAN : INFINITY;
  else
    v = std::ldexp(static_cast<float>(man | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

uint16_t mapp::rt::floatToF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  if (std::isnan(f))
    return static_cast<uint16_t>(sign | 0x7E00);
  float a = std::fabs(f);
  if (a >= 65520.0f)
    return static_cast<uint16_t>(sign | 0x7C00);
  if (a < 6.103515625e-05f) { // subnormal: multiples of 2^-24
    uint32_t m = static_cast<uint32_t>(std::nearbyint(a * 16777216.0f));
    return static_cast<uint16_t>(sign | m);
  }
  // Normal: round the 23-bit mantissa to 10 bits, nearest even.
  uint32_t e = ((x >> 23) & 0xFF) - 127 + 15;
  uint32_t m = x & 0x7FFFFF;
  uint32_t h = (e << 10) | (m >> 13);
  uint32_t rest = m & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
    ++h;
  return static_cast<uint16_t>(sign | h);
}
