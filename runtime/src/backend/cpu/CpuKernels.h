//===- CpuKernels.h - fp32 reference kernels (internal) ---------*- C++ -*-===//
//
// One function per kernel of docs/semantics.md. Shapes were checked at load
// time (KernelSpecs.cpp); kernels only check data-dependent conditions
// (ids and targets in range).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CPU_KERNELS_H
#define MAPP_RT_CPU_KERNELS_H

#include "mapp/rt/Comm.h"
#include "mapp/rt/KernelVocab.h"
#include "mapp/rt/Kernels.h"
#include "mapp/rt/ThreadPool.h"

namespace mapp::rt::cpu {

// One function per kernel of KernelVocab.def whose cpu column is Y.
#define MAPP_KERNEL(name, minIn, maxIn, minOut, maxOut, check, props, onCpu,    \
                    onCuda, why)                                                 \
  MAPP_VOCAB_IF(onCpu, void name(const KernelArgs &a);)
#include "mapp/rt/KernelVocab.def"
#undef MAPP_KERNEL

/// (index of this rank in the kernel's `group` attr, group size); (0, 1)
/// without a `group` or a communicator.
std::pair<int, int> groupPosition(const KernelArgs &a);

/// Runs fn(begin, end) over [0, n) on the context's pool (serially without).
template <typename Fn>
void parFor(const KernelArgs &a, int64_t n, int64_t grain, Fn &&fn) {
  if (a.ctx.pool && a.ctx.pool->size() > 1 && n > grain)
    a.ctx.pool->parallelFor(n, grain, fn);
  else if (n > 0)
    fn(0, n);
}

/// Rows of a [..., last] tensor.
inline int64_t rowsOf(const Tensor &t) {
  int64_t last = t.rank() ? t.dim(-1) : 1;
  return last ? t.numel() / last : 0;
}

} // namespace mapp::rt::cpu

#endif
