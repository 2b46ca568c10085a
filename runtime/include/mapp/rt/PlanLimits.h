//===- PlanLimits.h - the largest plan the runtime accepts ------*- C++ -*-===//
//
// One set of bounds for the compiler and the runtime: the compiler refuses,
// with a located error and before it allocates anything sized by them,
// options and model configs the runtime's plan verifier would refuse (or
// that would exhaust memory long before a plan exists). Header-only and
// dependency-free, like KernelVocab.h: the compiler includes it, the runtime
// never includes MLIR. docs/reliability.md lists the bounds.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_PLANLIMITS_H
#define MAPP_RT_PLANLIMITS_H

#include <cstdint>

namespace mapp::rt {

/// Microbatches per step: the executor keeps per-microbatch bookkeeping
/// (mapp-fuzz-plan: 2^31 microbatches made every step allocate 16 GiB; the
/// compiler's schedule tables are two tasks per microbatch and stage).
inline constexpr int64_t kMaxMicrobatches = int64_t(1) << 20;

/// (stage, chunk, microbatch) triples of a schedule: its task tables hold
/// two tasks (forward, backward) for each; bounds the compiler's tables.
inline constexpr int64_t kMaxScheduleSlots = int64_t(1) << 22;

/// Ranks in a world (tp x pp x dp, plus a MegaFBD forward side): one program
/// per rank in the plan.
inline constexpr int64_t kMaxWorldSize = int64_t(1) << 16;

/// Largest tensor: keeps every byte computation far from overflow.
inline constexpr uint64_t kMaxTensorBytes = uint64_t(1) << 48;

/// micro_batch_size x seq_length: the kernels index a microbatch's tokens
/// with an int.
inline constexpr int64_t kMaxTokensPerMicrobatch = INT32_MAX;

/// Model shape (the compiler's GPT importer and python/mapp/config.py):
/// several times the largest published models; the graph of 1024 layers
/// imports in under a second and 75 MB (docs/benchmarks.md).
inline constexpr int64_t kMaxLayers = 1024;
inline constexpr int64_t kMaxHiddenSize = int64_t(1) << 17;
inline constexpr int64_t kMaxFfnHiddenSize = int64_t(1) << 19;
inline constexpr int64_t kMaxAttentionHeads = int64_t(1) << 12;
inline constexpr int64_t kMaxVocabSize = int64_t(1) << 22;
inline constexpr int64_t kMaxSeqLength = int64_t(1) << 20;
inline constexpr int64_t kMaxMicroBatchSize = int64_t(1) << 16;
inline constexpr int64_t kMaxExperts = int64_t(1) << 12;

} // namespace mapp::rt

#endif
