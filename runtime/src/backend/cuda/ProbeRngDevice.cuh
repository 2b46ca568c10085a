//===- ProbeRngDevice.cuh - ProbeRng.h on the device (internal) -*- CUDA -*-===//
//
// The counter RNG of src/kernel/ProbeRng.h, formula for formula in double, so
// a device perturbation draws the same numbers for the same element as the
// CPU one and a device sketch uses the same projection (CudaProbeTest checks
// both against the CPU backend).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CUDA_PROBE_RNG_DEVICE_CUH
#define MAPP_RT_CUDA_PROBE_RNG_DEVICE_CUH

#include <cstdint>

namespace mapp::rt::cuda::device_rng {

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
__device__ __forceinline__ double uniform(uint64_t key, uint64_t n) {
  return static_cast<double>(splitmix64(key ^ splitmix64(n)) >> 11) *
         (1.0 / 9007199254740992.0);
}
__device__ __forceinline__ double normal(uint64_t key, uint64_t n) {
  double u1 = uniform(key, 2 * n), u2 = uniform(key, 2 * n + 1);
  return ::sqrt(-2.0 * ::log(1.0 - u1)) * ::cos(2.0 * 3.14159265358979323846 * u2);
}

} // namespace mapp::rt::cuda::device_rng

#endif
