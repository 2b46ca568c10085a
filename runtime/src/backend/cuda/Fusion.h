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
// The first instruction of a pair runs the fused call, the second becomes a
// no-op. A pair is fused only when running the second instruction's work
// early is invisible: same block, the partner's output is neither read nor
// written by any instruction in between (byte ranges, since the memory plan
// reuses slots), it overlaps none of the fused call's inputs, and for
// grad_accumulate the contribution has no other reader in the program.
// Kernels find their role through the identity of their Instr's attrs (the
// executor passes `instr.attrs` by reference). MAPP_CUDA_FUSE=0 turns every
// fusion off; a comma list of gelu,bgrad,accumulate picks some.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CUDA_FUSION_H
#define MAPP_RT_CUDA_FUSION_H

#include "mapp/rt/Backend.h"
#include "mapp/rt/Plan.h"

#include <string>
#include <unordered_map>
#include <vector>

namespace mapp::rt::cuda {

class CudaBackend;

/// What a GEMM's epilogue does besides the product (Gemm.cu).
struct GemmExtras {
  const float *bias = nullptr; // + bias[N] on every row (fp32)
  bool gelu = false;           // output = gelu_tanh(product + bias) ...
  Tensor geluPre;              // ... and the pre-activation here
  float *biasGrad = nullptr;   // column sums of op(A) (transpose_a only)
  float beta = 0.0f;           // output = product + beta · output
};

/// act = gelu_tanh(x·wᵀ + bias), pre = x·wᵀ + bias, in one GEMM. False when
/// cuBLASLt cannot do it for these operands (nothing was written).
bool linearGelu(CudaBackend &be, const Tensor &x, const Tensor &w,
                const float *bias, const Tensor &pre, const Tensor &act);
/// dw = dyᵀ·x + beta·dw over the rows of dy [R,M] and x [R,N]; when biasGrad
/// is set, also biasGrad[M] = column sums of dy. False as above.
bool wgradGemm(CudaBackend &be, const Tensor &dy, const Tensor &x,
               const Tensor &dw, float *biasGrad, float beta);

/// The role of one instruction in a fused pair.
struct FusedOp {
  enum Kind { Skip, LinearGelu, Wgrad } kind = Skip;
  const Instr *self = nullptr;
  const Instr *partner = nullptr;     // LinearGelu: the gelu
  const Instr *biasGrad = nullptr;    // Wgrad: the reduce_sum it absorbs
  const Instr *accumulate = nullptr;  // Wgrad: the grad_accumulate
};

/// Which fusions MAPP_CUDA_FUSE enables.
struct FusionSwitches {
  bool gelu = true, bgrad = true, accumulate = true;
  /// Parses MAPP_CUDA_FUSE ("1"/unset, "0", or a comma list); Error on an
  /// unknown word.
  static FusionSwitches fromEnv();
};

struct FusionTable {
  std::unordered_map<const Attrs *, FusedOp> ops;
  int linearGelu = 0, biasGrad = 0, accumulate = 0;
  const FusedOp *find(const Attrs &a) const {
    if (ops.empty())
      return nullptr;
    auto it = ops.find(&a);
    return it == ops.end() ? nullptr : &it->second;
  }
};

/// Finds the fusible pairs of a program (see the file comment).
FusionTable planFusions(const Program &p, const FusionSwitches &on);

/// Runs the kernel's fused role, if it has one: true when the call is done.
bool runFused(const KernelArgs &a);

/// "linear+gelu N, bgrad N, accumulate N" of the bound program of a CUDA
/// backend (for tests and MAPP_CUDA_FUSE_LOG=1).
std::string fusionSummary(Backend &cudaBackend);

} // namespace mapp::rt::cuda

#endif
