//===- FusionCases.h - fused GEMM pairs vs unfused vs fp64 ------*- C++ -*-===//
#ifndef MAPP_TEST_GPU_FUSION_CASES_H
#define MAPP_TEST_GPU_FUSION_CASES_H

#include "mapp/rt/Backend.h"

namespace mapp::test {

struct FusionTally {
  int total = 0, failed = 0;
};

/// Small programs holding each fusible pair, bound and run like the executor
/// does, with MAPP_CUDA_FUSE=1 and =0; prints one line per check.
FusionTally runFusionCases(rt::Backend &gpu);

} // namespace mapp::test

#endif
