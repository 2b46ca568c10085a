//===- Attention.h - tensor-core flash attention (internal) -----*- C++ -*-===//
#ifndef MAPP_RT_CUDA_ATTENTION_H
#define MAPP_RT_CUDA_ATTENTION_H

#include "CudaBackend.h"

#include <string>

namespace mapp::rt::cuda {

/// The WMMA kernels take bf16 q/k/v (and dO) with head dim 64 or 128,
/// 16-byte aligned rows.
bool flashSupported(int64_t D, DView q, DView k, DView v, DView x);
inline bool flashBwdSupported(DView, DView, DView) { return true; }

/// o (any storage) and lse [B·heads·T] from bf16 q, k, v laid out [B,T,H].
void flashForward(CudaBackend &be, DView q, DView k, DView v, DView o,
                  float *lse, int64_t B, int64_t T, int64_t H, int64_t heads,
                  int64_t D, float scale, int causal);
/// dq, dk, dv (any storage) given lse and delta = rowsum(dO∘O).
void flashBackward(CudaBackend &be, DView dout, DView q, DView k, DView v,
                   const float *lse, const float *delta, DView dq, DView dk,
                   DView dv, int64_t B, int64_t T, int64_t H, int64_t heads,
                   int64_t D, float scale, int causal);

/// The first version, on WMMA fragments with shared-memory accumulators
/// (MAPP_CUDA_ATTN=wmma selects it; kept for A/B timing).
void flashForwardWmma(CudaBackend &be, DView q, DView k, DView v, DView o,
                      float *lse, int64_t B, int64_t T, int64_t H,
                      int64_t heads, int64_t D, float scale, int causal);
void flashBackwardWmma(CudaBackend &be, DView dout, DView q, DView k, DView v,
                       const float *lse, const float *delta, DView dq,
                       DView dk, DView dv, int64_t B, int64_t T, int64_t H,
                       int64_t heads, int64_t D, float scale, int causal);

/// Which attention implementation runs (MAPP_CUDA_ATTN): auto (cuDNN where
/// it loads and has an engine for the shape, else own), own (mma.sync
/// kernels), cudnn (cuDNN or a clear error), wmma (the first own version).
using AttnImpl = CudaAttnImpl;
inline AttnImpl attnImpl(const CudaBackend &be) { return be.config().attn; }

/// One attention call's geometry: q/o [B,T,H] with H = heads·D; k/v
/// [B,T,kvHeads·D] (grouped-query attention when kvHeads < heads).
struct AttnCall {
  int64_t B, T, H, heads, D, kvHeads;
  float scale;
  int causal;
};

/// cuDNN's fused flash attention (CudnnAttention.cu) on bf16 operands, k/v
/// (and dK/dV) at their own kv-head width; stats are the lse of the own kernels. Each returns false, having
/// done nothing, when cuDNN is absent or has no engine for the shape (and
/// MAPP_CUDA_ATTN is not `cudnn`), so the caller runs its own kernels.
bool cudnnAttnForward(CudaBackend &be, const AttnCall &c, const void *q,
                      const void *k, const void *v, void *o, float *stats);
bool cudnnAttnBackward(CudaBackend &be, const AttnCall &c, const void *q,
                       const void *k, const void *v, const void *o,
                       const void *dout, const float *stats, void *dq, void *dk,
                       void *dv);
/// Library, version and per-shape plan outcomes (engine or failure reasons).
std::string cudnnAttnReport();
/// Without a GPU: loads cuDNN and builds every graph variant's tensors and
/// operations (all but the operation graph and plan, which need a device);
/// `ok` is false when cuDNN is absent or any descriptor is refused.
std::string cudnnAttnDryRun(bool &ok);

} // namespace mapp::rt::cuda

#endif
