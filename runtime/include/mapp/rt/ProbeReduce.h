//===- ProbeReduce.h - reductions of the probe kernel -----------*- C++ -*-===//
//
// Pure functions over host fp32 data, shared by the CPU probe kernel, the
// conformance tool (runtime/test/mapp-probe-check.cpp, checked against numpy
// in pytest) and later a device backend that copies to the host. Attribute
// names and meanings: docs/megascope.md.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_PROBEREDUCE_H
#define MAPP_RT_PROBEREDUCE_H

#include "mapp/rt/Attrs.h"
#include "mapp/rt/Probe.h"
#include "mapp/rt/Tensor.h"

namespace mapp::rt {

/// Elements of `x` at the token positions in the probe's `tokens` attr
/// (dim 1 of a [B,T,...] tensor), in order; every element without `tokens`.
std::vector<float> selectTokens(const Attrs &a, const float *x,
                                const Shape &shape);

/// Every reduction the probe's `reduce` attr lists, over `x` (already
/// token-selected; `inner` = elements per token row, used by sketch/PCA).
std::vector<ProbeSample> reduceValues(const Attrs &a,
                                      const std::vector<float> &x,
                                      int64_t inner);

/// The `attn` reduction: softmax(scale·q·kᵀ + causal mask) of batch row 0
/// per head, [heads, rows, T] with rows = the selected query positions.
ProbeSample attentionProbs(const Attrs &a, const float *q, const float *k,
                           const Shape &shape);
/// The `attn` reduction under a KV cache (generation): rows for the queries
/// q [B,S,H] at `positions` (batch row 0) over the rotated keys of
/// `kcache` [B,tmax,H], [heads, S, tmax] with zeros past each position.
ProbeSample attentionProbsCached(const Attrs &a, const float *q,
                                 const float *kcache, const int32_t *positions,
                                 const Shape &qShape, int64_t tmax);

/// What a `lens` reduction reads from its attrs, for a residual of T
/// positions and a vocabulary: the positions (`tokens`, default all, each
/// inside [0, T)), k (at most the vocabulary), the norm and eps. The CPU
/// reduction and the CUDA one share it, so both read the attrs alike.
struct LensSpec {
  std::vector<int64_t> positions;
  int64_t k = 0;
  bool rms = false;
  double eps = 1e-5;
};
LensSpec lensSpec(const Attrs &a, int64_t T, int64_t vocab);

/// The `lens` reduction (logit lens): batch row 0 of the residual stream
/// x [B,T,H] through the final norm (attr `norm` = layer_norm with gamma and
/// beta, or rms_norm with gamma and beta null; `eps`) and the unembedding
/// w [vocab,H]; per selected position (`tokens`, default all) the `k` most
/// likely token ids (index) and their softmax probabilities (data), [R, k].
ProbeSample logitLens(const Attrs &a, const float *x, const float *gamma,
                      const float *beta, const float *w, const Shape &xShape,
                      int64_t vocab);

/// Load-time checks of a probe instr (reductions known, parameters valid);
/// throws Error without a location prefix.
void checkProbeAttrs(const Attrs &a, const std::vector<TensorType> &in);
/// Bounds on a switch's magnitude (docs/megascope.md): any kind at most
/// kMaxMagnitude in absolute value; gaussian (the noise's standard
/// deviation) >= 0; uniform (the relative spread) in [0, 1].
constexpr double kMaxMagnitude = 1000.0;
/// "" when `m` is allowed for a perturbation of `kind` ("" = kind unknown:
/// only the common bound), else why not.
std::string magnitudeProblem(const std::string &kind, double m);

/// Load-time checks of a perturb instr.
void checkPerturbAttrs(const Attrs &a, const std::vector<TensorType> &in);

/// Applies a perturbation kind to x -> y (may alias) with the counter RNG
/// of docs/megascope.md. `enabled` false copies.
void applyPerturbation(const Attrs &a, const SwitchState &s, int64_t step,
                       int microbatch, const float *x, float *y, int64_t n,
                       int64_t lastDim);

} // namespace mapp::rt

#endif
