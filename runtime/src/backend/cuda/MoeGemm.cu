//===- MoeGemm.cu - MoE grouped matmuls on the device (docs/moe.md) -------===//
//
// The CPU kernels' semantics (runtime/src/backend/cpu/Moe.cpp) on the device:
//
//   grouped matmul    one cuBLASLt bf16 GEMM per non-empty expert (fp32
//                     accumulation). The row counts live on the device:
//                     moe_assign queues a copy of its counts into pinned host
//                     memory (and a device snapshot) right after the kernel,
//                     and the grouped GEMM waits only for that event, not for
//                     the stream: the GPU keeps running the permute while the
//                     host reads the counts. The backward's GEMMs find the
//                     copy done. A device check compares the counts operand
//                     with the snapshot, so a counts buffer rewritten by
//                     something else is an error at the next synchronize,
//                     never a silent wrong shape. Counts no moe_assign wrote
//                     (or MAPP_CUDA_MOE_COUNTS=sync) are read with one stream
//                     synchronize. Algorithms are cached per bucket of the
//                     varying row count, not per exact shape; the first
//                     large call of a bucket times the heuristic's
//                     candidates and keeps the fastest (MAPP_CUDA_GEMM_TUNE).
//   grouped wgrad     the same per expert; followed by the grad_accumulate
//                     of its result (Fusion.cu), it adds into the fp32
//                     gradient with beta = 1 and the result is never written.
//
//===----------------------------------------------------------------------===//
#include "CudaBackend.h"
#include "LtSetup.cuh"
#include "LtTune.h"
#include "MoeInternal.h"

#include <cublasLt.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cuda;
using namespace mapp::rt::cuda::moe;

namespace {

// --- counts on the host -----------------------------------------------------

/// moe_assign's counts, copied to pinned host memory (and a device snapshot)
/// behind the kernel; keyed by backend and device address.
struct CountsMirror {
  int32_t *host = nullptr; // pinned
  int32_t *snap = nullptr; // device
  int64_t cap = 0;
  cudaEvent_t done = nullptr;
};
std::mutex gMirrorMutex;
std::map<std::pair<const CudaBackend *, const void *>, CountsMirror> gMirrors;

__global__ void checkCountsKernel(const int32_t *counts, const int32_t *snap,
                                  int64_t e, DeviceError *err) {
  for (int64_t i = threadIdx.x; i < e; i += blockDim.x)
    if (counts[i] != snap[i])
      reportError(err, kErrMoeStaleCounts, counts[i], i, snap[i]);
}

/// The counts operand on the host, with the CPU kernel's checks. Offsets
/// off[0..E] of each expert's rows.
std::vector<int64_t> hostOffsets(CudaBackend &be, const char *kernel,
                                 const Tensor &counts, int64_t rows) {
  int64_t e = counts.numel();
  std::vector<int32_t> c(e);
  bool mirrored = false;
  if (!be.config().moeCountsSync) {
    std::lock_guard<std::mutex> lock(gMirrorMutex);
    auto it = gMirrors.find({&be, counts.data});
    if (it != gMirrors.end() && it->second.cap >= e) {
      MAPP_CUDA_CHECK(cudaEventSynchronize(it->second.done));
      std::memcpy(c.data(), it->second.host, e * sizeof(int32_t));
      checkCountsKernel<<<1, 256, 0, be.stream()>>>(
          counts.i32(), it->second.snap, e, be.deviceError());
      MAPP_CUDA_LAUNCHED();
      mirrored = true;
    }
  }
  if (!mirrored && e) {
    MAPP_CUDA_CHECK(cudaMemcpyAsync(c.data(), counts.data, e * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, be.stream()));
    MAPP_CUDA_CHECK(cudaStreamSynchronize(be.stream()));
  }
  std::vector<int64_t> off(e + 1, 0);
  for (int64_t i = 0; i < e; ++i) {
    if (c[i] < 0)
      fail(kernel, ": count ", c[i], " of expert ", i, " is negative");
    off[i + 1] = off[i] + c[i];
  }
  if (off[e] > rows)
    fail(kernel, ": the experts' counts sum to ", off[e],
         " rows, more than the ", rows, " rows of x");
  return off;
}

// --- grouped GEMMs ------------------------------------------------------------

/// Rows in buckets (<= 64: multiples of 16, then 2^i and 1.5·2^i): the
/// algorithm of a bucket serves every row count in it.
int64_t bucket(int64_t x) {
  if (x <= 64)
    return (x + 15) / 16 * 16;
  int64_t p = 64;
  while (p < x) {
    if (p + p / 2 >= x)
      return p + p / 2;
    p *= 2;
  }
  return p;
}

struct LtKey {
  const CudaBackend *owner;
  int transA, transB, dBf16;
  int64_t m, n, k, lda, ldb, ldd; // m, n, k bucketed
  uint32_t align;
  bool operator<(const LtKey &o) const {
    return std::tie(owner, transA, transB, dBf16, m, n, k, lda, ldb, ldd,
                    align) < std::tie(o.owner, o.transA, o.transB, o.dBf16,
                                      o.m, o.n, o.k, o.lda, o.ldb, o.ldd,
                                      o.align);
  }
};
struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatmulAlgo_t algo;
  bool ok = false;
  // The heuristic's candidates; the first large call of the bucket times
  // them on its operands and keeps the fastest (as Gemm.cu does).
  std::vector<cublasLtMatmulAlgo_t> candidates;
  bool tuned = false;
};
std::mutex gLtMutex;
std::map<LtKey, LtPlan> gLtPlans;

uint32_t alignOf(std::initializer_list<const void *> ptrs) {
  uintptr_t bits = 256;
  for (const void *p : ptrs)
    bits |= reinterpret_cast<uintptr_t>(p);
  return static_cast<uint32_t>(bits & (~bits + 1));
}

struct Layouts {
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  ~Layouts() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
};

/// Up to `want` algorithms for the layouts, best first; false when none.
bool heuristic(CudaBackend &be, cublasLtMatmulDesc_t desc, const Layouts &l,
               uint32_t align, std::vector<cublasLtMatmulAlgo_t> &algos,
               int want = 1) {
  algos = ltHeuristic(be, desc, l.a, l.b, l.d, align, std::min(want, 8))
              .runnable;
  return !algos.empty();
}

/// Column-major D[m,n] = op(A)·op(B) + beta·D, bf16 A and B, fp32
/// accumulation, D in bf16 or fp32.
void ltGemm(CudaBackend &be, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
            const __nv_bfloat16 *A, int64_t lda, const __nv_bfloat16 *B,
            int64_t ldb, void *D, int64_t ldd, bool dBf16, float beta = 0.0f) {
  LtKey key{&be, ta, tb, dBf16, bucket(m), bucket(n), bucket(k),
            lda, ldb, ldd, alignOf({A, B, D})};
  Layouts l;
  MAPP_LT_CHECK(cublasLtMatrixLayoutCreate(&l.a, CUDA_R_16BF, ta ? k : m,
                                           ta ? m : k, lda));
  MAPP_LT_CHECK(cublasLtMatrixLayoutCreate(&l.b, CUDA_R_16BF, tb ? n : k,
                                           tb ? k : n, ldb));
  MAPP_LT_CHECK(cublasLtMatrixLayoutCreate(
      &l.d, dBf16 ? CUDA_R_16BF : CUDA_R_32F, m, n, ldd));
  LtPlan *p;
  {
    std::lock_guard<std::mutex> lock(gLtMutex);
    p = &gLtPlans[key];
    if (!p->desc) {
      ltCreateMatmulDesc(&p->desc, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                         tb ? CUBLAS_OP_T : CUBLAS_OP_N);
      p->ok = heuristic(be, p->desc, l, key.align, p->candidates, 8);
      if (p->ok)
        p->algo = p->candidates[0];
    }
  }
  float alpha = 1.0f, zero = 0.0f;
  cudaStream_t s = be.stream();
  // Timing runs write D with beta = 0, which the real call then rewrites:
  // only a call that overwrites D may tune (an accumulating one keeps the
  // bucket's first algorithm until a plain call of the bucket tunes it).
  if (p->ok && !p->tuned && beta == 0.0f &&
      worthTuning(be, p->candidates.size(), m * n * k)) {
    // Once per bucket, in the first steps.
    int best = fastestAlgo(s, p->candidates, [&](const cublasLtMatmulAlgo_t &algo) {
      return cublasLtMatmul(be.lt(), p->desc, &alpha, A, l.a, B, l.b, &zero, D,
                            l.d, D, l.d, &algo, be.ltWorkspace(),
                            be.ltWorkspaceBytes(), s);
    });
    if (best >= 0)
      p->algo = p->candidates[best];
    p->tuned = true;
  }
  cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
  if (p->ok)
    st = cublasLtMatmul(be.lt(), p->desc, &alpha, A, l.a, B, l.b, &beta, D,
                        l.d, D, l.d, &p->algo, be.ltWorkspace(),
                        be.ltWorkspaceBytes(), s);
  if (st != CUBLAS_STATUS_SUCCESS) {
    // The bucket's algorithm does not take this exact shape: ask for one.
    std::vector<cublasLtMatmulAlgo_t> algo;
    if (!heuristic(be, p->desc, l, key.align, algo))
      fail("cuBLASLt found no algorithm for a ", m, "x", n, "x", k,
           " bf16 expert GEMM");
    st = cublasLtMatmul(be.lt(), p->desc, &alpha, A, l.a, B, l.b, &beta, D,
                        l.d, D, l.d, &algo[0], be.ltWorkspace(),
                        be.ltWorkspaceBytes(), s);
    if (st != CUBLAS_STATUS_SUCCESS)
      fail("cuBLASLt error ", static_cast<int>(st), " in a ", m, "x", n, "x",
           k, " bf16 expert GEMM");
  }
}


} // namespace

void mapp::rt::cuda::moe::mirrorCounts(CudaBackend &be, const Tensor &counts) {
  if (be.config().moeCountsSync)
    return;
  int64_t e = counts.numel();
  std::lock_guard<std::mutex> lock(gMirrorMutex);
  CountsMirror &m = gMirrors[{&be, counts.data}];
  if (m.cap < e) {
    if (m.host) {
      MAPP_CUDA_CHECK(cudaStreamSynchronize(be.stream()));
      cudaFreeHost(m.host);
      cudaFree(m.snap);
    }
    MAPP_CUDA_CHECK(cudaMallocHost(&m.host, e * sizeof(int32_t)));
    MAPP_CUDA_CHECK(cudaMalloc(&m.snap, e * sizeof(int32_t)));
    m.cap = e;
  }
  if (!m.done)
    MAPP_CUDA_CHECK(cudaEventCreateWithFlags(&m.done, cudaEventDisableTiming));
  MAPP_CUDA_CHECK(cudaMemcpyAsync(m.host, counts.data, e * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, be.stream()));
  MAPP_CUDA_CHECK(cudaMemcpyAsync(m.snap, counts.data, e * sizeof(int32_t),
                                  cudaMemcpyDeviceToDevice, be.stream()));
  MAPP_CUDA_CHECK(cudaEventRecord(m.done, be.stream()));
}

void mapp::rt::cuda::moe_grouped_matmul(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  const Tensor &x = a.in[0], &w = a.in[1], &y = a.out[0];
  bool tb = a.attrs.getInt("transpose_b", 0) != 0;
  int64_t rows = x.dim(0), kd = x.dim(1), nd = y.dim(1), e = w.dim(0);
  std::vector<int64_t> off = hostOffsets(be, "moe_grouped_matmul", a.in[2], rows);
  const __nv_bfloat16 *xb = nullptr, *wb = nullptr;
  size_t ys = storedSize(y);
  for (int64_t g = 0; g < e; ++g) {
    int64_t m = off[g + 1] - off[g];
    if (m == 0 || nd == 0)
      continue;
    if (!xb) {
      xb = bf16Operand(be, x, 0);
      wb = bf16Operand(be, w, 3);
    }
    void *dst = static_cast<char *>(y.data) + off[g] * nd * ys;
    if (kd == 0) {
      MAPP_CUDA_CHECK(cudaMemsetAsync(dst, 0, m * nd * ys, be.stream()));
      continue;
    }
    // Row-major y_g[m, nd] = x_g[m, kd]·op(w_g) as column-major
    // y_gᵀ[nd, m] = op(w_g)ᵀ·x_gᵀ.
    const __nv_bfloat16 *wg = wb + g * kd * nd, *xg = xb + off[g] * kd;
    ltGemm(be, tb, false, nd, m, kd, wg, tb ? kd : nd, xg, kd, dst, nd,
           isBf16(y));
  }
  if (rows > off[e])
    MAPP_CUDA_CHECK(cudaMemsetAsync(static_cast<char *>(y.data) + off[e] * nd * ys,
                                    0, (rows - off[e]) * nd * ys, be.stream()));
}

void mapp::rt::cuda::moe::groupedWgrad(CudaBackend &be, const Tensor &x,
                                       const Tensor &dy, const Tensor &counts,
                                       const Tensor &dw, float beta) {
  int64_t rows = x.dim(0), kd = x.dim(1), nd = dy.dim(1), e = dw.dim(0);
  std::vector<int64_t> off =
      hostOffsets(be, "moe_grouped_matmul_wgrad", counts, rows);
  const __nv_bfloat16 *xb = nullptr, *db = nullptr;
  size_t ws = storedSize(dw);
  for (int64_t g = 0; g < e; ++g) {
    int64_t m = off[g + 1] - off[g];
    void *dst = static_cast<char *>(dw.data) + g * kd * nd * ws;
    if (kd == 0 || nd == 0)
      continue;
    if (m == 0) {
      // No rows: a zero gradient, which adds nothing to an accumulation.
      if (beta == 0.0f)
        MAPP_CUDA_CHECK(cudaMemsetAsync(dst, 0, kd * nd * ws, be.stream()));
      continue;
    }
    if (!xb) {
      xb = bf16Operand(be, x, 0);
      db = bf16Operand(be, dy, 3);
    }
    // Row-major dw_g[kd, nd] = x_gᵀ·dy_g as column-major
    // dw_gᵀ[nd, kd] = dy_gᵀ[nd, m]·x_g[m, kd] (x_g stored kd×m col-major).
    ltGemm(be, false, true, nd, kd, m, db + off[g] * nd, nd, xb + off[g] * kd,
           kd, dst, nd, isBf16(dw), beta);
  }
}

void mapp::rt::cuda::moe_grouped_matmul_wgrad(const KernelArgs &a) {
  moe::groupedWgrad(backendOf(a), a.in[0], a.in[1], a.in[2], a.out[0], 0.0f);
}
