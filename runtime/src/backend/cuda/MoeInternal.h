//===- MoeInternal.h - shared by the MoE kernel files (internal) -*- C++ -*-===//
//
// Moe.cu (router, assign, permute), MoeGemm.cu (grouped matmuls) and
// MoeLosses.cu (router losses).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CUDA_MOE_INTERNAL_H
#define MAPP_RT_CUDA_MOE_INTERNAL_H

#include "CudaBackend.h"

#include <cstdint>

namespace mapp::rt::cuda::moe {

/// Warps per block of the kernels that give each row (token) a warp.
constexpr int kWarpsPerBlock = 8;

/// Blocks for one warp per row.
inline int warpRowsGrid(int64_t rows) {
  int64_t b = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<int>(b < 1 ? 1 : b);
}

/// Queues a copy of moe_assign's `counts` into pinned host memory (and a
/// device snapshot) behind the kernel, for the grouped GEMMs (MoeGemm.cu).
void mirrorCounts(CudaBackend &be, const Tensor &counts);
/// dw[g] = x_gᵀ·dy_g + beta·dw[g] per expert g (rows by `counts`): the
/// grouped wgrad, accumulating into a gradient with beta = 1 (Fusion.cu).
void groupedWgrad(CudaBackend &be, const Tensor &x, const Tensor &dy,
                  const Tensor &counts, const Tensor &dw, float beta);

} // namespace mapp::rt::cuda::moe

#endif
