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
//   grouped matmul    MoeGemm.cu;
//   aux / z losses    MoeLosses.cu.
//
//===----------------------------------------------------------------------===//
#include "CudaBackend.h"
#include "MoeInternal.h"

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cuda;
using namespace mapp::rt::cuda::moe;

namespace {

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

