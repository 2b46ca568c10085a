//===- Fusion.h - runtime epilogue fusion of the CUDA backend ---*- C++ -*-===//
//
// The plan stays as the compiler wrote it; when a program is bound, the CUDA
// backend looks for instruction pairs it can run as one cuBLASLt call
// (docs/cuda-backend.md, "Epilogue fusion"):
//   linear → gelu(tanh)            GELU_AUX_BIAS: writes the pre-activation
//                                  (the aux output, read later by
//                                  gelu_grad) and the GELU output at once
//   matmul(transpose_a) → reduce_sum over the same rows
//                                  BGRADB: the bias gradient of a
//                                  weight-gradient GEMM
//   matmul → grad_accumulate       beta = 1 straight into the Grad buffer
//   moe_grouped_matmul_wgrad → grad_accumulate
//                                  the same, per expert (MoeGemm.cu)
//   linear → add of its output     beta = 1 with the add's other operand as
//                                  C (the residual stream), D the sum
//   matmul → gelu_grad(tanh) of its product
//                                  DGELU at the gelu_grad: the data gradient
//                                  of fc2 times gelu'(pre-activation), the
//                                  product itself never written
//   layer_norm_grad / rms_norm_grad → add of dx
//                                  the norm backward writes dx + the other
//                                  operand (the residual gradient)
// The first instruction of a pair runs the fused call, the second becomes a
// no-op. A pair is fused only when running the second instruction's work
// early is invisible: same block, the partner's output is neither read nor
// written by any instruction in between (byte ranges, since the memory plan
// reuses slots), it overlaps none of the fused call's inputs, and for
// grad_accumulate the contribution has no other reader in the program.
// Kernels find their role through the identity of their Instr's attrs (the
// executor passes `instr.attrs` by reference).
//
// Optimizer groups: a run of adjacent adamw (or sgd) instrs of one block with
// the same attrs (ZeRO ranges and parameter names aside), the same norm
// operand, pool-resident fp32 operands and no operand shared between members
// runs as one multi-tensor launch (OptimGroup.cu) at the first instr; the
// others become no-ops. Adjacency means nothing runs between the updates, so
// running them early is invisible; any other instr (trace_begin/trace_end
// included) ends a group, so trace regions keep their meaning.
//
// MAPP_CUDA_FUSE=0 turns every fusion off; a comma list of gelu, bgrad,
// accumulate, adam, sgd, residual, dgelu picks some.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CUDA_FUSION_H
#define MAPP_RT_CUDA_FUSION_H

#include "mapp/rt/Backend.h"
#include "mapp/rt/BackendConfig.h"
#include "mapp/rt/Plan.h"

#include <string>
#include <unordered_map>
#include <vector>

namespace mapp::rt::cuda {

class CudaBackend;

/// What a GEMM's epilogue does besides the product (Gemm.cu).
struct GemmExtras {
  const Tensor *bias = nullptr; // + bias[N] on every row (bf16 or fp32)
  bool gelu = false;           // output = gelu_tanh(product + bias) ...
  Tensor geluPre;              // ... and the pre-activation here
  float *biasGrad = nullptr;   // column sums of op(A) (transpose_a only)
  float beta = 0.0f;           // output = product + beta · output
  const Tensor *addend = nullptr; // output = product (+ bias) + addend,
                                  // stored like the output (beta = 1, C ≠ D)
  const Tensor *dgeluPre = nullptr; // output = product · gelu_tanh'(pre)
};

/// act = gelu_tanh(x·wᵀ + bias), pre = x·wᵀ + bias, in one GEMM. False when
/// cuBLASLt cannot do it for these operands (nothing was written).
bool linearGelu(CudaBackend &be, const Tensor &x, const Tensor &w,
                const Tensor *bias, const Tensor &pre, const Tensor &act);
/// dw = dyᵀ·x + beta·dw over the rows of dy [R,M] and x [R,N]; when biasGrad
/// is set, also biasGrad[M] = column sums of dy. False as above.
bool wgradGemm(CudaBackend &be, const Tensor &dy, const Tensor &x,
               const Tensor &dw, float *biasGrad, float beta);

/// dpre = (dy·op(w)) · gelu_tanh'(pre) in one GEMM (w 2-D, shared by every
/// row of dy). False as above.
bool dgradGelu(CudaBackend &be, const Tensor &dy, const Tensor &w, bool transW,
               const Tensor &pre, const Tensor &dpre);
/// How many GEMM plans so far had their epilogue (bias, GELU, bias
/// gradient, accumulation) refused by cuBLASLt and ran as separate kernels
/// (each is said once on stderr): tests require none.
int gemmRefusals();
/// linear's bias operand, or null without one.
const Tensor *linearBias(const KernelArgs &a);
/// out = x·wᵀ + bias + addend in one GEMM (addend stored like out; it may
/// be out itself). False as above.
bool linearAdd(CudaBackend &be, const Tensor &x, const Tensor &w,
               const Tensor *bias, const Tensor &addend, const Tensor &out);
/// layer_norm_grad (rms: rms_norm_grad) of `a`, writing dx + res to `sum`
/// in place of dx (Norm.cu).
void normGradResidual(const KernelArgs &a, bool rms, const Tensor &res,
                      const Tensor &sum);

/// The role of one instruction in a fused pair or optimizer group.
struct FusedOp {
  enum Kind {
    Skip,
    LinearGelu,
    Wgrad,
    OptimGroup,
    LinearAdd,
    NormGradAdd,
    DgradGelu,  // at the gelu_grad; partner: the matmul, which is skipped
    ExpertWgrad // the MoE grouped wgrad adding into its accumulate's Grad
  } kind = Skip;
  const Instr *self = nullptr;
  const Instr *partner = nullptr;     // LinearGelu: the gelu; *Add: the add
  const Instr *biasGrad = nullptr;    // Wgrad: the reduce_sum it absorbs
  const Instr *accumulate = nullptr;  // (Expert)Wgrad: the grad_accumulate
  int group = -1;                     // OptimGroup: its FusionTable index
};

/// Adjacent optimizer instrs updated by one multi-tensor launch.
struct OptimGroup {
  std::vector<const Instr *> members; // adamw or sgd, in plan order
  // Set when the program is bound (bindOptimGroups): the fp32 master of
  // the first member, and the members' chunk descriptors on the device.
  const void *leadParam = nullptr;
  const void *chunks = nullptr;
  int numChunks = 0;
  int64_t blocks = 0; // the launch's grid
};

/// Which fusions MAPP_CUDA_FUSE enables (parsed by CudaConfig).
struct FusionSwitches : CudaFusionSwitches {
  /// CudaConfig::fusionFromEnv(): "1"/unset, "0", or a comma list; Error on
  /// an unknown word.
  static FusionSwitches fromEnv() { return {CudaConfig::fusionFromEnv()}; }
};

struct FusionTable {
  std::unordered_map<const Attrs *, FusedOp> ops;
  std::vector<OptimGroup> optimGroups;
  int linearGelu = 0, biasGrad = 0, accumulate = 0, linearAdd = 0,
      normGradAdd = 0, dgradGelu = 0;
  int adamGroups = 0, adamGrouped = 0, sgdGroups = 0, sgdGrouped = 0;
  const FusedOp *find(const Attrs &a) const {
    if (ops.empty())
      return nullptr;
    auto it = ops.find(&a);
    return it == ops.end() ? nullptr : &it->second;
  }
};

/// Finds the fusible pairs of a program (see the file comment).
FusionTable planFusions(const Program &p, const FusionSwitches &on);

/// Resolves the operands of t's optimizer groups in the bound program of
/// `be` (pool addresses are fixed by the memory plan) and uploads their
/// chunk descriptors once; returns that device allocation (null when there
/// are no groups), which the caller frees when it binds the next program.
void *bindOptimGroups(CudaBackend &be, const Program &p, FusionTable &t);
/// The multi-tensor update of group g, called by its first instr.
void runOptimGroup(const KernelArgs &a, const OptimGroup &g);

/// Runs the kernel's fused role, if it has one: true when the call is done.
bool runFused(const KernelArgs &a);

/// "linear+gelu N, bgrad N, accumulate N, adam G (I instrs), sgd G (I
/// instrs), linear+add N, norm_grad+add N, matmul+gelu_grad N" of the bound program of a CUDA backend (for tests and
/// MAPP_CUDA_FUSE_LOG=1).
std::string fusionSummary(Backend &cudaBackend);

} // namespace mapp::rt::cuda

#endif
