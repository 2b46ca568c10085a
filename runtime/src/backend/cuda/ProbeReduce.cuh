//===- ProbeReduce.cuh - MegaScope reduction kernels (ProbeKernels.cu only) -----===//
//
// Device side of ProbeKernels.cu. Each family of reductions of a probe call is one
// launch that writes its results straight into the call's ring slot:
//  - statistics (max/min/mean/std/absmax/sparsity) and the histogram: one
//    pass over the selection; blocks leave partials in scratch and the last
//    block to finish (a counter in zeroed scratch) merges them in block
//    order and writes the slot, so no finishing launch and no memset;
//  - top-k (k <= kMaxSinglePassK): per-thread sorted lists in registers,
//    merged per block and then by the last block, in one pass;
//  - sketch and raw: one launch each, as before;
//  - lens (logit lens): the norm of the selected rows (lensNormKernel), a
//    cuBLASLt fp32 GEMM against the unembedding (ProbeKernels.cu), then per row
//    the softmax's top-k (lensTopkKernel) into the slot.
// The 256-thread blocks and the fixed merge orders make every result
// deterministic. docs/megascope.md, "GPU capture".
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CUDA_PROBE_REDUCE_CUH
#define MAPP_RT_CUDA_PROBE_REDUCE_CUH

#include "CudaCommon.h"

namespace mapp::rt::cuda::probe_reduce {

constexpr int kThreads = 256;
constexpr int kStatBlocks = 264; // 2 per SM of an H100/H200: enough to saturate
constexpr int kMaxSharedBins = 8192;
constexpr int kMaxSinglePassK = 32;
constexpr int kSketchChunk = 8; // outputs per pass over a row
constexpr int kSketchRows = 4;  // rows per warp
/// Zeroed scratch: the finished-block counter, then the histogram counts.
constexpr size_t kCountsOffset = 256;

/// The selected elements, read in place (no gathered copy): rows of `inner`
/// elements; row r is token toks[r % ntok] of batch row r / ntok (every
/// element when ntok = 0).
struct Selection {
  DView src;
  const int64_t *toks;
  int64_t ntok, T, inner, n;
  __device__ __forceinline__ float ld(int64_t e) const {
    if (!ntok)
      return src.ld(e);
    int64_t row = e / inner, i = e - row * inner;
    int64_t b = row / ntok, t = toks[row - b * ntok];
    return src.ld((b * T + t) * inner + i);
  }
};

// warpSumD, blockReduce, Sum and Max: CudaCommon.h.

/// True in every thread of the last block of the grid to get here. Each
/// thread's earlier global writes (partials, counts) are visible to that
/// block: every thread fences before the block signals.
__device__ __forceinline__ bool lastBlockDone(unsigned *done) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0)
    last = atomicAdd(done, 1u) == gridDim.x - 1;
  __syncthreads();
  return last;
}

// --- Statistics and histogram ----------------------------------------------

struct StatsParams {
  double eps, lo, hi;
  int64_t bins;
  int copies; // private histograms per block in shared memory; 0 = global
  bool stats, moments, hist;
};

/// Sums and extremes, and (count, mean, M2) for the population std.
struct StatPartial {
  double sum, mx, mn, amax, count, mean, m2;
  unsigned long long small;
};

__device__ __forceinline__ StatPartial emptyPartial() {
  return {0, -INFINITY, INFINITY, 0, 0, 0, 0, 0ull};
}

// NaN never wins a comparison, so max/min/absmax skip it as std::max does.
// The moments merge as Chan et al.'s parallel variance: exact in real
// arithmetic, and in double far inside the fp32 tolerance of the results.
__device__ __forceinline__ void mergePartial(StatPartial &a, const StatPartial &b) {
  a.sum += b.sum;
  a.mx = b.mx > a.mx ? b.mx : a.mx;
  a.mn = b.mn < a.mn ? b.mn : a.mn;
  a.amax = b.amax > a.amax ? b.amax : a.amax;
  a.small += b.small;
  if (b.count == 0)
    return;
  if (a.count == 0) {
    a.count = b.count, a.mean = b.mean, a.m2 = b.m2;
    return;
  }
  double n = a.count + b.count, d = b.mean - a.mean;
  a.mean += d * (b.count / n);
  a.m2 += b.m2 + d * d * (a.count * b.count / n);
  a.count = n;
}

__device__ __forceinline__ StatPartial shuffleDown(const StatPartial &p, int o) {
  const unsigned all = 0xffffffffu;
  return {__shfl_down_sync(all, p.sum, o),   __shfl_down_sync(all, p.mx, o),
          __shfl_down_sync(all, p.mn, o),    __shfl_down_sync(all, p.amax, o),
          __shfl_down_sync(all, p.count, o), __shfl_down_sync(all, p.mean, o),
          __shfl_down_sync(all, p.m2, o),    __shfl_down_sync(all, p.small, o)};
}

/// The block's merge in a fixed tree order; the result is in thread 0.
__device__ StatPartial blockMerge(StatPartial p) {
  __shared__ StatPartial warps[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) {
    StatPartial q = shuffleDown(p, o);
    if ((threadIdx.x & 31) + o < 32)
      mergePartial(p, q);
  }
  __syncthreads(); // an earlier call's readers are done with `warps`
  if ((threadIdx.x & 31) == 0)
    warps[threadIdx.x >> 5] = p;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < (int)(blockDim.x / 32); ++w)
      mergePartial(p, warps[w]);
  return p;
}

__device__ __forceinline__ StatPartial loadPartial(const StatPartial *p) {
  return {__ldcg(&p->sum),  __ldcg(&p->mx),   __ldcg(&p->mn),
          __ldcg(&p->amax), __ldcg(&p->count), __ldcg(&p->mean),
          __ldcg(&p->m2),   __ldcg(&p->small)};
}

/// One pass for every statistic and the histogram of a probe. `res`: the
/// slot's six doubles (max, min, mean, std, absmax, sparsity); `slotCounts`:
/// its histogram; `zeroed`: the zeroed scratch (counter, then counts).
/// Histogram bins use the CPU's double arithmetic; `copies` private
/// histograms per block (one per warp when they fit: activations pile into
/// few bins, and warps sharing one counter serialize).
__global__ void __launch_bounds__(kThreads)
    statsHistKernel(Selection x, StatsParams sp, StatPartial *parts,
                    unsigned *zeroed, double *res, unsigned *slotCounts) {
  extern __shared__ unsigned local[];
  int64_t n = x.n, bins = sp.bins;
  unsigned *done = zeroed;
  unsigned *counts = zeroed + kCountsOffset / sizeof(unsigned);
  unsigned *h = counts;
  if (sp.hist && sp.copies) {
    for (int64_t b = threadIdx.x; b < bins * sp.copies; b += blockDim.x)
      local[b] = 0;
    __syncthreads();
    h = local + (threadIdx.x / 32 % sp.copies) * bins;
  }
  StatPartial p = emptyPartial();
  double shift = 0, s1 = 0, s2 = 0; // moments around the thread's first value
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    double v = x.ld(i);
    if (sp.stats) {
      p.sum += v;
      p.mx = v > p.mx ? v : p.mx;
      p.mn = v < p.mn ? v : p.mn;
      p.amax = fabs(v) > p.amax ? fabs(v) : p.amax;
      p.small += fabs(v) < sp.eps;
      if (sp.moments) {
        if (p.count == 0)
          shift = v;
        double d = v - shift;
        s1 += d;
        s2 += d * d;
        p.count += 1;
      }
    }
    if (sp.hist && v >= sp.lo && v <= sp.hi) {
      int64_t b = static_cast<int64_t>((v - sp.lo) / (sp.hi - sp.lo) * bins);
      atomicAdd(&h[b < bins - 1 ? b : bins - 1], 1u);
    }
  }
  if (sp.hist && sp.copies) {
    __syncthreads();
    for (int64_t b = threadIdx.x; b < bins; b += blockDim.x) {
      unsigned c = 0;
      for (int k = 0; k < sp.copies; ++k)
        c += local[k * bins + b];
      if (c)
        atomicAdd(&counts[b], c);
    }
  }
  if (sp.stats) {
    if (p.count) {
      p.mean = shift + s1 / p.count;
      p.m2 = fmax(s2 - s1 * s1 / p.count, 0.0);
    }
    p = blockMerge(p);
    if (threadIdx.x == 0)
      parts[blockIdx.x] = p;
  }
  if (!lastBlockDone(done))
    return;
  if (sp.stats) {
    StatPartial a = emptyPartial();
    for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x)
      mergePartial(a, loadPartial(parts + b));
    a = blockMerge(a);
    if (threadIdx.x == 0) {
      double nn = static_cast<double>(n);
      res[0] = n ? a.mx : NAN;
      res[1] = n ? a.mn : NAN;
      res[2] = n ? a.sum / nn : NAN;
      res[3] = n ? ::sqrt(a.m2 / nn) : NAN;
      res[4] = a.amax;
      res[5] = n ? a.small / nn : NAN;
    }
  }
  if (sp.hist)
    for (int64_t b = threadIdx.x; b < bins; b += blockDim.x) {
      slotCounts[b] = __ldcg(&counts[b]);
      counts[b] = 0; // the scratch is zero again for the next launch
    }
  if (threadIdx.x == 0)
    *done = 0;
}

// --- Top-k -----------------------------------------------------------------

/// A total order of (value desc, index asc) as one integer: the value's bits
/// made order-preserving, then the complemented index. 0 = none (NaN).
__device__ __forceinline__ unsigned long long topKey(float v, int64_t i) {
  if (v != v)
    return 0;
  uint32_t b = v == 0 ? 0u : __float_as_uint(v); // -0 ties with +0, as on the CPU
  uint32_t o = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<unsigned long long>(o) << 32) |
         (0xFFFFFFFFull - static_cast<unsigned long long>(i));
}

/// The element index a nonzero key was made from.
__device__ __forceinline__ uint32_t keyIndex(unsigned long long key) {
  return 0xFFFFFFFFu - static_cast<uint32_t>(key);
}

/// Inserts `key` into the descending list (registers: constant indices
/// only), dropping the smallest.
template <int K>
__device__ __forceinline__ void insertKey(unsigned long long (&list)[K],
                                          unsigned long long key) {
  if (key <= list[K - 1])
    return;
#pragma unroll
  for (int j = 0; j < K; ++j) {
    unsigned long long a = list[j];
    bool takes = key > a;
    list[j] = takes ? key : a;
    key = takes ? a : key;
  }
}

/// The block's `k` largest keys of all threads' lists into `chosen`, in
/// order (0 past the last key): k rounds of a block max over the list
/// heads; the owner of the winner (keys are unique) pops it.
template <int K>
__device__ void blockTopK(unsigned long long (&list)[K], int k,
                          unsigned long long *chosen) {
  for (int r = 0; r < k; ++r) {
    unsigned long long best = blockReduce(list[0], Max());
    if (threadIdx.x == 0)
      chosen[r] = best;
    if (!best) { // every list is empty: the rest is none
      for (int j = r + 1 + threadIdx.x; j < k; j += blockDim.x)
        chosen[j] = 0;
      break;
    }
    if (list[0] == best) {
#pragma unroll
      for (int j = 0; j + 1 < K; ++j)
        list[j] = list[j + 1];
      list[K - 1] = 0;
    }
  }
  __syncthreads();
}

/// Top-k (k <= K) in one launch: each block selects its k best keys into
/// `parts` (K per block), the last block selects the k best of those into
/// the slot's `keys`.
template <int K>
__global__ void __launch_bounds__(kThreads)
    topkKernel(Selection x, int k, unsigned long long *parts, unsigned *done,
               unsigned long long *keys) {
  __shared__ unsigned long long chosen[K];
  unsigned long long list[K];
#pragma unroll
  for (int j = 0; j < K; ++j)
    list[j] = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < x.n;
       i += int64_t(gridDim.x) * blockDim.x)
    insertKey(list, topKey(x.ld(i), i));
  blockTopK(list, k, chosen);
  if (threadIdx.x < k)
    parts[blockIdx.x * K + threadIdx.x] = chosen[threadIdx.x];
  if (!lastBlockDone(done))
    return;
#pragma unroll
  for (int j = 0; j < K; ++j)
    list[j] = 0;
  int64_t candidates = int64_t(gridDim.x) * k;
  for (int64_t c = threadIdx.x; c < candidates; c += blockDim.x)
    insertKey(list, __ldcg(&parts[c / k * K + c % k]));
  blockTopK(list, k, chosen);
  if (threadIdx.x < k)
    keys[threadIdx.x] = chosen[threadIdx.x];
  if (threadIdx.x == 0)
    *done = 0;
}

/// Large k: pass j takes the largest key below key j-1 (k launches over a
/// zeroed `keys`).
__global__ void topkPass(Selection x, unsigned long long *keys, int j) {
  unsigned long long below = j ? keys[j - 1] : ~0ull, best = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < x.n;
       i += int64_t(gridDim.x) * blockDim.x) {
    unsigned long long k = topKey(x.ld(i), i);
    if (k < below && k > best)
      best = k;
  }
  best = blockReduce(best, Max());
  if (threadIdx.x == 0 && best)
    atomicMax(&keys[j], best);
}

// --- Logit lens ----------------------------------------------------------------

/// One lens call (LogitLens.cpp): rows = the selected positions of batch
/// row 0, k <= vocab.
struct LensParams {
  const int64_t *positions; // device, `rows` entries in [0, T)
  int64_t rows, hidden, vocab;
  int k;
  bool rms;
  double eps;
};

/// y[r] = norm(x[0, positions[r]]) with LogitLens.cpp's double arithmetic,
/// stored fp32 for the GEMM (beta.p null: no shift). One block per row.
__global__ void __launch_bounds__(kThreads)
    lensNormKernel(LensParams lp, DView x, DView gamma, DView beta, float *y) {
  int64_t r = blockIdx.x, H = lp.hidden, base = lp.positions[r] * H;
  double mean = 0;
  if (!lp.rms) {
    double s = 0;
    for (int64_t h = threadIdx.x; h < H; h += blockDim.x)
      s += x.ld(base + h);
    mean = blockReduce(s, Sum()) / H;
  }
  double ss = 0;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    double d = x.ld(base + h) - mean;
    ss += d * d;
  }
  double inv = 1.0 / ::sqrt(blockReduce(ss, Sum()) / H + lp.eps);
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x)
    y[r * H + h] = static_cast<float>((x.ld(base + h) - mean) * inv * gamma.ld(h) +
                                      (beta.p ? beta.ld(h) : 0.0));
}

/// Row r of logits [rows, vocab]: its k most likely ids (topKey's order:
/// value desc, lower id first, as the CPU's sort) and softmax probabilities,
/// into ids/probs [rows, k] of the slot; `keys` is [rows, k] scratch. Any k
/// in rounds of K: a round keeps per thread the K best keys below the last
/// one chosen and the block takes up to K of them (blockTopK), so the
/// selection is exact in ceil(k / K) passes over the row. The softmax sums
/// exp(l - max) in double. One block per row.
template <int K>
__global__ void __launch_bounds__(kThreads)
    lensTopkKernel(LensParams lp, const float *logits, unsigned long long *keys,
                   uint32_t *ids, float *probs) {
  int64_t r = blockIdx.x, V = lp.vocab;
  int k = lp.k;
  const float *row = logits + r * V;
  unsigned long long *chosen = keys + r * k, below = ~0ull;
  for (int done = 0; done < k; done += K) {
    unsigned long long list[K];
#pragma unroll
    for (int j = 0; j < K; ++j)
      list[j] = 0;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      unsigned long long key = topKey(row[v], v);
      if (key < below)
        insertKey(list, key);
    }
    int take = k - done < K ? k - done : K;
    blockTopK(list, take, chosen + done); // ends with a __syncthreads
    below = chosen[done + take - 1];
  }
  // The first key is the row's max (0: every logit is NaN).
  double m = chosen[0] ? row[keyIndex(chosen[0])] : NAN, z = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
    z += ::exp(row[v] - m);
  z = blockReduce(z, Sum());
  for (int j = threadIdx.x; j < k; j += blockDim.x) {
    unsigned long long key = chosen[j];
    ids[r * k + j] = key ? keyIndex(key) : 0;
    probs[r * k + j] = key ? static_cast<float>(::exp(row[keyIndex(key)] - m) / z)
                           : NAN;
  }
}

// --- Sketch and raw ----------------------------------------------------------

/// out[row, j] = Σ_i R[j][i]·x[row, i] in double. One warp takes
/// kSketchRows rows, so each load of R (from L1: all warps share it) serves
/// that many rows; each row's sum runs in the same order as with a warp per
/// row (lane-strided i, then the warp's butterfly), so the bits are the same.
__global__ void sketchKernel(Selection x, const double *r, int64_t rows,
                             int64_t dim, float *out) {
  int lane = threadIdx.x & 31;
  int64_t row0 = (blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32) *
                 kSketchRows;
  if (row0 >= rows)
    return;
  int nrows = static_cast<int>(rows - row0 < kSketchRows ? rows - row0 : kSketchRows);
  int64_t inner = x.inner;
  for (int64_t j0 = 0; j0 < dim; j0 += kSketchChunk) {
    int jn = static_cast<int>(dim - j0 < kSketchChunk ? dim - j0 : kSketchChunk);
    double acc[kSketchRows][kSketchChunk] = {};
    for (int64_t i = lane; i < inner; i += 32) {
      double xv[kSketchRows];
#pragma unroll
      for (int q = 0; q < kSketchRows; ++q)
        xv[q] = q < nrows ? x.ld((row0 + q) * inner + i) : 0.0;
#pragma unroll
      for (int jj = 0; jj < kSketchChunk; ++jj)
        if (jj < jn) {
          double rv = r[(j0 + jj) * inner + i];
#pragma unroll
          for (int q = 0; q < kSketchRows; ++q)
            acc[q][jj] += rv * xv[q];
        }
    }
#pragma unroll
    for (int q = 0; q < kSketchRows; ++q)
#pragma unroll
      for (int jj = 0; jj < kSketchChunk; ++jj) {
        double v = warpSumD(acc[q][jj]);
        if (lane == 0 && jj < jn && q < nrows)
          out[(row0 + q) * dim + j0 + jj] = static_cast<float>(v);
      }
  }
}

__global__ void rawKernel(Selection x, int64_t n, float *out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = x.ld(i);
}

} // namespace mapp::rt::cuda::probe_reduce

#endif
