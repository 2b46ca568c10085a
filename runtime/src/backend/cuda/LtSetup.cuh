//===- LtSetup.cuh - the cuBLASLt setup the GEMMs share ---------*- C++ -*-===//
//
// What every cuBLASLt GEMM of the CUDA backend (Gemm.cu, Fp8Gemm.cu,
// MoeGemm.cu) sets up the same way: the status check, a matmul descriptor
// with fp32 accumulation and its operand transposes, the heuristic's
// algorithms under the backend's workspace and the operands' alignment, and
// the bf16 view of an operand.
// LtTune.h then times the candidates.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CUDA_LTSETUP_CUH
#define MAPP_RT_CUDA_LTSETUP_CUH

#include "CudaBackend.h"

#include <cublasLt.h>

#include <cstdint>
#include <vector>

/// A cuBLASLt call that must succeed: an Error naming it otherwise.
#define MAPP_LT_CHECK(expr)                                                    \
  do {                                                                         \
    cublasStatus_t st_ = (expr);                                               \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                          \
      ::mapp::rt::fail("cuBLASLt error ", static_cast<int>(st_), " in ",       \
                       #expr);                                                 \
  } while (0)

namespace mapp::rt::cuda {

/// A matmul descriptor computing in fp32 (CUBLAS_COMPUTE_32F, fp32 scale)
/// with op(A) = `transA`, op(B) = `transB`.
inline void ltCreateMatmulDesc(cublasLtMatmulDesc_t *desc,
                               cublasOperation_t transA,
                               cublasOperation_t transB) {
  MAPP_LT_CHECK(cublasLtMatmulDescCreate(desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  MAPP_LT_CHECK(cublasLtMatmulDescSetAttribute(
      *desc, CUBLASLT_MATMUL_DESC_TRANSA, &transA, sizeof(transA)));
  MAPP_LT_CHECK(cublasLtMatmulDescSetAttribute(
      *desc, CUBLASLT_MATMUL_DESC_TRANSB, &transB, sizeof(transB)));
}

/// What cuBLASLt's heuristic proposed for one GEMM.
struct LtHeuristic {
  cublasStatus_t status = CUBLAS_STATUS_NOT_INITIALIZED;
  int found = 0;                 // algorithms it returned
  cublasLtMatmulAlgo_t first{};  // its best (when found > 0)
  std::vector<cublasLtMatmulAlgo_t> runnable; // those it says run, best first
  bool ok() const { return status == CUBLAS_STATUS_SUCCESS && found > 0; }
};

/// Up to `want` algorithms for D = op(A)·op(B) (C = D) over the layouts,
/// with the backend's workspace and every operand aligned to `align` bytes
/// (operands may sit at any offset the plan chose: the heuristic is told).
inline LtHeuristic ltHeuristic(CudaBackend &be, cublasLtMatmulDesc_t desc,
                               cublasLtMatrixLayout_t a,
                               cublasLtMatrixLayout_t b,
                               cublasLtMatrixLayout_t d, uint32_t align,
                               int want) {
  cublasLtMatmulPreference_t pref;
  MAPP_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = be.ltWorkspaceBytes();
  MAPP_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    MAPP_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align,
                                                       sizeof(align)));
  std::vector<cublasLtMatmulHeuristicResult_t> res(want > 0 ? want : 1);
  LtHeuristic h;
  h.status = cublasLtMatmulAlgoGetHeuristic(be.lt(), desc, a, b, d, d, pref,
                                            static_cast<int>(res.size()),
                                            res.data(), &h.found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (h.status != CUBLAS_STATUS_SUCCESS)
    return h;
  if (h.found > 0)
    h.first = res[0].algo;
  for (int i = 0; i < h.found; ++i)
    if (res[i].state == CUBLAS_STATUS_SUCCESS)
      h.runnable.push_back(res[i].algo);
  return h;
}

/// A bf16 view of a GEMM operand: the tensor itself, or a copy converted
/// into the backend's scratch slot `slot`.
inline const __nv_bfloat16 *bf16Operand(CudaBackend &be, const Tensor &t,
                                        int slot) {
  if (isBf16(t))
    return static_cast<const __nv_bfloat16 *>(t.data);
  auto *dst = static_cast<__nv_bfloat16 *>(be.scratch(t.numel() * 2, slot));
  convertToBf16(t.f32(), dst, t.numel(), be.stream());
  return dst;
}

} // namespace mapp::rt::cuda

#endif
