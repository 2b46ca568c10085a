//===- Gemm.cu - linear and matmul through cuBLASLt -----------------------===//
//
// bf16 operands (fp32 ones under MAPP_CUDA_STORAGE=f32), fp32 accumulation
// (CUBLAS_COMPUTE_32F), output in the storage type of the result (bf16 activations, fp32 gradient
// contributions). linear's bias is a cuBLASLt epilogue, and so are the
// fusions Fusion.cu finds in the plan: bias + GELU writing the pre-activation
// as the auxiliary output, the bias gradient (BGRADB) of a weight-gradient
// GEMM, and accumulation into a gradient buffer (beta = 1). Row-major products
// are issued as their column-major transposes: C[M,N] = op(A)·op(B) becomes
// Cᵀ[N,M] = op(B)ᵀ·op(A)ᵀ with B first.
//
// Descriptors, layouts and the heuristic's algorithm are cached per shape:
// plans repeat the same few GEMMs every step. gemmF32 (the logit lens,
// compared against a double reference) and the f32 storage mode's GEMMs
// take fp32 operands: with CUBLAS_COMPUTE_32F an SGEMM (TF32 would need
// CUBLAS_COMPUTE_32F_FAST_TF32).
//
//===----------------------------------------------------------------------===//
#include "CudaBackend.h"
#include "Fusion.h"
#include "LtSetup.cuh"
#include "LtTune.h"

#include <algorithm>
#include <initializer_list>
#include <map>
#include <mutex>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

/// One column-major GEMM: D[m,n] = epilogue(alpha·op(A)·op(B) (+ bias[m])) +
/// beta·D.
struct GemmKey {
  // Each backend (rank-thread) has its own plans: a call sets the epilogue
  // pointers on the plan's descriptor, which another rank's concurrent call
  // of the same shape must not see.
  const CudaBackend *owner;
  int64_t m, n, k, lda, ldb, ldd;
  int transA, transB, dBf16, epilogue, batch;
  int biasBf16; // the epilogue's bias vector is bf16 (else fp32)
  int f32; // A and B are fp32 (gemmF32), else bf16
  int64_t strideA, strideB, strideD;
  uint32_t align; // smallest alignment of the pointers, in bytes (≤ 256)
  bool operator<(const GemmKey &o) const {
    return std::tie(owner, m, n, k, lda, ldb, ldd, transA, transB, dBf16, f32,
                    epilogue, biasBf16, batch, strideA, strideB, strideD,
                    align) <
           std::tie(o.owner, o.m, o.n, o.k, o.lda, o.ldb, o.ldd, o.transA, o.transB,
                    o.dBf16, o.f32, o.epilogue, o.biasBf16, o.batch, o.strideA,
                    o.strideB, o.strideD, o.align);
  }
};

struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo;
  bool ok = false;
  // The heuristic's candidates; on first use each is timed on the real
  // operands and the fastest kept (the first choice is often not it).
  std::vector<cublasLtMatmulAlgo_t> candidates;
  bool tuned = false;
  bool refusalSaid = false; // the fallback to separate kernels was reported
};

std::mutex gMutex;
std::map<GemmKey, GemmPlan> gPlans;
int gRefusals = 0; // GEMM plans whose epilogue cuBLASLt refused (gMutex)

void setBatch(cublasLtMatrixLayout_t l, int batch, int64_t stride) {
  if (batch <= 1)
    return;
  int32_t b = batch;
  MAPP_LT_CHECK(cublasLtMatrixLayoutSetAttribute(
      l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof(b)));
  MAPP_LT_CHECK(cublasLtMatrixLayoutSetAttribute(
      l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
}

/// The epilogue's extra operands, set on the descriptor before every call
/// (and before the heuristic: it derives alignment from the pointers).
struct EpilogueArgs {
  const void *bias = nullptr; // BIAS input (bf16 or fp32), or BGRADB output (fp32)
  void *aux = nullptr;         // GELU_AUX: the pre-activation output
  int64_t auxLd = 0;
};

void setEpiloguePointers(cublasLtMatmulDesc_t desc, int epilogue,
                         const EpilogueArgs &e) {
  if (epilogue == CUBLASLT_EPILOGUE_DEFAULT)
    return;
  MAPP_LT_CHECK(cublasLtMatmulDescSetAttribute(
      desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &e.bias, sizeof(e.bias)));
  if (e.aux) {
    MAPP_LT_CHECK(cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &e.aux, sizeof(e.aux)));
    MAPP_LT_CHECK(cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &e.auxLd, sizeof(e.auxLd)));
  }
}

GemmPlan &planFor(CudaBackend &be, const GemmKey &key, const EpilogueArgs &e) {
  std::lock_guard<std::mutex> lock(gMutex);
  auto it = gPlans.find(key);
  if (it != gPlans.end())
    return it->second;
  GemmPlan p;
  ltCreateMatmulDesc(&p.desc, key.transA ? CUBLAS_OP_T : CUBLAS_OP_N,
                     key.transB ? CUBLAS_OP_T : CUBLAS_OP_N);
  if (key.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    auto epi = static_cast<cublasLtEpilogue_t>(key.epilogue);
    MAPP_LT_CHECK(cublasLtMatmulDescSetAttribute(
        p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    // Only epilogues with a bias vector get its type (cuBLASLt 13 finds no
    // algorithm for GELU_AUX or DGELU with one set). Bias gradients are
    // fp32; a linear's bias is its bf16 shadow, as under autocast, since
    // there is no algorithm for an fp32 bias with a bf16 output.
    if (key.epilogue == CUBLASLT_EPILOGUE_BIAS ||
        key.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
        key.epilogue == CUBLASLT_EPILOGUE_BGRADB) {
      cudaDataType_t bt = key.biasBf16 ? CUDA_R_16BF : CUDA_R_32F;
      MAPP_LT_CHECK(cublasLtMatmulDescSetAttribute(
          p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
    }
    setEpiloguePointers(p.desc, key.epilogue, e);
  }
  // Stored shapes: op(A) is m×k, so A is m×k (N) or k×m (T).
  int64_t ar = key.transA ? key.k : key.m, ac = key.transA ? key.m : key.k;
  int64_t br = key.transB ? key.n : key.k, bc = key.transB ? key.k : key.n;
  cudaDataType_t dt = key.dBf16 ? CUDA_R_16BF : CUDA_R_32F;
  cudaDataType_t ab = key.f32 ? CUDA_R_32F : CUDA_R_16BF;
  MAPP_LT_CHECK(cublasLtMatrixLayoutCreate(&p.a, ab, ar, ac, key.lda));
  MAPP_LT_CHECK(cublasLtMatrixLayoutCreate(&p.b, ab, br, bc, key.ldb));
  MAPP_LT_CHECK(cublasLtMatrixLayoutCreate(&p.d, dt, key.m, key.n, key.ldd));
  setBatch(p.a, key.batch, key.strideA);
  setBatch(p.b, key.batch, key.strideB);
  setBatch(p.d, key.batch, key.strideD);

  // More candidates than the first few: the heuristic's ranking of the
  // epilogue variants (bias gradient, GELU) is often off, and timing them
  // is a one-time cost per shape.
  constexpr int kCandidates = 32;
  LtHeuristic h =
      ltHeuristic(be, p.desc, p.a, p.b, p.d, key.align, kCandidates);
  if (h.ok()) {
    p.algo = h.first;
    p.ok = true;
    p.candidates = h.runnable;
  }
  return gPlans.emplace(key, p).first->second;
}

/// y[r, c] += bias[c]: blocks along x cover the columns, along y rows.
__global__ void addBiasKernel(DView y, DView bias, int64_t rows, int64_t n) {
  int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= n)
    return;
  float b = bias.ld(c);
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    y.st(r * n + c, y.ld(r * n + c) + b);
}

void addBias(const Tensor &y, const Tensor &bias, int64_t rows, int64_t n,
             cudaStream_t s) {
  dim3 grid(static_cast<unsigned>((n + 255) / 256),
            static_cast<unsigned>(std::min<int64_t>(rows, 4096)));
  addBiasKernel<<<grid, 256, 0, s>>>(view(y), view(bias), rows, n);
  MAPP_CUDA_LAUNCHED();
}

/// The column-major key of row-major C[M,N] = op(A)·op(B), issued as
/// Cᵀ = op(B)ᵀ·op(A)ᵀ: Lt's A is our B.
GemmKey rowMajorKey(const CudaBackend &be, bool ta, bool tb, int64_t M,
                    int64_t N, int64_t K) {
  GemmKey key{};
  key.owner = &be;
  key.epilogue = CUBLASLT_EPILOGUE_DEFAULT; // 1, not the 0 of key{}
  key.m = N;
  key.n = M;
  key.k = K;
  key.transA = tb;
  key.transB = ta;
  key.lda = tb ? K : N;
  key.ldb = ta ? M : K;
  key.ldd = N;
  key.batch = 1;
  return key;
}

/// The largest power of two (at most 256) dividing every pointer (null
/// ones do not count).
uint32_t commonAlignment(std::initializer_list<const void *> ptrs) {
  uintptr_t bits = 256;
  for (const void *p : ptrs)
    bits |= reinterpret_cast<uintptr_t>(p);
  return static_cast<uint32_t>(bits & (~bits + 1)); // lowest set bit
}

/// MAPP_CUDA_PROFILE's detail row of one GEMM: " gemm MxNxK[xbatch] tA tB
/// epilogue -> bf16|f32" (row-major sizes; the leading space marks a
/// record inside its kernel's).
std::string gemmLabel(const GemmKey &key, int64_t M, int64_t N, int64_t K,
                      bool ta, bool tb, bool accumulate) {
  const char *epi = "";
  switch (key.epilogue) {
  case CUBLASLT_EPILOGUE_BIAS: epi = " +bias"; break;
  case CUBLASLT_EPILOGUE_GELU_AUX: epi = " +gelu_aux"; break;
  case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: epi = " +gelu_aux_bias"; break;
  case CUBLASLT_EPILOGUE_BGRADB: epi = " +bgradb"; break;
  case CUBLASLT_EPILOGUE_DGELU: epi = " +dgelu"; break;
  default: break;
  }
  std::string s = " gemm " + std::to_string(M) + "x" + std::to_string(N) +
                  "x" + std::to_string(K);
  if (key.batch > 1)
    s += "x" + std::to_string(key.batch);
  s += ta ? " T" : " N";
  s += tb ? "T" : "N";
  return s + epi + (accumulate ? " +=" : "") + (key.dBf16 ? " ->bf16" : " ->f32");
}

/// Says once per GEMM plan, on stderr, that cuBLASLt refused its epilogue
/// and why: the work then runs as separate kernels, correct but slower,
/// which a profile would otherwise show only as time in the wrong place.
void sayRefused(GemmPlan &p, const GemmKey &key, int64_t M, int64_t N,
                int64_t K, bool ta, bool tb, const char *why) {
  std::lock_guard<std::mutex> lock(gMutex);
  if (p.refusalSaid)
    return;
  p.refusalSaid = true;
  ++gRefusals;
  std::fprintf(stderr,
               "mapp cuda: cuBLASLt refused the%s GEMM (%s); it runs as "
               "separate kernels\n",
               gemmLabel(key, M, N, K, ta, tb, false).c_str() + 5, why);
}

/// Row-major C[batch][M,N] = op(A)·op(B) with GemmExtras as described in
/// Fusion.h. Returns false, having done nothing, when a fused epilogue
/// (gelu, biasGrad, beta) cannot be used here: the caller then runs the
/// unfused kernels. A plain bias never fails (separate kernel fallback).
bool rowMajorGemm(CudaBackend &be, const Tensor &A, bool ta, const Tensor &B,
                  bool tb, const Tensor &C, int64_t M, int64_t N, int64_t K,
                  int batch, int64_t strideA, int64_t strideB,
                  const GemmExtras &x) {
  cudaStream_t s = be.stream();
  const Tensor *bias = x.bias;
  bool fused = x.gelu || x.biasGrad || x.beta != 0.0f || x.addend || x.dgeluPre;
  if (fused && (K == 0 || batch != 1 || M == 0 || N == 0))
    return false;
  if (x.gelu && (N % 8 != 0 || x.geluPre.type.dtype != C.type.dtype))
    return false; // GELU aux: ld divisible by 8, stored like the output
  if (x.biasGrad && !ta)
    return false; // BGRADB reduces op(A) over k: only the wgrad layout
  if (x.addend && x.addend->type.dtype != C.type.dtype)
    return false; // C is read through D's layout
  if (x.dgeluPre && (N % 8 != 0 || x.dgeluPre->type.dtype != C.type.dtype))
    return false; // the aux input: ld divisible by 8, stored like the output
  if (M == 0 || N == 0)
    return true;
  if (K == 0) {
    fillZero(view(C), C.numel(), s);
    if (bias)
      addBias(C, *bias, M * batch, N, s);
    return true;
  }
  // MAPP_CUDA_STORAGE=f32 (a numerics check against the CPU backend):
  // fp32-stored operands stay fp32 (an SGEMM), else bf16 operands.
  const bool f32Operands = !be.bf16Storage() && !isBf16(A) && !isBf16(B);
  const void *a = f32Operands ? A.data : bf16Operand(be, A, 0);
  const void *b = f32Operands ? B.data : bf16Operand(be, B, 3);
  GemmKey key = rowMajorKey(be, ta, tb, M, N, K);
  key.f32 = f32Operands;
  key.dBf16 = isBf16(C);
  EpilogueArgs epi;
  if (x.gelu) {
    // D = gelu(product + bias), the pre-activation into the aux matrix.
    key.epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    epi.aux = x.geluPre.data;
    epi.auxLd = N;
  } else if (x.dgeluPre) {
    // D = product · gelu'(pre), pre read as the aux matrix.
    key.epilogue = CUBLASLT_EPILOGUE_DGELU;
    epi.aux = x.dgeluPre->data;
    epi.auxLd = N;
  } else if (x.biasGrad) {
    // Lt's B is our A (dY, k = rows): its sums over k are our column sums.
    key.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    epi.bias = x.biasGrad;
  } else if (bias) {
    key.epilogue = CUBLASLT_EPILOGUE_BIAS;
  }
  if (bias && !x.biasGrad) {
    epi.bias = bias->data;
    key.biasBf16 = isBf16(*bias);
  }
  key.batch = batch;
  key.strideA = strideB;
  key.strideB = strideA;
  key.strideD = M * N;
  key.align = commonAlignment({a, b, C.data, epi.bias, epi.aux,
                               x.addend ? x.addend->data : nullptr});
  GemmPlan *p = &planFor(be, key, epi);
  if (!p->ok && (fused || bias))
    sayRefused(*p, key, M, N, K, ta, tb, "no algorithm");
  if (!p->ok && fused)
    return false;
  bool separateBias = false;
  if (!p->ok && bias) {
    key.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    key.biasBf16 = 0;
    epi.bias = nullptr;
    separateBias = true;
    p = &planFor(be, key, epi);
  }
  if (!p->ok)
    fail("cuBLASLt found no algorithm for a ", M, "x", N, "x", K,
         f32Operands ? " fp32" : " bf16", " GEMM (batch ", batch, ")");
  setEpiloguePointers(p->desc, key.epilogue, epi);
  float alpha = 1.0f, beta = x.addend ? 1.0f : x.beta;
  const void *cIn = x.addend ? x.addend->data : C.data;
  // MAPP_CUDA_GEMM_TUNE=0 keeps the heuristic's first algorithm.
  if (!p->tuned && worthTuning(be, p->candidates.size(), M * N * K)) {
    // The real call below rewrites every output, except when it accumulates
    // (beta ≠ 0): then the trials write a scratch matrix instead.
    void *trialD = C.data;
    float trialBeta = 0.0f;
    if (beta != 0.0f)
      trialD = be.scratch(M * N * storedSize(C), 5);
    int best = fastestAlgo(s, p->candidates, [&](const cublasLtMatmulAlgo_t &algo) {
      return cublasLtMatmul(be.lt(), p->desc, &alpha, b, p->a, a, p->b,
                            &trialBeta, trialD, p->d, trialD, p->d, &algo,
                            be.ltWorkspace(), be.ltWorkspaceBytes(), s);
    });
    if (best >= 0)
      p->algo = p->candidates[best];
    p->tuned = true;
  }
  bool timed = be.profiling();
  if (timed)
    be.profBegin(be.profLabel(gemmLabel(key, M, N, K, ta, tb, beta != 0.0f)));
  cublasStatus_t st = cublasLtMatmul(
      be.lt(), p->desc, &alpha, b, p->a, a, p->b, &beta, cIn, p->d, C.data,
      p->d, &p->algo, be.ltWorkspace(), be.ltWorkspaceBytes(), s);
  if (timed)
    be.profEnd();
  if (st != CUBLAS_STATUS_SUCCESS && fused) {
    sayRefused(*p, key, M, N, K, ta, tb,
               ("status " + std::to_string(static_cast<int>(st))).c_str());
    return false; // launched nothing: the unfused kernels run instead
  }
  if (st != CUBLAS_STATUS_SUCCESS)
    fail("cuBLASLt error ", static_cast<int>(st), " in a ", M, "x", N, "x",
         K, " bf16 GEMM");
  if (separateBias)
    addBias(C, *bias, M * batch, N, s);
  return true;
}

/// out = x·wᵀ (linear's layout: w is [N, K], x's rows times K) with the
/// extras' epilogue; false as rowMajorGemm.
bool linearGemm(CudaBackend &be, const Tensor &x, const Tensor &w,
                const Tensor &out, const GemmExtras &e) {
  int64_t k = x.dim(-1), n = w.dim(0);
  int64_t m = n ? out.numel() / n : 0;
  return rowMajorGemm(be, x, false, w, true, out, m, n, k, 1, 0, 0, e);
}

} // namespace

int cuda::gemmRefusals() {
  std::lock_guard<std::mutex> lock(gMutex);
  return gRefusals;
}

const Tensor *cuda::linearBias(const KernelArgs &a) {
  return a.numIn < 3 ? nullptr : &a.in[2];
}

void cuda::linear(const KernelArgs &a) {
  GemmExtras x;
  x.bias = linearBias(a);
  linearGemm(backendOf(a), a.in[0], a.in[1], a.out[0], x);
}

void cuda::matmul(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  const Tensor &A = a.in[0], &B = a.in[1];
  bool ta = a.attrs.flag("transpose_a"), tb = a.attrs.flag("transpose_b");
  int64_t m = ta ? A.dim(-1) : A.dim(-2), k = ta ? A.dim(-2) : A.dim(-1);
  int64_t n = tb ? B.dim(-2) : B.dim(-1);
  int64_t batch = 1;
  for (int i = 0; i + 2 < A.rank(); ++i)
    batch *= A.dim(i);
  bool sharedB = B.rank() == 2;
  if (sharedB && !ta) {
    rowMajorGemm(be, A, false, B, tb, a.out[0], batch * m, n, k, 1, 0, 0, {});
    return;
  }
  if (batch > INT32_MAX)
    fail("matmul: batch ", batch, " is too large");
  rowMajorGemm(be, A, ta, B, tb, a.out[0], m, n, k, static_cast<int>(batch),
               m * k, sharedB ? 0 : k * n, {});
}

void cuda::gemmF32(CudaBackend &be, const float *a, const float *b, float *c,
                   int64_t M, int64_t N, int64_t K) {
  cudaStream_t s = be.stream();
  if (M == 0 || N == 0)
    return;
  if (K == 0) {
    fillZero({c, 0}, M * N, s);
    return;
  }
  GemmKey key = rowMajorKey(be, false, true, M, N, K);
  key.f32 = 1;
  key.align = commonAlignment({a, b, c});
  GemmPlan &p = planFor(be, key, {});
  if (!p.ok)
    fail("cuBLASLt found no algorithm for a ", M, "x", N, "x", K, " fp32 GEMM");
  float alpha = 1.0f, beta = 0.0f;
  cublasStatus_t st = cublasLtMatmul(be.lt(), p.desc, &alpha, b, p.a, a, p.b,
                                     &beta, c, p.d, c, p.d, &p.algo,
                                     be.ltWorkspace(), be.ltWorkspaceBytes(), s);
  if (st != CUBLAS_STATUS_SUCCESS)
    fail("cuBLASLt error ", static_cast<int>(st), " in a ", M, "x", N, "x",
         K, " fp32 GEMM");
}

bool cuda::linearGelu(CudaBackend &be, const Tensor &x, const Tensor &w,
                      const Tensor *bias, const Tensor &pre, const Tensor &act) {
  GemmExtras e;
  e.bias = bias;
  e.gelu = true;
  e.geluPre = pre;
  return linearGemm(be, x, w, act, e);
}

bool cuda::linearAdd(CudaBackend &be, const Tensor &x, const Tensor &w,
                     const Tensor *bias, const Tensor &addend, const Tensor &out) {
  GemmExtras e;
  e.bias = bias;
  e.addend = &addend;
  return linearGemm(be, x, w, out, e);
}

bool cuda::dgradGelu(CudaBackend &be, const Tensor &dy, const Tensor &w,
                     bool transW, const Tensor &pre, const Tensor &dpre) {
  int64_t k = dy.dim(-1), n = transW ? w.dim(0) : w.dim(1);
  int64_t m = k ? dy.numel() / k : 0;
  GemmExtras e;
  e.dgeluPre = &pre;
  return rowMajorGemm(be, dy, false, w, transW, dpre, m, n, k, 1, 0, 0, e);
}

bool cuda::wgradGemm(CudaBackend &be, const Tensor &dy, const Tensor &x,
                     const Tensor &dw, float *biasGrad, float beta) {
  // dw[M,N] = dyᵀ·x over R rows; dy is [R, M], x is [R, N].
  int64_t m = dy.dim(-1), n = x.dim(-1), r = m ? dy.numel() / m : 0;
  GemmExtras e;
  e.biasGrad = biasGrad;
  e.beta = beta;
  return rowMajorGemm(be, dy, true, x, false, dw, m, n, r, 1, 0, 0, e);
}
