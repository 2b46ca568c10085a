//===- Tokenizer.h - text -> token ids --------------------------*- C++ -*-===//
#ifndef MAPP_RT_TOKENIZER_H
#define MAPP_RT_TOKENIZER_H

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mapp::rt {

class Tokenizer {
public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(const std::string &text) const = 0;
  virtual std::string decode(const std::vector<int32_t> &ids) const = 0;
  /// Where a long text may be cut so that its pieces encode as the whole:
  /// an n <= text.size() (near the end where possible) with
  /// encode(text + more) == encode(text[0, n)) + encode(text[n, end) + more)
  /// for whatever `more` follows; 0 when there is none. Corpora are
  /// tokenized in chunks cut here.
  virtual size_t cutPoint(std::string_view text) const = 0;
  /// Id appended after every document.
  virtual int32_t eot() const = 0;
  /// Smallest vocabulary that holds every id this tokenizer emits.
  virtual int32_t vocabSize() const = 0;
};

/// Bytes: id = byte value (0..255); documents end with id 0 (NUL never
/// occurs in text), so the vocabulary stays 256.
std::unique_ptr<Tokenizer> createByteTokenizer();
/// GPT-2 byte-level BPE from vocab.json and merges.txt; EOT = the id of
/// "<|endoftext|>" (50256 for GPT-2).
std::unique_ptr<Tokenizer> createGpt2Tokenizer(const std::string &vocabPath,
                                               const std::string &mergesPath);
/// "bytes" or "gpt2:VOCAB,MERGES".
std::unique_ptr<Tokenizer> createTokenizer(const std::string &spec);

} // namespace mapp::rt

#endif
