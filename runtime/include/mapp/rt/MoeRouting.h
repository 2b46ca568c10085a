//===- MoeRouting.h - MoE top-k and slot assignment rules -------*- C++ -*-===//
//
// The data-dependent routing rules of docs/moe.md, shared by the backends
// (the CUDA backend assigns slots on the host: the counts decide its GEMM
// launches anyway).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_MOE_ROUTING_H
#define MAPP_RT_MOE_ROUTING_H

#include <cstdint>

namespace mapp::rt {

/// The k largest of x[0..n) in descending order, ties to the lower index.
void topkRow(const float *x, int64_t n, int64_t k, int32_t *top);

/// moe_assign: choices (token t, j) of experts [tokens, k] grouped by expert
/// in token order; with capacity > 0 each expert keeps its `capacity`
/// highest-probability choices (ties: lower token index) and the others get
/// slot -1. counts[e] = kept choices of expert e. Expert ids must be in
/// [0, experts) (checked by the caller).
void assignSlots(const float *probs, const int32_t *experts, int64_t tokens,
                 int64_t k, int64_t numExperts, int64_t capacity,
                 int32_t *slots, int32_t *counts);

} // namespace mapp::rt

#endif
