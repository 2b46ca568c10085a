//===- ProbeRng.h - counter RNG of probes and perturbations -----*- C++ -*-===//
//
// Stateless, so any element of any step can be regenerated (by tests, by a
// device kernel) without replaying a stream. docs/megascope.md has the
// formulas; test/python/scope_ref.py re-implements them.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_PROBE_RNG_H
#define MAPP_RT_PROBE_RNG_H

#include "mapp/rt/Kernels.h"

#include <cmath>

namespace mapp::rt::probe_rng {

/// uniform in [0, 1) from the 53 high bits of splitmix64(key ^ splitmix64(n)).
inline double uniform(uint64_t key, uint64_t n) {
  return static_cast<double>(splitmix64(key ^ splitmix64(n)) >> 11) *
         (1.0 / 9007199254740992.0);
}
/// Box-Muller over draws 2n and 2n+1.
inline double normal(uint64_t key, uint64_t n) {
  double u1 = uniform(key, 2 * n), u2 = uniform(key, 2 * n + 1);
  return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * M_PI * u2);
}
/// The key of one (seed, step, microbatch) call of a perturbation.
inline uint64_t stepKey(uint64_t seed, int64_t step, int microbatch) {
  return splitmix64(seed ^ splitmix64(static_cast<uint64_t>(step) * 65536u +
                                      static_cast<uint64_t>(microbatch)));
}

} // namespace mapp::rt::probe_rng

#endif
