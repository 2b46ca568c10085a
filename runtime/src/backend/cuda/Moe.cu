//===- Moe.cu - mixture-of-experts kernels on the device (docs/moe.md) ----===//
//
// The CPU kernels' semantics (runtime/src/backend/cpu/Moe.cpp) on the device,
// every float operand through its storage view (fp32 or bf16), arithmetic in
// fp32 (sums of a row in fp32 registers, cross-block sums in double):
//
//   moe_router        one warp per token: k rounds of a warp arg-max over the
//                     logits strictly after the previous pick in the order
//                     (value desc, index asc), so ties go to the lower expert
//                     exactly as topkRow; softmax over the k picks.
//   moe_assign        one block per expert: the stable counting sort of the
//                     choices by expert (block scans in flat = token order);
//                     with a capacity, an 8-bit radix select of the C-th
//                     largest probability (order-preserving uint keys) keeps
//                     the probabilities above it and the first of the equal
//                     ones in token order: the CPU's stable_sort rule.
//   permute / unpermute and their gradients
//                     row gathers through the inverse of slots (rows nobody
//                     maps to are written as zeros), 8 elements per access.
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
//   aux / z losses    fixed-grid per-block partials, summed in a fixed order
//                     (deterministic, no float atomics).
//
//===----------------------------------------------------------------------===//
#include "CudaBackend.h"
#include "LtTune.h"

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cublasLt.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

#define MAPP_LT_CHECK(expr)                                                    \
  do {                                                                         \
    cublasStatus_t st_ = (expr);                                               \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                          \
      fail("cuBLASLt error ", static_cast<int>(st_), " in ", #expr);           \
  } while (0)

constexpr int kWarpsPerBlock = 8;

// --- router -----------------------------------------------------------------

/// (value, index) better in the top-k order: larger value, then lower index.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}

__global__ void routerKernel(DView logits, DView probs, int32_t *experts,
                             int64_t n, int e, int k) {
  int lane = threadIdx.x & 31;
  int64_t row = blockIdx.x * int64_t(kWarpsPerBlock) + (threadIdx.x >> 5);
  if (row >= n)
    return;
  const int64_t base = row * e;
  float prevV = INFINITY, top0 = 0, sum = 0;
  int prevI = -1;
  // The k picks stay in lanes 0..k-1 (lane j holds pick j) for the softmax.
  float myV = 0;
  for (int j = 0; j < k; ++j) {
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int c = lane; c < e; c += 32) {
      float v = logits.ld(base + c);
      // strictly after the previous pick in the order
      bool after = j == 0 || v < prevV || (v == prevV && c > prevI);
      if (after && better(v, c, bv, bi)) {
        bv = v;
        bi = c;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (better(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (j == 0)
      top0 = bv;
    sum += expf(bv - top0);
    if (j == lane) {
      myV = bv;
    }
    if (lane == 0)
      experts[row * k + j] = bi;
    prevV = bv;
    prevI = bi;
  }
  // Lane j < 32 writes pick j's probability; lane 0 the picks past 32 (k >
  // 32 is rare) from the experts it wrote.
  if (lane < k)
    probs.st(row * k + lane, expf(myV - top0) / sum);
  if (lane == 0)
    for (int j = 32; j < k; ++j)
      probs.st(row * k + j,
               expf(logits.ld(base + experts[row * k + j]) - top0) / sum);
}

__global__ void routerGradKernel(DView dprobs, DView probs,
                                 const int32_t *experts, DView dlogits,
                                 int64_t n, int k, int e, DeviceError *err) {
  int lane = threadIdx.x & 31;
  int64_t row = blockIdx.x * int64_t(kWarpsPerBlock) + (threadIdx.x >> 5);
  if (row >= n)
    return;
  float dot = 0;
  for (int j = lane; j < k; j += 32)
    dot += dprobs.ld(row * k + j) * probs.ld(row * k + j);
  dot = warpSum(dot);
  for (int c = lane; c < e; c += 32) {
    float v = 0;
    for (int j = 0; j < k; ++j) {
      int32_t x = experts[row * k + j];
      if (c == 0 && (x < 0 || x >= e))
        reportError(err, kErrMoeExpert, x, row * k + j, e);
      if (x == c)
        v += probs.ld(row * k + j) * (dprobs.ld(row * k + j) - dot);
    }
    dlogits.st(row * e + c, v);
  }
}

// --- assign -----------------------------------------------------------------

constexpr int kAssignThreads = 1024;

/// Order-preserving key of a probability: larger float, larger key (-0 as 0).
__device__ __forceinline__ uint32_t probKey(float f) {
  uint32_t u = __float_as_uint(f == 0.0f ? 0.0f : f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/// Block e: how many choices chose e, which of them survive the capacity
/// (keep[i] for every i with experts[i] == e), and counts[e] (kept).
__global__ void __launch_bounds__(kAssignThreads)
assignKeepKernel(DView probs, const int32_t *experts, int64_t choices, int ne,
                 int64_t capacity, uint8_t *keep, int32_t *counts,
                 DeviceError *err) {
  using Reduce = cub::BlockReduce<int, kAssignThreads>;
  using Scan = cub::BlockScan<int, kAssignThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ int hist[256];
  __shared__ uint32_t shPrefix;
  __shared__ int shRemain, shTotal;
  const int e = blockIdx.x;
  int mine = 0;
  for (int64_t i = threadIdx.x; i < choices; i += kAssignThreads) {
    int32_t x = experts[i];
    if (e == 0 && (x < 0 || x >= ne))
      reportError(err, kErrMoeExpert, x, i, ne);
    mine += x == e;
  }
  int total = Reduce(tmp.reduce).Sum(mine);
  if (threadIdx.x == 0)
    shTotal = total;
  __syncthreads();
  total = shTotal;
  if (capacity <= 0 || total <= capacity) {
    for (int64_t i = threadIdx.x; i < choices; i += kAssignThreads)
      if (experts[i] == e)
        keep[i] = 1;
    if (threadIdx.x == 0)
      counts[e] = total;
    return;
  }
  // Radix select (most significant byte first) of the capacity-th largest key.
  uint32_t prefix = 0, mask = 0;
  int remain = static_cast<int>(capacity);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kAssignThreads)
      hist[b] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < choices; i += kAssignThreads) {
      if (experts[i] != e)
        continue;
      uint32_t key = probKey(probs.ld(i));
      if ((key & mask) == prefix)
        atomicAdd(&hist[(key >> shift) & 255], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int d = 255;
      for (; d > 0; --d) {
        if (hist[d] >= remain)
          break;
        remain -= hist[d];
      }
      shPrefix = prefix | (uint32_t(d) << shift);
      shRemain = remain;
    }
    __syncthreads();
    prefix = shPrefix;
    remain = shRemain;
    mask |= 255u << shift;
    __syncthreads();
  }
  // Keep keys above the threshold and the first `remain` equal ones.
  const uint32_t thr = prefix;
  int carry = 0;
  for (int64_t b = 0; b < choices; b += kAssignThreads) {
    int64_t i = b + threadIdx.x;
    bool mineE = i < choices && experts[i] == e;
    uint32_t key = mineE ? probKey(probs.ld(i)) : 0;
    int eq = mineE && key == thr;
    int before, sum;
    Scan(tmp.scan).ExclusiveSum(eq, before, sum);
    if (mineE)
      keep[i] = key > thr || (eq && carry + before < remain);
    carry += sum;
    __syncthreads();
  }
  if (threadIdx.x == 0)
    counts[e] = static_cast<int32_t>(capacity);
}

/// Block e: the kept choices of expert e get rows offset(e) + their rank in
/// token order, the dropped ones -1.
__global__ void __launch_bounds__(kAssignThreads)
assignSlotsKernel(const int32_t *experts, const uint8_t *keep, int64_t choices,
                  const int32_t *counts, int32_t *slots) {
  using Scan = cub::BlockScan<int, kAssignThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ int shOffset;
  const int e = blockIdx.x;
  if (threadIdx.x == 0) {
    int off = 0;
    for (int j = 0; j < e; ++j)
      off += counts[j];
    shOffset = off;
  }
  __syncthreads();
  int carry = shOffset;
  for (int64_t b = 0; b < choices; b += kAssignThreads) {
    int64_t i = b + threadIdx.x;
    bool mineE = i < choices && experts[i] == e;
    int kept = mineE && keep[i];
    int before, sum;
    Scan(tmp).ExclusiveSum(kept, before, sum);
    if (mineE)
      slots[i] = kept ? carry + before : -1;
    carry += sum;
    __syncthreads();
  }
}

// --- permute / unpermute ------------------------------------------------------

/// src[row] = the choice mapped to that row (-1: none); slots checked.
__global__ void invertSlotsKernel(const int32_t *slots, int64_t choices,
                                  int64_t rows, int32_t *src, int code,
                                  DeviceError *err) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < choices;
       i += int64_t(gridDim.x) * blockDim.x) {
    int32_t s = slots[i];
    if (s < -1 || s >= rows)
      reportError(err, code, s, i, rows);
    else if (s >= 0)
      src[s] = static_cast<int32_t>(i);
  }
}

/// out[r] = weight(i)·x[i / k] for i = src[r] (weight 1 without probs), or
/// zeros. vec: h % 8 == 0 and all rows 16-byte aligned.
template <bool Vec>
__global__ void gatherRowsKernel(DView x, const int32_t *src, DView probs,
                                 int k, DView out, int64_t rows, int64_t h) {
  const int64_t w = Vec ? h / 8 : h;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
       idx < rows * w; idx += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = idx / w, c = idx - r * w;
    int32_t i = src[r];
    float scale = i < 0 ? 0.0f : (probs.p ? probs.ld(i) : 1.0f);
    int64_t t = i < 0 ? 0 : i / k;
    if (Vec) {
      float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (i >= 0) {
        x.ld8(t * h + c * 8, v);
#pragma unroll
        for (int j = 0; j < 8; ++j)
          v[j] *= scale;
      }
      out.st8(r * h + c * 8, v);
    } else {
      out.st(r * h + c, i < 0 ? 0.0f : scale * x.ld(t * h + c));
    }
  }
}

/// out[n] = Σ_j weight(n,j)·y[slots[n,j]] over kept choices (weight 1
/// without probs). Slots checked by the element-0 thread of each token.
template <bool Vec>
__global__ void combineRowsKernel(DView y, const int32_t *slots, DView probs,
                                  int k, DView out, int64_t n, int64_t h,
                                  int64_t rows, int code, DeviceError *err) {
  const int64_t w = Vec ? h / 8 : h;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
       idx < n * w; idx += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = idx / w, c = idx - r * w;
    float acc[Vec ? 8 : 1];
#pragma unroll
    for (int j = 0; j < (Vec ? 8 : 1); ++j)
      acc[j] = 0;
    for (int j = 0; j < k; ++j) {
      int32_t s = slots[r * k + j];
      if (s < -1 || s >= rows) {
        if (c == 0)
          reportError(err, code, s, r * k + j, rows);
        continue;
      }
      if (s < 0)
        continue;
      float p = probs.p ? probs.ld(r * k + j) : 1.0f;
      if (Vec) {
        float v[8];
        y.ld8(int64_t(s) * h + c * 8, v);
#pragma unroll
        for (int q = 0; q < 8; ++q)
          acc[q] += p * v[q];
      } else {
        acc[0] += p * y.ld(int64_t(s) * h + c);
      }
    }
    if (Vec) {
      float v[8];
#pragma unroll
      for (int q = 0; q < 8; ++q)
        v[q] = acc[q];
      out.st8(r * h + c * 8, v);
    } else {
      out.st(r * h + c, acc[0]);
    }
  }
}

/// dprobs[i] = dout[i / k] · y[slots[i]] (0 when dropped): a warp per choice.
__global__ void unpermuteDprobsKernel(DView dout, DView y,
                                      const int32_t *slots, int k, DView dprobs,
                                      int64_t choices, int64_t h, int64_t rows) {
  int lane = threadIdx.x & 31;
  int64_t i = blockIdx.x * int64_t(kWarpsPerBlock) + (threadIdx.x >> 5);
  if (i >= choices)
    return;
  int32_t s = slots[i];
  float dot = 0;
  if (s >= 0 && s < rows) {
    int64_t t = i / k;
    for (int64_t c = lane; c < h; c += 32)
      dot += dout.ld(t * h + c) * y.ld(int64_t(s) * h + c);
  }
  dot = warpSum(dot);
  if (lane == 0)
    dprobs.st(i, dot);
}

bool rowsVec(std::initializer_list<const Tensor *> ts, int64_t h) {
  if (h % 8 != 0)
    return false;
  for (const Tensor *t : ts)
    if (t && !aligned16(t->data))
      return false;
  return true;
}

constexpr int kThreads = 256;

/// The permuted buffer [rows, h] from token rows: out[r] = weight·x[token].
void gatherRows(CudaBackend &be, const Tensor &x, const Tensor &slots,
                const Tensor *probs, const Tensor &out, int code) {
  cudaStream_t s = be.stream();
  int64_t n = slots.dim(0), k = slots.dim(1), rows = out.dim(0), h = out.dim(1);
  if (rows == 0 || h == 0)
    return;
  auto *src = static_cast<int32_t *>(be.scratch(rows * sizeof(int32_t), 1));
  MAPP_CUDA_CHECK(cudaMemsetAsync(src, 0xFF, rows * sizeof(int32_t), s));
  if (n * k > 0) {
    invertSlotsKernel<<<gridFor(n * k, kThreads), kThreads, 0, s>>>(
        slots.i32(), n * k, rows, src, code, be.deviceError());
    MAPP_CUDA_LAUNCHED();
  }
  DView pv = probs ? view(*probs) : DView{nullptr, 0};
  if (rowsVec({&x, &out}, h)) {
    gatherRowsKernel<true><<<gridFor(rows * h / 8, kThreads), kThreads, 0, s>>>(
        view(x), src, pv, static_cast<int>(k), view(out), rows, h);
  } else {
    gatherRowsKernel<false><<<gridFor(rows * h, kThreads), kThreads, 0, s>>>(
        view(x), src, pv, static_cast<int>(k), view(out), rows, h);
  }
  MAPP_CUDA_LAUNCHED();
}

/// Token rows [n, h] from the permuted buffer y [rows, h].
void combineRows(CudaBackend &be, const Tensor &y, const Tensor &slots,
                 const Tensor *probs, const Tensor &out, int code) {
  cudaStream_t s = be.stream();
  int64_t n = slots.dim(0), k = slots.dim(1), h = out.dim(1), rows = y.dim(0);
  if (n == 0 || h == 0)
    return;
  DView pv = probs ? view(*probs) : DView{nullptr, 0};
  if (rowsVec({&y, &out}, h)) {
    combineRowsKernel<true><<<gridFor(n * h / 8, kThreads), kThreads, 0, s>>>(
        view(y), slots.i32(), pv, static_cast<int>(k), view(out), n, h, rows,
        code, be.deviceError());
  } else {
    combineRowsKernel<false><<<gridFor(n * h, kThreads), kThreads, 0, s>>>(
        view(y), slots.i32(), pv, static_cast<int>(k), view(out), n, h, rows,
        code, be.deviceError());
  }
  MAPP_CUDA_LAUNCHED();
}

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

void mirrorCounts(CudaBackend &be, const Tensor &counts) {
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
  cublasLtMatmulPreference_t pref;
  MAPP_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = be.ltWorkspaceBytes();
  MAPP_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    MAPP_LT_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
  cublasLtMatmulHeuristicResult_t res[8];
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      be.lt(), desc, l.a, l.b, l.d, l.d, pref, std::min(want, 8), res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  algos.clear();
  if (st == CUBLAS_STATUS_SUCCESS)
    for (int i = 0; i < found; ++i)
      if (res[i].state == CUBLAS_STATUS_SUCCESS)
        algos.push_back(res[i].algo);
  return !algos.empty();
}

/// Column-major D[m,n] = op(A)·op(B), bf16 A and B, fp32 accumulation, D in
/// bf16 or fp32.
void ltGemm(CudaBackend &be, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
            const __nv_bfloat16 *A, int64_t lda, const __nv_bfloat16 *B,
            int64_t ldb, void *D, int64_t ldd, bool dBf16) {
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
      MAPP_LT_CHECK(
          cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
      cublasOperation_t ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
      MAPP_LT_CHECK(cublasLtMatmulDescSetAttribute(
          p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof(oa)));
      MAPP_LT_CHECK(cublasLtMatmulDescSetAttribute(
          p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof(ob)));
      p->ok = heuristic(be, p->desc, l, key.align, p->candidates, 8);
      if (p->ok)
        p->algo = p->candidates[0];
    }
  }
  float alpha = 1.0f, beta = 0.0f;
  cudaStream_t s = be.stream();
  if (p->ok && !p->tuned && worthTuning(be, p->candidates.size(), m * n * k)) {
    // beta = 0: the real call below rewrites D. Once per bucket, in the
    // first steps.
    int best = fastestAlgo(s, p->candidates, [&](const cublasLtMatmulAlgo_t &algo) {
      return cublasLtMatmul(be.lt(), p->desc, &alpha, A, l.a, B, l.b, &beta, D,
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

const __nv_bfloat16 *bf16Operand(CudaBackend &be, const Tensor &t, int slot) {
  if (isBf16(t))
    return static_cast<const __nv_bfloat16 *>(t.data);
  auto *dst = static_cast<__nv_bfloat16 *>(be.scratch(t.numel() * 2, slot));
  convertToBf16(t.f32(), dst, t.numel(), be.stream());
  return dst;
}

// --- router losses --------------------------------------------------------------

constexpr int kLossBlocks = 132 * 2;

/// Softmax statistics of one row held by a warp: max and Σ exp(l - max).
__device__ __forceinline__ void rowStats(DView l, int64_t base, int e, int lane,
                                         float &mx, float &sum) {
  mx = -INFINITY;
  for (int c = lane; c < e; c += 32)
    mx = fmaxf(mx, l.ld(base + c));
  mx = warpMax(mx);
  sum = 0;
  for (int c = lane; c < e; c += 32)
    sum += expf(l.ld(base + c) - mx);
  sum = warpSum(sum);
}

/// partial[g][c] = Σ over block g's rows of softmax(l)[row, c]; shared
/// memory: kWarpsPerBlock × e doubles.
__global__ void auxPartialKernel(DView l, int64_t n, int e, double *partial) {
  extern __shared__ double sh[];
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  double *mine = sh + w * e;
  for (int c = lane; c < e; c += 32)
    mine[c] = 0;
  int64_t per = (n + gridDim.x - 1) / gridDim.x;
  int64_t r0 = blockIdx.x * per, r1 = r0 + per < n ? r0 + per : n;
  for (int64_t r = r0 + w; r < r1; r += kWarpsPerBlock) {
    float mx, sum;
    rowStats(l, r * e, e, lane, mx, sum);
    for (int c = lane; c < e; c += 32)
      mine[c] += expf(l.ld(r * e + c) - mx) / sum;
  }
  __syncthreads();
  for (int c = threadIdx.x; c < e; c += blockDim.x) {
    double s = 0;
    for (int j = 0; j < kWarpsPerBlock; ++j)
      s += sh[j * e + c];
    partial[int64_t(blockIdx.x) * e + c] = s;
  }
}

/// Choices per expert (shared histogram; ids checked).
__device__ void choiceHist(const int32_t *ex, int64_t choices, int e, int *hist,
                           DeviceError *err) {
  for (int c = threadIdx.x; c < e; c += blockDim.x)
    hist[c] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < choices; i += blockDim.x) {
    int32_t x = ex[i];
    if (x < 0 || x >= e)
      reportError(err, kErrMoeExpert, x, i, e);
    else
      atomicAdd(&hist[x], 1);
  }
  __syncthreads();
}

/// One block: loss = scale·Σ_c (Σ_g partial[g][c])·count_c. Shared: e ints.
__global__ void auxFinishKernel(const double *partial, int blocks, int e,
                                const int32_t *ex, int64_t choices,
                                double scale, DView loss, DeviceError *err) {
  extern __shared__ int hist[];
  choiceHist(ex, choices, e, hist, err);
  using Reduce = cub::BlockReduce<double, 256>;
  __shared__ typename Reduce::TempStorage tmp;
  double acc = 0;
  for (int c = threadIdx.x; c < e; c += blockDim.x) {
    double s = 0;
    for (int g = 0; g < blocks; ++g)
      s += partial[int64_t(g) * e + c];
    acc += s * hist[c];
  }
  double total = Reduce(tmp).Sum(acc);
  if (threadIdx.x == 0)
    loss.st(0, static_cast<float>(total * scale));
}

/// g[c] = dloss·scale·count_c (one block; shared e ints).
__global__ void auxGradWeightsKernel(const int32_t *ex, int64_t choices, int e,
                                     DView dloss, double scale, float *g,
                                     DeviceError *err) {
  extern __shared__ int hist[];
  choiceHist(ex, choices, e, hist, err);
  double d = dloss.ld(0) * scale;
  for (int c = threadIdx.x; c < e; c += blockDim.x)
    g[c] = static_cast<float>(d * hist[c]);
}

/// dl[r, c] = s_c·(g_c − Σ s·g), s = softmax(l[r]): a warp per row.
__global__ void auxGradKernel(DView l, const float *g, int64_t n, int e,
                              DView dl) {
  int lane = threadIdx.x & 31;
  int64_t r = blockIdx.x * int64_t(kWarpsPerBlock) + (threadIdx.x >> 5);
  if (r >= n)
    return;
  float mx, sum;
  rowStats(l, r * e, e, lane, mx, sum);
  float dot = 0;
  for (int c = lane; c < e; c += 32)
    dot += expf(l.ld(r * e + c) - mx) / sum * g[c];
  dot = warpSum(dot);
  for (int c = lane; c < e; c += 32) {
    float s = expf(l.ld(r * e + c) - mx) / sum;
    dl.st(r * e + c, s * (g[c] - dot));
  }
}

/// partial[g] = Σ over block g's rows of logsumexp(l[row])².
__global__ void zPartialKernel(DView l, int64_t n, int e, double *partial) {
  __shared__ double sh[kWarpsPerBlock];
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int64_t per = (n + gridDim.x - 1) / gridDim.x;
  int64_t r0 = blockIdx.x * per, r1 = r0 + per < n ? r0 + per : n;
  double acc = 0;
  for (int64_t r = r0 + w; r < r1; r += kWarpsPerBlock) {
    float mx, sum;
    rowStats(l, r * e, e, lane, mx, sum);
    double lse = double(mx) + ::log(double(sum));
    acc += lse * lse;
  }
  if (lane == 0)
    sh[w] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0;
    for (int j = 0; j < kWarpsPerBlock; ++j)
      s += sh[j];
    partial[blockIdx.x] = s;
  }
}

__global__ void zFinishKernel(const double *partial, int blocks, double scale,
                              DView loss) {
  if (threadIdx.x == 0) {
    double s = 0;
    for (int g = 0; g < blocks; ++g)
      s += partial[g];
    loss.st(0, static_cast<float>(s * scale));
  }
}

/// dl[r, c] = dloss·scale·lse_r·softmax(l[r])_c: a warp per row.
__global__ void zGradKernel(DView dloss, DView l, int64_t n, int e,
                            double scale, DView dl) {
  int lane = threadIdx.x & 31;
  int64_t r = blockIdx.x * int64_t(kWarpsPerBlock) + (threadIdx.x >> 5);
  if (r >= n)
    return;
  float mx, sum;
  rowStats(l, r * e, e, lane, mx, sum);
  float lse = mx + logf(sum);
  float f = static_cast<float>(dloss.ld(0) * scale) * lse;
  for (int c = lane; c < e; c += 32)
    dl.st(r * e + c, f * (expf(l.ld(r * e + c) - mx) / sum));
}

int warpRowsGrid(int64_t rows) {
  int64_t b = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<int>(b < 1 ? 1 : b);
}

} // namespace

std::string mapp::rt::cuda::moeErrorText(int code, int64_t a, int64_t b, int64_t c) {
  auto s = [](int64_t v) { return std::to_string(v); };
  switch (code) {
  case kErrMoeExpert:
    return "moe: expert id " + s(a) + " at choice " + s(b) +
           " is outside [0, " + s(c) + ")";
  case kErrMoePermuteSlot:
  case kErrMoeUnpermuteSlot: {
    const char *k = code == kErrMoePermuteSlot ? "moe_permute" : "moe_unpermute";
    return std::string(k) + " (or its gradient): slot " + s(a) +
           " at choice " + s(b) + " is outside [-1, " + s(c) +
           ") (rows of the permuted buffer)";
  }
  case kErrMoeStaleCounts:
    return "moe_grouped_matmul: the counts of expert " + s(b) + " are " +
           s(a) + " on the device but were " + s(c) +
           " when moe_assign wrote them (another kernel rewrote the buffer "
           "after moe_assign; MAPP_CUDA_MOE_COUNTS=sync reads counts with a "
           "synchronize instead)";
  default:
    return "";
  }
}

void mapp::rt::cuda::moe_router(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  int64_t n = a.in[0].dim(0), e = a.in[0].dim(1), k = a.out[0].dim(1);
  if (n == 0)
    return;
  routerKernel<<<warpRowsGrid(n), kWarpsPerBlock * 32, 0, be.stream()>>>(
      view(a.in[0]), view(a.out[0]), a.out[1].i32(), n, static_cast<int>(e),
      static_cast<int>(k));
  MAPP_CUDA_LAUNCHED();
}

void mapp::rt::cuda::moe_router_grad(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  int64_t n = a.in[1].dim(0), k = a.in[1].dim(1), e = a.out[0].dim(1);
  if (n == 0)
    return;
  routerGradKernel<<<warpRowsGrid(n), kWarpsPerBlock * 32, 0, be.stream()>>>(
      view(a.in[0]), view(a.in[1]), a.in[2].i32(), view(a.out[0]), n,
      static_cast<int>(k), static_cast<int>(e), be.deviceError());
  MAPP_CUDA_LAUNCHED();
}

void mapp::rt::cuda::moe_assign(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  cudaStream_t s = be.stream();
  int64_t e = a.out[1].numel();
  int64_t choices = a.in[1].numel();
  int64_t cap = a.attrs.getInt("capacity", 0);
  if (e == 0)
    return;
  if (choices > INT32_MAX)
    fail("moe_assign: ", choices, " choices do not fit 32-bit slots");
  auto *keep = static_cast<uint8_t *>(be.scratch(std::max<int64_t>(choices, 1), 1));
  assignKeepKernel<<<static_cast<int>(e), kAssignThreads, 0, s>>>(
      view(a.in[0]), a.in[1].i32(), choices, static_cast<int>(e), cap, keep,
      a.out[1].i32(), be.deviceError());
  MAPP_CUDA_LAUNCHED();
  assignSlotsKernel<<<static_cast<int>(e), kAssignThreads, 0, s>>>(
      a.in[1].i32(), keep, choices, a.out[1].i32(), a.out[0].i32());
  MAPP_CUDA_LAUNCHED();
  mirrorCounts(be, a.out[1]);
}

void mapp::rt::cuda::moe_permute(const KernelArgs &a) {
  gatherRows(backendOf(a), a.in[0], a.in[1], nullptr, a.out[0],
             kErrMoePermuteSlot);
}

void mapp::rt::cuda::moe_permute_grad(const KernelArgs &a) {
  combineRows(backendOf(a), a.in[0], a.in[1], nullptr, a.out[0],
              kErrMoePermuteSlot);
}

void mapp::rt::cuda::moe_unpermute(const KernelArgs &a) {
  combineRows(backendOf(a), a.in[0], a.in[2], &a.in[1], a.out[0],
              kErrMoeUnpermuteSlot);
}

void mapp::rt::cuda::moe_unpermute_grad(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  const Tensor &dout = a.in[0], &y = a.in[1], &probs = a.in[2], &slots = a.in[3];
  // dy[slots[i]] = probs[i]·dout[i / k]: the permute of dout, weighted.
  gatherRows(be, dout, slots, &probs, a.out[0], kErrMoeUnpermuteSlot);
  int64_t choices = slots.numel(), h = y.dim(1), rows = y.dim(0);
  if (choices == 0)
    return;
  unpermuteDprobsKernel<<<warpRowsGrid(choices), kWarpsPerBlock * 32, 0,
                          be.stream()>>>(view(dout), view(y), slots.i32(),
                                         static_cast<int>(slots.dim(1)),
                                         view(a.out[1]), choices, h, rows);
  MAPP_CUDA_LAUNCHED();
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

void mapp::rt::cuda::moe_grouped_matmul_wgrad(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  const Tensor &x = a.in[0], &dy = a.in[1], &dw = a.out[0];
  int64_t rows = x.dim(0), kd = x.dim(1), nd = dy.dim(1), e = dw.dim(0);
  std::vector<int64_t> off =
      hostOffsets(be, "moe_grouped_matmul_wgrad", a.in[2], rows);
  const __nv_bfloat16 *xb = nullptr, *db = nullptr;
  size_t ws = storedSize(dw);
  for (int64_t g = 0; g < e; ++g) {
    int64_t m = off[g + 1] - off[g];
    void *dst = static_cast<char *>(dw.data) + g * kd * nd * ws;
    if (kd == 0 || nd == 0)
      continue;
    if (m == 0) {
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
           kd, dst, nd, isBf16(dw));
  }
}

void mapp::rt::cuda::moe_aux_loss(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  cudaStream_t s = be.stream();
  int64_t n = a.in[0].dim(0), e = a.in[0].dim(1), k = a.in[1].dim(1);
  double coeff = a.attrs.getFloat("coeff", 0);
  int blocks = static_cast<int>(std::min<int64_t>(kLossBlocks, std::max<int64_t>(n, 1)));
  auto *partial = static_cast<double *>(be.scratch(blocks * e * sizeof(double), 1));
  auxPartialKernel<<<blocks, kWarpsPerBlock * 32,
                     kWarpsPerBlock * e * sizeof(double), s>>>(view(a.in[0]), n,
                                                               static_cast<int>(e),
                                                               partial);
  MAPP_CUDA_LAUNCHED();
  double scale = n ? coeff * double(e) / (double(n) * double(n) * double(k)) : 0;
  auxFinishKernel<<<1, 256, e * sizeof(int), s>>>(
      partial, blocks, static_cast<int>(e), a.in[1].i32(), n * k, scale,
      view(a.out[0]), be.deviceError());
  MAPP_CUDA_LAUNCHED();
}

void mapp::rt::cuda::moe_aux_loss_grad(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  cudaStream_t s = be.stream();
  int64_t n = a.in[1].dim(0), e = a.in[1].dim(1), k = a.in[2].dim(1);
  if (n == 0)
    return;
  double scale = a.attrs.getFloat("coeff", 0) * double(e) /
                 (double(n) * double(n) * double(k));
  auto *g = static_cast<float *>(be.scratch(e * sizeof(float), 1));
  auxGradWeightsKernel<<<1, 256, e * sizeof(int), s>>>(
      a.in[2].i32(), n * k, static_cast<int>(e), view(a.in[0]), scale, g,
      be.deviceError());
  MAPP_CUDA_LAUNCHED();
  auxGradKernel<<<warpRowsGrid(n), kWarpsPerBlock * 32, 0, s>>>(
      view(a.in[1]), g, n, static_cast<int>(e), view(a.out[0]));
  MAPP_CUDA_LAUNCHED();
}

void mapp::rt::cuda::moe_z_loss(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  cudaStream_t s = be.stream();
  int64_t n = a.in[0].dim(0), e = a.in[0].dim(1);
  int blocks = static_cast<int>(std::min<int64_t>(kLossBlocks, std::max<int64_t>(n, 1)));
  auto *partial = static_cast<double *>(be.scratch(blocks * sizeof(double), 1));
  zPartialKernel<<<blocks, kWarpsPerBlock * 32, 0, s>>>(view(a.in[0]), n,
                                                        static_cast<int>(e), partial);
  MAPP_CUDA_LAUNCHED();
  double scale = n ? a.attrs.getFloat("coeff", 0) / double(n) : 0;
  zFinishKernel<<<1, 32, 0, s>>>(partial, blocks, scale, view(a.out[0]));
  MAPP_CUDA_LAUNCHED();
}

void mapp::rt::cuda::moe_z_loss_grad(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  int64_t n = a.in[1].dim(0), e = a.in[1].dim(1);
  if (n == 0)
    return;
  double scale = a.attrs.getFloat("coeff", 0) * 2.0 / double(n);
  zGradKernel<<<warpRowsGrid(n), kWarpsPerBlock * 32, 0, be.stream()>>>(
      view(a.in[0]), view(a.in[1]), n, static_cast<int>(e), scale,
      view(a.out[0]));
  MAPP_CUDA_LAUNCHED();
}
