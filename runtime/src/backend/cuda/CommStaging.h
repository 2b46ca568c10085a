//===- CommStaging.h - pieces the CUDA communication kernels share -*- C++ -*-===//
//
// Defined in CommKernels.cu; used by its kernels and by the context-parallel
// ones (ContextParallel.cu). Private to backend/cuda.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_BACKEND_CUDA_COMMSTAGING_H
#define MAPP_RT_BACKEND_CUDA_COMMSTAGING_H

#include "../cpu/CpuKernels.h"
#include "CudaBackend.h"

namespace mapp::rt::cuda::commk {

/// Runs the CPU backend's kernel on host fp32 copies of the operands (any
/// host communicator; a device sync per call).
void staged(const KernelArgs &a, KernelFn cpuFn, bool writesInputs = false);

/// The kernel's communication group (attribute "group", default given).
CommGroup groupOf(const KernelArgs &a, const char *defaultGroup);

/// Elements before / at / after `dim`.
struct View3 {
  int64_t outer = 1, mid = 1, inner = 1;
};
View3 view3(const Shape &s, int64_t dim);

/// Between [outer][n][block] (interleaved) and [n][outer][block]
/// (member-major): toMemberMajor packs, otherwise unpacks.
void permute(DView src, DView dst, int64_t outer, int n, int64_t block,
             bool toMemberMajor, cudaStream_t s);

} // namespace mapp::rt::cuda::commk

#endif // MAPP_RT_BACKEND_CUDA_COMMSTAGING_H
