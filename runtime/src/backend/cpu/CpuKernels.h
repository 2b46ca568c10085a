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
#include "mapp/rt/Kernels.h"
#include "mapp/rt/ThreadPool.h"

namespace mapp::rt::cpu {

// clang-format off
#define MAPP_CPU_KERNELS(X)                                                    \
  X(embedding) X(embedding_grad) X(linear) X(matmul) X(reduce_sum) X(add)      \
  X(mul) X(scale) X(gelu) X(gelu_grad) X(silu) X(silu_grad) X(layer_norm)      \
  X(layer_norm_grad) X(rms_norm) X(rms_norm_grad) X(softmax) X(softmax_grad)   \
  X(attention) X(attention_grad) X(cached_attention) X(dropout) X(dropout_grad) X(cross_entropy)   \
  X(cross_entropy_grad) X(reshape) X(transpose) X(slice) X(slice_grad)         \
  X(concat) X(fill) X(grad_accumulate) X(global_norm) X(adamw) X(sgd)          \
  X(all_reduce) X(all_gather) X(reduce_scatter) X(all_to_all) X(send) X(recv)  \
  X(probe) X(perturb) X(reduce_max) X(vocab_ce_partials)                     \
  X(vocab_ce_partials_grad) X(ce_from_partials) X(ce_from_partials_grad)      \
  X(copy_to_group) X(scatter_to_group) X(grad_sync) X(param_gather)         \
  X(moe_router) X(moe_router_grad) X(moe_assign) X(moe_permute)               \
  X(moe_permute_grad) X(moe_unpermute) X(moe_unpermute_grad)                 \
  X(moe_grouped_matmul) X(moe_grouped_matmul_wgrad) X(moe_aux_loss)          \
  X(moe_aux_loss_grad) X(moe_z_loss) X(moe_z_loss_grad)  \
  X(ep_dispatch) X(ep_combine)
// clang-format on

#define MAPP_DECLARE_KERNEL(name) void name(const KernelArgs &a);
MAPP_CPU_KERNELS(MAPP_DECLARE_KERNEL)
#undef MAPP_DECLARE_KERNEL

/// The dimension attr `key` of a communication kernel on t, negative counted
/// from the back; Error naming the kernel when out of range. Shared with the
/// CUDA backend's communication kernels.
int64_t dimAttr(const KernelArgs &a, const char *key, const Tensor &t,
                const char *kernel);
/// y must be x with dimension `dim` scaled by num/den; Error otherwise.
void wantScaled(const Tensor &x, const Tensor &y, int64_t dim, int64_t num,
                int64_t den, const char *kernel, const CommGroup &g);

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
