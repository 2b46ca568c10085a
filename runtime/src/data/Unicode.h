//===- Unicode.h - UTF-8 decoding and the classes GPT-2 needs ---*- C++ -*-===//
#ifndef MAPP_RT_DATA_UNICODE_H
#define MAPP_RT_DATA_UNICODE_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mapp::rt::unicode {

struct CodepointRange {
  uint32_t lo, hi;
};
extern const CodepointRange kLetters[];
extern const size_t kLettersSize;
extern const CodepointRange kNumbers[];
extern const size_t kNumbersSize;

bool isLetter(uint32_t cp); // \p{L}
bool isNumber(uint32_t cp); // \p{N}
bool isSpace(uint32_t cp);  // \s of the `regex` module: White_Space

/// Code points of `s` with the byte offset where each starts; offsets has one
/// extra entry (s.size()). Invalid UTF-8 bytes decode as U+FFFD, one byte
/// each, so every byte of the input still belongs to exactly one piece.
void decodeUtf8(std::string_view s, std::vector<uint32_t> &cps,
                std::vector<size_t> &offsets);

/// Splits text like GPT-2's pattern
///   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
/// returning the pieces as substrings of `text`.
std::vector<std::string> gpt2PreTokenize(const std::string &text);

/// A place where `text` may be cut without changing its GPT-2
/// pre-tokenization (Tokenizer::cutPoint), 0 when there is none: a
/// whitespace code point right after a non-whitespace one. No piece of the
/// pattern spans such a boundary (a piece holds whitespace only as its first
/// character or throughout) and no piece looks behind, nor further ahead than
/// the whitespace, so both sides pre-tokenize as within the whole text. Only
/// code points starting 4 bytes or more before the end count: those decode
/// the same whatever bytes follow. The last ASCII whitespace that qualifies
/// is taken (found without decoding the text), else the last of any kind.
size_t gpt2CutPoint(std::string_view text);

} // namespace mapp::rt::unicode

#endif
