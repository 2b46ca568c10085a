//===- Dataset.h - corpora, packing and batches -----------------*- C++ -*-===//
//
// A corpus becomes one token stream (documents each followed by the
// tokenizer's EOT id, or a Megatron indexed dataset as stored). The stream is
// cut into samples of seq_length+1 tokens that overlap by one token
// (sample i = tokens[i*T, i*T+T]); inputs are the first T, targets the last T.
// Samples are visited in a seeded shuffled order, epoch after epoch; see
// BatchLoader for the exact algorithm.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_DATASET_H
#define MAPP_RT_DATASET_H

#include "mapp/rt/Tokenizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mapp::rt {

/// The "text" field of every line of a JSONL file (blank lines skipped).
std::vector<std::string> readJsonlTexts(const std::string &path);
/// Tokenizes documents and appends tok.eot() after each.
std::vector<int32_t> tokenizeDocuments(const std::vector<std::string> &docs,
                                       const Tokenizer &tok);

/// Megatron-LM indexed dataset (PREFIX.idx + PREFIX.bin, "MMIDIDX" version 1):
/// all sequences concatenated in order, as stored (Megatron's preprocessing
/// already appends EOD when asked to).
std::vector<int32_t> readMegatronTokens(const std::string &prefix);

/// Picks the format: "megatron" for .bin/.idx or format == "megatron",
/// "jsonl" otherwise (.json/.jsonl), "text" for .txt (one document).
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
  BatchLoader(std::vector<int32_t> tokens, int seqLength, uint64_t seed,
              bool shuffle);
  int64_t numSamples() const { return numSamples_; }
  int64_t numTokens() const { return static_cast<int64_t>(tokens_.size()); }
  int seqLength() const { return seqLength_; }
  /// The g-th sample of the endless shuffled stream (epoch = g / S).
  void sample(int64_t g, int32_t *inputs, int32_t *targets);
  /// Rows of microbatch `mb` of `step` for data-parallel rank `dpRank`:
  /// row b is stream sample step*G + (dpRank*numMb + mb)*mbs + b, with
  /// G = dp*numMb*mbs samples per step. inputs/targets are [mbs, T].
  void microbatch(int64_t step, int dpRank, int dp, int numMb, int mb, int mbs,
                  int32_t *inputs, int32_t *targets);
  /// Largest id in the stream (to check against the plan's vocab).
  int32_t maxToken() const;

private:
  std::vector<int32_t> tokens_;
  int seqLength_;
  uint64_t seed_;
  bool shuffle_;
  int64_t numSamples_;
  int64_t epoch_ = -1;
  std::vector<int64_t> order_;
};

} // namespace mapp::rt

#endif
