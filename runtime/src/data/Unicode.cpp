//===- Unicode.cpp - GPT-2 pre-tokenization by hand -----------------------===//
#include "data/Unicode.h"

#include <algorithm>

using namespace mapp::rt;
using namespace mapp::rt::unicode;

static bool inRanges(const CodepointRange *r, size_t n, uint32_t cp) {
  const CodepointRange *end = r + n;
  const CodepointRange *it = std::upper_bound(
      r, end, cp, [](uint32_t v, const CodepointRange &x) { return v < x.lo; });
  return it != r && cp <= (it - 1)->hi;
}

bool unicode::isLetter(uint32_t cp) {
  if (cp < 0x80)
    return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return inRanges(kLetters, kLettersSize, cp);
}

bool unicode::isNumber(uint32_t cp) {
  if (cp < 0x80)
    return cp >= '0' && cp <= '9';
  return inRanges(kNumbers, kNumbersSize, cp);
}

bool unicode::isSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

void unicode::decodeUtf8(std::string_view s, std::vector<uint32_t> &cps,
                         std::vector<size_t> &offsets) {
  cps.clear();
  offsets.clear();
  cps.reserve(s.size());
  offsets.reserve(s.size() + 1);
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char c = s[i];
    uint32_t cp = 0xFFFD;
    size_t len = 1;
    if (c < 0x80) {
      cp = c;
    } else {
      size_t need = c >= 0xF0 && c < 0xF8 ? 4
                    : c >= 0xE0           ? 3
                    : c >= 0xC2           ? 2
                                          : 0;
      if (need && i + need <= n) {
        uint32_t v = c & (0x7F >> need);
        bool ok = true;
        for (size_t k = 1; k < need && ok; ++k) {
          unsigned char cc = s[i + k];
          ok = (cc & 0xC0) == 0x80;
          v = (v << 6) | (cc & 0x3F);
        }
        // Reject overlong forms and surrogates like a strict decoder.
        if (ok && !(need == 3 && v < 0x800) && !(need == 4 && v < 0x10000) &&
            v <= 0x10FFFF && !(v >= 0xD800 && v <= 0xDFFF)) {
          cp = v;
          len = need;
        }
      }
    }
    cps.push_back(cp);
    offsets.push_back(i);
    i += len;
  }
  offsets.push_back(n);
}

namespace {

enum class Cls : uint8_t { Letter, Number, Space, Other };

Cls classify(uint32_t cp) {
  if (isLetter(cp))
    return Cls::Letter;
  if (isNumber(cp))
    return Cls::Number;
  if (isSpace(cp))
    return Cls::Space;
  return Cls::Other;
}

/// Length in code points of a contraction ('s 't 're 've 'm 'll 'd) at i.
size_t contraction(const std::vector<uint32_t> &cp, size_t i) {
  if (cp[i] != '\'' || i + 1 >= cp.size())
    return 0;
  uint32_t a = cp[i + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd')
    return 2;
  if (i + 2 < cp.size()) {
    uint32_t b = cp[i + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') ||
        (a == 'l' && b == 'l'))
      return 3;
  }
  return 0;
}

} // namespace

std::vector<std::string> unicode::gpt2PreTokenize(const std::string &text) {
  std::vector<uint32_t> cp;
  std::vector<size_t> off;
  decodeUtf8(text, cp, off);
  std::vector<Cls> cls(cp.size());
  for (size_t i = 0; i < cp.size(); ++i)
    cls[i] = classify(cp[i]);

  std::vector<std::string> pieces;
  size_t n = cp.size(), i = 0;
  auto emit = [&](size_t b, size_t e) {
    pieces.push_back(text.substr(off[b], off[e] - off[b]));
    i = e;
  };
  while (i < n) {
    if (size_t len = contraction(cp, i)) {
      emit(i, i + len);
      continue;
    }
    // ` ?X+` for X in {letter, number, other}: an optional single space
    // (U+0020 only) glued to a run of one class.
    size_t j = i;
    if (cp[j] == ' ' && j + 1 < n && cls[j + 1] != Cls::Space)
      ++j;
    if (cls[j] != Cls::Space) {
      Cls c = cls[j];
      size_t e = j + 1;
      while (e < n && cls[e] == c)
        ++e;
      emit(i, e);
      continue;
    }
    // Whitespace run i..e. `\s+(?!\S)`: leave the last space to the next
    // piece when a non-space follows; a lone space then falls to `\s+`.
    size_t e = i;
    while (e < n && cls[e] == Cls::Space)
      ++e;
    if (e < n && e - i > 1)
      --e;
    emit(i, e);
  }
  return pieces;
}

size_t unicode::gpt2CutPoint(std::string_view text) {
  auto asciiSpace = [](unsigned char c) {
    return c == ' ' || (c >= 0x09 && c <= 0x0D);
  };
  std::vector<uint32_t> cp;
  std::vector<size_t> off;
  // Fast path, from the end: an ASCII whitespace byte is always a code point
  // of its own (never a continuation byte). The code point before it is
  // decoded from the nearest ASCII byte back, also a code point boundary
  // (the text starts at one); a sequence cut short by the ASCII byte decodes
  // as U+FFFD there, as it does in the whole text.
  size_t n = text.size();
  for (size_t p = n >= 5 ? n - 4 : 0; p >= 1; --p) {
    if (!asciiSpace(text[p]))
      continue;
    unsigned char before = text[p - 1];
    if (before < 0x80) {
      if (!asciiSpace(before))
        return p;
      continue;
    }
    size_t q = p - 1;
    while (q > 0 && static_cast<unsigned char>(text[q - 1]) >= 0x80)
      --q;
    decodeUtf8(text.substr(q, p - q), cp, off);
    if (!isSpace(cp.back()))
      return p;
  }
  // Text without such a place (no ASCII whitespace): every code point.
  decodeUtf8(text, cp, off);
  for (size_t p = cp.size(); p-- > 1;)
    if (off[p] + 4 <= n && isSpace(cp[p]) && !isSpace(cp[p - 1]))
      return off[p];
  return 0;
}
