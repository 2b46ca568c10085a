//===- KvDecoder.h - incremental decoding with a key/value cache -*- C++ -*-===//
//
// Generation with a KV cache. The plan carries the training step; its
// Forward block is the model. At load time the runtime derives from that
// block a two-block program over batch 1:
//
//   prefill  tokens [1,T] at positions 0..T−1, logits [1,T,V]
//   decode   one token   [1,1] at position p,  logits [1,1,V]
//
// by retyping every per-token value [B,T,…] to [1,S,…] (the kernels of the
// forward are position-wise except attention), reading a positional
// parameter ([T,…] added to [B,T,…], GPT's wpe) through `embedding` at the
// positions instead of broadcasting it, and replacing each `attention` by
// `cached_attention`, which writes the new rotated keys and values into a
// per-layer [1,T,H] cache and attends over cache rows 0..p. Caches live in
// the derived program's arena, which nothing else writes, so they persist
// from one call to the next. A forward with a kernel that mixes positions in
// any other way (reshape, transpose, matmul, softmax, …) cannot be decoded
// incrementally: the derivation fails naming the instr.
//
// Why derive here and not in the compiler: every plan (imported GPT/LLaMA or
// exported from PyTorch, probes and perturbations included) can decode
// without a second compile; the derivation is the same graph rewrite a
// compiler pass would do, on the plan's instrs, and the derived program runs
// through the same executor, kernels and load-time kernel checks
// (runtime/README.md, "Generation with a KV cache").
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_KVDECODER_H
#define MAPP_RT_KVDECODER_H

#include "mapp/rt/Executor.h"

#include <memory>
#include <vector>

namespace mapp::rt {

/// The derived program and where its inputs and logits are.
struct KvDecodePlan {
  Plan plan; // one Program: block 0 = prefill, block 1 = decode
  struct Io {
    int tokens = -1, positions = -1, logits = -1;
  };
  Io prefill, decode;
  int caches = 0; // key + value caches
};

/// Derives the prefill/decode program from `p`'s Forward block(s) (a
/// single-rank plan); `logits` is the value whose last dim is the vocabulary
/// (findLogitsValue). Error naming the instr that cannot be decoded.
KvDecodePlan deriveKvDecodePlan(const Plan &plan, const Program &p,
                                int logits);

/// Runs the derived program on `full`'s backend with `full`'s parameters and
/// probe runtime.
class KvDecoder {
public:
  explicit KvDecoder(Executor &full);
  int maxPositions() const { return derived_.plan.seqLength; }
  /// Fills the caches for `tokens` (1 ≤ n ≤ T) at positions 0..n−1 and
  /// returns the logits at position n−1.
  std::vector<float> prefill(const std::vector<int32_t> &tokens, int64_t step);
  /// Appends `token` at `position` (≥ 1, after prefill or the previous
  /// decode) and returns its logits.
  std::vector<float> decode(int32_t token, int64_t position, int64_t step);

private:
  std::vector<float> run(int block, const KvDecodePlan::Io &io,
                         const std::vector<int32_t> &tokens,
                         const std::vector<int32_t> &positions, int64_t row,
                         int64_t step);
  Executor &full_;
  KvDecodePlan derived_;
  std::unique_ptr<Executor> exec_;
  int64_t filled_ = 0; // positions whose keys/values are in the cache
};

} // namespace mapp::rt

#endif
