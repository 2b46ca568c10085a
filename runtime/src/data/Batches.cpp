//===- Batches.cpp - sample packing and the shuffled stream ---------------===//
#include "mapp/rt/Dataset.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Kernels.h"

#include <algorithm>
#include <numeric>

using namespace mapp::rt;

uint64_t SplitMix64::next() {
  uint64_t r = splitmix64(state_);
  state_ += kSplitMixGamma;
  return r;
}

std::vector<int64_t> mapp::rt::epochOrder(int64_t numSamples, uint64_t seed,
                                          int64_t epoch, bool shuffle) {
  std::vector<int64_t> order(numSamples);
  std::iota(order.begin(), order.end(), 0);
  if (!shuffle)
    return order;
  SplitMix64 rng(seed + static_cast<uint64_t>(epoch));
  for (int64_t i = numSamples - 1; i >= 1; --i) {
    int64_t j = static_cast<int64_t>(rng.next() % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

BatchLoader::BatchLoader(std::shared_ptr<const TokenStream> tokens,
                         int seqLength, uint64_t seed, bool shuffle)
    : tokens_(std::move(tokens)), seqLength_(seqLength), seed_(seed),
      shuffle_(shuffle) {
  if (seqLength_ < 1)
    fail("data: seq_length must be >= 1");
  int64_t n = tokens_->size();
  numSamples_ = n > 0 ? (n - 1) / seqLength_ : 0;
  if (numSamples_ == 0)
    fail("data: the corpus has ", n, " tokens; one sample needs ",
         seqLength_ + 1);
  window_.resize(static_cast<size_t>(seqLength_) + 1);
}

void BatchLoader::sample(int64_t g, int32_t *inputs, int32_t *targets) {
  int64_t epoch = g / numSamples_;
  if (epoch != epoch_) {
    order_ = epochOrder(numSamples_, seed_, epoch, shuffle_);
    epoch_ = epoch;
  }
  tokens_->read(order_[g % numSamples_] * seqLength_, seqLength_ + 1,
                window_.data());
  std::copy(window_.begin(), window_.end() - 1, inputs);
  std::copy(window_.begin() + 1, window_.end(), targets);
}

void BatchLoader::microbatch(int64_t step, int dpRank, int dp, int numMb,
                             int mb, int mbs, int32_t *inputs,
                             int32_t *targets) {
  microbatchAt(step, static_cast<int64_t>(dp) * numMb,
               static_cast<int64_t>(dpRank) * numMb + mb, mbs, inputs, targets);
}

void BatchLoader::microbatchAt(int64_t step, int64_t perStepMb, int64_t index,
                               int mbs, int32_t *inputs, int32_t *targets) {
  int64_t first = (step * perStepMb + index) * mbs;
  for (int b = 0; b < mbs; ++b)
    sample(first + b, inputs + static_cast<int64_t>(b) * seqLength_,
           targets + static_cast<int64_t>(b) * seqLength_);
}
