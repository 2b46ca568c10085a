//===- Dataset.h - corpora, packing and batches -----------------*- C++ -*-===//
//
// A corpus becomes one token stream (documents each followed by the
// tokenizer's EOT id, or a Megatron indexed dataset as stored). The stream is
// cut into samples of seq_length+1 tokens that overlap by one token
// (sample i = tokens[i*T, i*T+T]); inputs are the first T, targets the last T.
// Samples are visited in a seeded shuffled order, epoch after epoch; see
// BatchLoader for the exact algorithm.
//
// Memory is bounded whatever the corpus's size (docs/reliability.md, "Memory
// of a corpus"): text is read and tokenized a chunk at a time into a
// temporary token file, a Megatron .bin is read where it lies, and training
// reads each sample from the file when it needs it. What stays in memory is
// kCorpusMemoryBytes at most while reading, plus the shuffle index (8 bytes
// a sample).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_DATASET_H
#define MAPP_RT_DATASET_H

#include "mapp/rt/Tokenizer.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mapp::rt {

/// Text is tokenized kTextChunkBytes at a time, cut where the tokenizer says
/// the encoding does not change (Tokenizer::cutPoint); a chunk grows up to
/// kMaxTextChunkBytes when no cut point comes sooner, and text without one in
/// that much is refused (2 MiB without a space after a non-space is no text).
constexpr size_t kTextChunkBytes = size_t(64) << 10;
constexpr size_t kMaxTextChunkBytes = size_t(2) << 20;
/// A JSONL line (one document) is read whole: longer lines are refused.
constexpr size_t kMaxJsonlLineBytes = size_t(32) << 20;
/// What reading a corpus may hold at once beyond the tokenizer's own tables
/// and the shuffle index, in the worst case: a JSONL line, its decoded text
/// and the parser's copy (3 x 32 MiB while parsing, 2 x 32 MiB after); one
/// text chunk with the GPT-2 tokenizer's working set for it (at most ~54
/// bytes a byte of text, when every character is a piece of its own: 2 MiB
/// -> 108 MiB; ~30 for prose); the BPE cache (2^16 pieces, ~13 MiB); the
/// token file's 4 MiB write buffer and a 1 MiB read block. Training then
/// holds one sample. test_corpus_memory.py measures a run against it.
constexpr size_t kCorpusMemoryBytes = size_t(256) << 20;

/// A corpus's token stream, read on demand.
class TokenStream {
public:
  virtual ~TokenStream() = default;
  virtual int64_t size() const = 0;
  /// Tokens [first, first + count) into `out`; the range must lie inside the
  /// stream. Safe to call from several threads.
  virtual void read(int64_t first, int64_t count, int32_t *out) const = 0;
  /// The largest id (-1 for an empty stream).
  virtual int32_t maxToken() const = 0;
};

/// A stream over tokens already in memory (tests, small inputs).
std::shared_ptr<const TokenStream> tokensInMemory(std::vector<int32_t> tokens);

/// Tokens written to an unlinked temporary file in $TMPDIR (else /tmp) and
/// read back with pread: 2 bytes a token when the vocabulary fits 16 bits,
/// else 4. Nothing is left behind, even when the process is killed.
class TokenFileWriter {
public:
  explicit TokenFileWriter(int32_t vocabSize);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter &) = delete;
  TokenFileWriter &operator=(const TokenFileWriter &) = delete;
  void append(const int32_t *ids, size_t n);
  /// The stream of everything appended; the writer is spent.
  std::shared_ptr<const TokenStream> finish();

private:
  void flush();
  std::string dir_;
  int fd_ = -1;
  int width_;
  int64_t count_ = 0;
  int32_t max_ = -1;
  std::vector<uint8_t> buf_;
  size_t used_ = 0;
};

/// Encodes one document handed over in pieces of any size: the text is
/// encoded a chunk at a time (kTextChunkBytes, cut where tok.cutPoint allows,
/// growing to kMaxTextChunkBytes when it must), so the ids are exactly those
/// of tok.encode(whole document) followed by tok.eot(), in bounded memory.
/// `where` names the document in errors ("FILE" or "FILE:LINE").
class DocumentEncoder {
public:
  using Sink = std::function<void(const std::vector<int32_t> &)>;
  DocumentEncoder(const Tokenizer &tok, Sink sink,
                  size_t chunkBytes = kTextChunkBytes,
                  size_t maxChunkBytes = kMaxTextChunkBytes);
  void feed(std::string_view text, const std::string &where);
  /// Encodes the rest of the document and its EOT.
  void finish();

private:
  void encodeReady(const std::string &where);
  const Tokenizer &tok_;
  Sink sink_;
  size_t chunk_, maxChunk_, limit_;
  std::string pending_;
  uint64_t consumed_ = 0; // bytes of this document already encoded
};

/// Calls fn(text, "FILE:LINE") for the "text" field of every line of a JSONL
/// file (blank lines skipped), one line in memory at a time.
void forEachJsonlText(
    const std::string &path,
    const std::function<void(std::string &&, const std::string &)> &fn);
/// The "text" field of every line of a JSONL file (blank lines skipped).
std::vector<std::string> readJsonlTexts(const std::string &path);
/// Tokenizes documents and appends tok.eot() after each.
std::vector<int32_t> tokenizeDocuments(const std::vector<std::string> &docs,
                                       const Tokenizer &tok);

/// Megatron-LM indexed dataset (PREFIX.idx + PREFIX.bin, "MMIDIDX" version 1):
/// all sequences concatenated in order, as stored (Megatron's preprocessing
/// already appends EOD when asked to). The sequences must lie back to back in
/// the .bin, as Megatron writes them: overlapping, out-of-order or gapped
/// sequences and ids outside int32 are refused at open. The .bin is read
/// where it lies, a sample at a time.
std::shared_ptr<const TokenStream>
openMegatronTokens(const std::string &prefix);
std::vector<int32_t> readMegatronTokens(const std::string &prefix);

/// Picks the format: "megatron" for .bin/.idx or format == "megatron",
/// "jsonl" otherwise (.json/.jsonl), "text" for .txt (one document), and
/// opens the corpus as a stream (text and JSONL tokenized into a token file).
std::shared_ptr<const TokenStream> openTokens(const std::string &path,
                                              const std::string &format,
                                              const Tokenizer *tok);
/// openTokens, read whole into memory (tests and small corpora).
std::vector<int32_t> loadTokens(const std::string &path,
                                const std::string &format,
                                const Tokenizer *tok);

/// splitmix64 generator: next() = splitmix64(state); state += golden ratio.
/// SplitMix64's state increment: the k-th draw of SplitMix64(s) is
/// splitmix64(s + k·kSplitMixGamma).
constexpr uint64_t kSplitMixGamma = 0x9E3779B97F4A7C15ULL;

class SplitMix64 {
public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next();

private:
  uint64_t state_;
};

/// Sample order of epoch e: start from the identity permutation of S samples,
/// rng = SplitMix64(seed + e); for i = S-1 down to 1: j = rng.next() % (i+1);
/// swap(perm[i], perm[j]). Without shuffling, the identity.
std::vector<int64_t> epochOrder(int64_t numSamples, uint64_t seed,
                                int64_t epoch, bool shuffle);

class BatchLoader {
public:
  BatchLoader(std::shared_ptr<const TokenStream> tokens, int seqLength,
              uint64_t seed, bool shuffle);
  BatchLoader(std::vector<int32_t> tokens, int seqLength, uint64_t seed,
              bool shuffle)
      : BatchLoader(tokensInMemory(std::move(tokens)), seqLength, seed,
                    shuffle) {}
  int64_t numSamples() const { return numSamples_; }
  int64_t numTokens() const { return tokens_->size(); }
  int seqLength() const { return seqLength_; }
  /// The g-th sample of the endless shuffled stream (epoch = g / S).
  void sample(int64_t g, int32_t *inputs, int32_t *targets);
  /// Rows of microbatch `mb` of `step` for data-parallel rank `dpRank`:
  /// row b is stream sample step*G + (dpRank*numMb + mb)*mbs + b, with
  /// G = dp*numMb*mbs samples per step. inputs/targets are [mbs, T].
  void microbatch(int64_t step, int dpRank, int dp, int numMb, int mb, int mbs,
                  int32_t *inputs, int32_t *targets);
  /// The same by the microbatch's place in the step's global batch of
  /// `perStepMb` microbatches (an uneven data-parallel split: dp rank d
  /// holds places sum(k_0..k_{d-1}) onwards).
  void microbatchAt(int64_t step, int64_t perStepMb, int64_t index, int mbs,
                    int32_t *inputs, int32_t *targets);
  /// Largest id in the stream (to check against the plan's vocab).
  int32_t maxToken() const { return tokens_->maxToken(); }

private:
  std::shared_ptr<const TokenStream> tokens_;
  int seqLength_;
  uint64_t seed_;
  bool shuffle_;
  int64_t numSamples_;
  int64_t epoch_ = -1;
  std::vector<int64_t> order_;
  std::vector<int32_t> window_; // one sample's seq_length + 1 tokens
};

} // namespace mapp::rt

#endif
