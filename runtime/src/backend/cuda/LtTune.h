//===- LtTune.h - timed choice among cuBLASLt's candidates ------*- C++ -*-===//
//
// The heuristic's first algorithm is often not the fastest on the real
// operands, so a GEMM plan (Gemm.cu, Fp8Gemm.cu, Moe.cu) times its
// candidates on its first large call and keeps the fastest.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CUDA_LTTUNE_H
#define MAPP_RT_CUDA_LTTUNE_H

#include "CudaBackend.h"
#include "CudaHandles.h"

#include <cublasLt.h>

#include <cstdint>
#include <vector>

namespace mapp::rt::cuda {

/// Worth timing: more than one candidate, at least 2^30 multiply-adds (a
/// smaller product is over before timing pays), MAPP_CUDA_GEMM_TUNE not 0.
inline bool worthTuning(const CudaBackend &be, size_t candidates, int64_t macs) {
  return be.config().gemmTune && candidates > 1 && macs >= (int64_t(1) << 30);
}

/// Runs each candidate twice through `run(algo)` (cuBLASLt's status) on
/// stream `s`, timing the second run; the index of the fastest that ran, or
/// -1 when none did. Synchronizes with the stream once per run.
template <typename Run>
int fastestAlgo(cudaStream_t s, const std::vector<cublasLtMatmulAlgo_t> &candidates,
                Run &&run) {
  Event e0, e1;
  MAPP_CUDA_CHECK(cudaEventCreate(e0.out()));
  MAPP_CUDA_CHECK(cudaEventCreate(e1.out()));
  float best = 1e30f;
  int bestIndex = -1;
  for (size_t i = 0; i < candidates.size(); ++i) {
    float ms = 0;
    bool ok = true;
    for (int rep = 0; rep < 2 && ok; ++rep) {
      MAPP_CUDA_CHECK(cudaEventRecord(e0, s));
      ok = run(candidates[i]) == CUBLAS_STATUS_SUCCESS;
      MAPP_CUDA_CHECK(cudaEventRecord(e1, s));
      MAPP_CUDA_CHECK(cudaEventSynchronize(e1));
      MAPP_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    }
    if (ok && ms < best) {
      best = ms;
      bestIndex = static_cast<int>(i);
    }
  }
  return bestIndex;
}

} // namespace mapp::rt::cuda

#endif
