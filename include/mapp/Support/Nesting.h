//===- Nesting.h - bracket nesting of an input, before parsing --*- C++ -*-===//
//
// MLIR's parser, llvm::json and the YAML parser recurse once per level of
// nesting: 5,000 nested `module {` or 100,000 nested `[` overflowed the
// stack (SIGSEGV). The compiler's tools scan an input with
// findNestingBeyond before a parser sees it. Header-only and plain C++ (the
// probe-spec fuzz driver compiles the spec reader without MLIR).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SUPPORT_NESTING_H
#define MAPP_SUPPORT_NESTING_H

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace mapp {

/// The deepest nesting of (), [], {} and <> an input may have: far above any
/// real input (a few levels), far below what the parsers' recursion
/// overflows on an 8 MiB stack (4,000 to 5,000 nested modules, 3,000 to
/// 10,000 nested arrays, measured; docs/reliability.md).
inline constexpr unsigned kMaxInputNesting = 256;

/// The offset in `text` of the bracket that opens level `limit` + 1, or
/// nullopt. Brackets in "strings" and // comments do not count; `->` is an
/// arrow, not a closing bracket. A linear scan: it never recurses.
inline std::optional<size_t>
findNestingBeyond(std::string_view text, unsigned limit = kMaxInputNesting) {
  unsigned depth = 0;
  for (size_t i = 0, n = text.size(); i < n; ++i) {
    switch (text[i]) {
    case '"':
      // A string ends at its closing quote or, unterminated, at the line's
      // end (neither MLIR nor JSON strings span lines).
      for (++i; i < n && text[i] != '"' && text[i] != '\n'; ++i)
        if (text[i] == '\\')
          ++i;
      break;
    case '/':
      if (i + 1 < n && text[i + 1] == '/') {
        i = text.find('\n', i);
        if (i == std::string_view::npos)
          return std::nullopt;
      }
      break;
    case '(':
    case '[':
    case '{':
    case '<':
      if (++depth > limit)
        return i;
      break;
    case '>':
      if (i > 0 && text[i - 1] == '-')
        break; // "->"
      [[fallthrough]];
    case ')':
    case ']':
    case '}':
      if (depth)
        --depth;
      break;
    }
  }
  return std::nullopt;
}

/// The message for an input nested beyond kMaxInputNesting.
inline std::string nestingMessage() {
  return "brackets nest deeper than " + std::to_string(kMaxInputNesting) +
         " levels (the parsers recurse once per level; no mapp input nests "
         "this deep)";
}

} // namespace mapp

#endif // MAPP_SUPPORT_NESTING_H
