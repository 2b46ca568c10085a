//===- Generate.h - token generation from a training plan -------*- C++ -*-===//
//
// Samples the next token from the logits at the prefix's last position.
// With a KV cache (the default; KvDecoder.h) the prompt is run once
// (prefill) and each later token costs one single-position decode step; the
// prompt plus the new tokens must fit the plan's seq_length. Without
// (kvCache = false) the plan's forward runs on the growing prefix (padded to
// seq_length; the causal mask makes the padding invisible to earlier
// positions; the last seq_length tokens are kept once it is longer), one
// full [micro_batch_size, seq_length] forward per token.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_GENERATE_H
#define MAPP_RT_GENERATE_H

#include "mapp/rt/Executor.h"
#include "mapp/rt/ProbeSession.h"
#include "mapp/rt/Tokenizer.h"

#include <ostream>

namespace mapp::rt {

struct GenerateOptions {
  std::string prompt;
  int64_t maxNewTokens = 32;
  double temperature = 1.0;
  int64_t topK = 0;   // 0 = whole vocabulary
  bool greedy = false;
  uint64_t seed = 0;
  int64_t recordTopK = 20; // next-token probabilities kept per token
  bool kvCache = true;
};

struct GeneratedToken {
  int64_t position = 0; // index of the generated token (0 = first)
  int32_t token = 0;
  double prob = 0;      // its probability under the model (temperature 1)
  std::vector<std::pair<int32_t, double>> topk;
};

/// Index of the logits value (Temp named lm_head or logits, [B,T,V]); Error
/// when there is none.
int logitsValueIndex(const Program &p, int vocab);
/// logitsValueIndex, checked to be still intact after the forward; Error
/// explaining why otherwise.
int findLogitsValue(const Program &p, int vocab);

/// Generates; writes one JSON object per token to `out` (with the full
/// logits row) when given, and records tokens in `session` when given.
std::vector<GeneratedToken> generate(Executor &exec, const Tokenizer &tok,
                                     const GenerateOptions &o,
                                     ProbeSession *session, std::ostream *out);

} // namespace mapp::rt

#endif
