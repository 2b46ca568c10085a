//===- Weights.h - parameter initialization ---------------------*- C++ -*-===//
#ifndef MAPP_RT_WEIGHTS_H
#define MAPP_RT_WEIGHTS_H

#include "mapp/rt/DType.h"

#include <cstdint>
#include <string>

namespace mapp::rt {

enum class InitKind { Normal, Ones, Zeros };

/// Rule by name and shape: names ending in "bias" or "beta" -> zeros; other
/// rank-1 tensors (norm gammas, whatever their name) -> ones; everything of
/// rank >= 2 (matrices, embeddings) -> normal(0, 0.02).
InitKind initKindFor(const std::string &name, const Shape &shape);

/// A layer's fp8 delayed-scaling state (`<layer>.fp8_meta`, written by
/// --mapp-mixed-precision compute=fp8): initialized to scale 1 and an empty
/// amax history, and left at that when a weights file lacks it.
bool isFp8Meta(const std::string &name);

/// Fills `out` (numel(shape) floats) deterministically from (seed, name):
/// independent of parameter order. Normal draws use Box-Muller over the
/// splitmix64 stream seeded with seed ^ fnv1a64(name), two uniforms
/// u1, u2 = (next() >> 11) * 2^-53 per pair of outputs, z0 = r·cos(2πu2),
/// z1 = r·sin(2πu2), r = sqrt(-2 ln(1 - u1)).
void initParam(const std::string &name, const Shape &shape, uint64_t seed,
               float *out);

uint64_t fnv1a64(const std::string &s);

} // namespace mapp::rt

#endif
