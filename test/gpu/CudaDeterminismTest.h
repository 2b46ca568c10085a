//===- CudaDeterminismTest.h - two-call bit-identity checks -----*- C++ -*-===//
#ifndef MAPP_TEST_GPU_CUDADETERMINISMTEST_H
#define MAPP_TEST_GPU_CUDADETERMINISMTEST_H

#include "mapp/rt/Backend.h"

namespace mapp::test {

struct DeterminismTally {
  int total = 0, failed = 0;
};

/// embedding_grad, global_norm, sumSquares and attention_grad on `det` (a
/// backend created under MAPP_CUDA_DETERMINISTIC=1): each called twice,
/// outputs compared byte for byte and against double sums.
DeterminismTally runDeterminismCases(rt::Backend &det);

} // namespace mapp::test

#endif
