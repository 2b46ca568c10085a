//===- Probe.cu - MegaScope probe reductions on the device ----------------===//
//
// The CUDA "probe" kernel: every reduction of the probe reads the selected
// tokens in place (fp32 or bf16 storage) on the compute stream into one slot of the capture ring
// (ProbeCapture.h), and the slot is copied to the host behind the step. The
// results equal src/probe/Reductions.cpp's: statistics and sketches
// accumulate in double (in another order, so within fp32 rounding), histogram
// bins use the same double arithmetic, top-k keys order (value, lower index)
// exactly. `attn` (recomputed attention probabilities) is staged through the
// host and reduced by the CPU code: it is meant for a few sampled steps.
//
//===----------------------------------------------------------------------===//
#include "CudaBackend.h"
#include "ProbeCapture.h"
#include "mapp/rt/ProbeReduce.h"

#include <algorithm>
#include <sstream>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

constexpr int kThreads = 256;
constexpr int kStatBlocks = 264; // 2 per SM of an H100/H200: enough to saturate
constexpr int kMaxSharedBins = 8192;

/// The selected elements, read in place (no gathered copy: the reductions
/// read the stored value once or twice): rows of `inner` elements; row r is
/// token toks[r % ntok] of batch row r / ntok (every element when ntok = 0).
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

struct StatPartial {
  double sum, mx, mn, amax;
  unsigned long long small;
};

__device__ __forceinline__ double warpSumD(double v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Block-wide reduction of one value; `op` combines two. Every thread gets
/// the result.
template <typename T, typename Op>
__device__ T blockReduce(T v, Op op) {
  __shared__ T part[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1)
    v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0)
    part[w] = v;
  __syncthreads();
  T r = part[0];
  for (int i = 1; i < (int)(blockDim.x / 32); ++i)
    r = op(r, part[i]);
  return r;
}

struct Add {
  template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct Max {
  template <typename T> __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};
struct Min {
  template <typename T> __device__ T operator()(T a, T b) const { return a < b ? a : b; }
};

// NaN never wins a comparison, so max/min/absmax skip it as std::max does.
__global__ void statsKernel(Selection x, int64_t n, double eps,
                            StatPartial *out) {
  double sum = 0, mx = -INFINITY, mn = INFINITY, amax = 0;
  unsigned long long small = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    double v = x.ld(i);
    sum += v;
    mx = v > mx ? v : mx;
    mn = v < mn ? v : mn;
    amax = fabs(v) > amax ? fabs(v) : amax;
    small += fabs(v) < eps;
  }
  sum = blockReduce(sum, Add());
  mx = blockReduce(mx, Max());
  mn = blockReduce(mn, Min());
  amax = blockReduce(amax, Max());
  small = blockReduce(small, Add());
  if (threadIdx.x == 0)
    out[blockIdx.x] = {sum, mx, mn, amax, small};
}

/// Slot scalars: max, min, mean, std, absmax, sparsity (doubles). One block.
__global__ void statsFinal(const StatPartial *p, int parts, int64_t n,
                           double *res) {
  if (threadIdx.x != 0)
    return;
  StatPartial a = p[0];
  for (int i = 1; i < parts; ++i) {
    a.sum += p[i].sum;
    a.mx = p[i].mx > a.mx ? p[i].mx : a.mx;
    a.mn = p[i].mn < a.mn ? p[i].mn : a.mn;
    a.amax = p[i].amax > a.amax ? p[i].amax : a.amax;
    a.small += p[i].small;
  }
  double nn = static_cast<double>(n);
  res[0] = n ? a.mx : NAN;
  res[1] = n ? a.mn : NAN;
  res[2] = n ? a.sum / nn : NAN;
  res[4] = a.amax;
  res[5] = n ? a.small / nn : NAN;
}

/// Second pass of the two-pass population std around res[2].
__global__ void varianceKernel(Selection x, int64_t n, const double *res,
                               double *out) {
  double mean = res[2], ss = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    double d = x.ld(i) - mean;
    ss += d * d;
  }
  ss = blockReduce(ss, Add());
  if (threadIdx.x == 0)
    out[blockIdx.x] = ss;
}

__global__ void varianceFinal(const double *p, int parts, int64_t n,
                              double *res) {
  if (threadIdx.x != 0)
    return;
  double ss = 0;
  for (int i = 0; i < parts; ++i)
    ss += p[i];
  res[3] = n ? sqrt(ss / static_cast<double>(n)) : NAN;
}

/// `copies` private histograms per block in shared memory (one per warp
/// when they fit: activations pile into few bins, and warps sharing one
/// counter serialize), merged into the slot's counts; copies = 0 counts in
/// global memory directly (very many bins).
__global__ void histKernel(Selection x, int64_t n, double lo, double hi,
                           int64_t bins, unsigned *counts, int copies) {
  extern __shared__ unsigned local[];
  unsigned *h = counts;
  if (copies) {
    for (int64_t b = threadIdx.x; b < bins * copies; b += blockDim.x)
      local[b] = 0;
    __syncthreads();
    h = local + (threadIdx.x / 32 % copies) * bins;
  }
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    double v = x.ld(i);
    if (!(v >= lo && v <= hi))
      continue;
    int64_t b = static_cast<int64_t>((v - lo) / (hi - lo) * bins);
    atomicAdd(&h[b < bins - 1 ? b : bins - 1], 1u);
  }
  if (copies) {
    __syncthreads();
    for (int64_t b = threadIdx.x; b < bins; b += blockDim.x) {
      unsigned c = 0;
      for (int k = 0; k < copies; ++k)
        c += local[k * bins + b];
      if (c)
        atomicAdd(&counts[b], c);
    }
  }
}

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

/// Pass j of top-k: the largest key below key j-1. k passes over the data;
/// meant for the few thousand to few million elements a probe selects.
__global__ void topkPass(Selection x, int64_t n, unsigned long long *keys,
                         int j) {
  unsigned long long below = j ? keys[j - 1] : ~0ull, best = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    unsigned long long k = topKey(x.ld(i), i);
    if (k < below && k > best)
      best = k;
  }
  best = blockReduce(best, Max());
  if (threadIdx.x == 0 && best)
    atomicMax(&keys[j], best);
}

constexpr int kSketchChunk = 16;

/// out[row, j] = Σ_i R[j][i]·x[row, i] in double; one warp per row reads the
/// row once per 16 outputs (R stays in L1/L2: all warps share it).
__global__ void sketchKernel(Selection x, const double *r, int64_t rows,
                             int64_t dim, float *out) {
  int lane = threadIdx.x & 31;
  int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows)
    return;
  int64_t inner = x.inner;
  for (int64_t j0 = 0; j0 < dim; j0 += kSketchChunk) {
    int jn = static_cast<int>(dim - j0 < kSketchChunk ? dim - j0 : kSketchChunk);
    double acc[kSketchChunk] = {};
    for (int64_t i = lane; i < inner; i += 32) {
      double xv = x.ld(row * inner + i);
#pragma unroll
      for (int jj = 0; jj < kSketchChunk; ++jj)
        if (jj < jn)
          acc[jj] += r[(j0 + jj) * inner + i] * xv;
    }
#pragma unroll
    for (int jj = 0; jj < kSketchChunk; ++jj) {
      double v = warpSumD(acc[jj]);
      if (lane == 0 && jj < jn)
        out[row * dim + j0 + jj] = static_cast<float>(v);
    }
  }
}

__global__ void rawKernel(Selection x, int64_t n, float *out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = x.ld(i);
}

std::vector<std::string> splitList(const std::string &s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty())
      out.push_back(item);
  return out;
}

size_t align16(size_t b) { return (b + 15) / 16 * 16; }

/// Host copy (fp32) of a stored float tensor: for the staged `attn` path.
std::vector<float> hostFloats(CudaBackend &be, const Tensor &t) {
  int64_t n = t.numel();
  std::vector<float> h(std::max<int64_t>(n, 1));
  if (!n)
    return h;
  const void *src = t.data;
  if (isBf16(t)) {
    float *tmp = static_cast<float *>(be.probeCapture().work(n * 4, 2));
    copyConvert(view(t), {tmp, 0}, n, be.stream());
    src = tmp;
  }
  be.copyFromStorage(h.data(), src, n * 4);
  return h;
}

void stagedAttention(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  std::vector<float> q = hostFloats(be, a.in[0]), k = hostFloats(be, a.in[1]);
  ProbeSample s = attentionProbs(a.attrs, q.data(), k.data(), a.in[0].shape());
  s.probeId = a.attrs.getInt("probe_id", 0);
  s.step = a.ctx.step;
  s.microbatch = a.ctx.microbatch;
  a.ctx.probe->record(std::move(s));
}

} // namespace

void cuda::probe(const KernelArgs &a) {
  ProbeRuntime *rt = a.ctx.probe;
  if (!rt)
    return;
  if (!rt->generating() && a.ctx.step % a.attrs.getInt("every", 1) != 0)
    return;
  std::vector<std::string> reds = splitList(a.attrs.getStr("reduce", ""));
  if (reds.size() == 1 && reds[0] == "attn")
    return stagedAttention(a);
  CudaBackend &be = backendOf(a);
  ProbeCapture &cap = be.probeCapture();
  cudaStream_t st = be.stream();
  const Tensor &x = a.in[0];
  int64_t probeId = a.attrs.getInt("probe_id", 0);

  // The selection, as ProbeKernels.cpp / selectTokens define it.
  std::vector<int64_t> toks = a.attrs.getInts("tokens");
  bool select = !toks.empty() && x.rank() >= 2;
  int64_t rows0 = x.rank() >= 2 ? x.dim(0) * x.dim(1) : 0;
  int64_t inner = select || x.rank() >= 3
                      ? x.numel() / std::max<int64_t>(rows0, 1)
                      : (x.rank() ? x.dim(-1) : 1);
  int64_t n = select ? x.dim(0) * static_cast<int64_t>(toks.size()) * inner
                     : x.numel();
  Selection sel{view(x), nullptr, 0, select ? x.dim(1) : 0, inner, n};
  if (select) {
    sel.toks = cap.constants().ints(&a.attrs, 0, toks);
    sel.ntok = static_cast<int64_t>(toks.size());
  }

  // Slot layout: the six statistics (when any is asked for), then each
  // vector result 16-byte aligned, in the order of `reduce`.
  bool needStats = false, needStd = false;
  for (const std::string &r : reds) {
    needStats |= r == "max" || r == "min" || r == "mean" || r == "std" ||
                 r == "absmax" || r == "sparsity";
    needStd |= r == "std";
  }
  static const char *kStatNames[] = {"max", "min", "mean", "std", "absmax",
                                     "sparsity"};
  std::vector<ResultField> fields;
  size_t bytes = needStats ? 6 * sizeof(double) : 0;
  int64_t bins = a.attrs.getInt("bins", 32);
  int64_t k = std::min<int64_t>(a.attrs.getInt("k", 10), n);
  int64_t dim = a.attrs.getInt("dim", 16);
  int64_t sketchRows = inner ? n / inner : 0;
  int64_t cap4 = std::min<int64_t>(a.attrs.getInt("cap", 4096), n);
  if (n > 0xFFFFFFFEll && std::find(reds.begin(), reds.end(), "topk") != reds.end())
    fail("probe ", probeId, ": topk over ", n, " elements (the device keys "
         "hold 32-bit indices); select tokens");
  for (const std::string &r : reds) {
    ResultField f;
    f.reduction = r;
    if (needStats && (r == "max" || r == "min" || r == "mean" || r == "std" ||
                      r == "absmax" || r == "sparsity")) {
      f.kind = ResultField::Scalar;
      for (int i = 0; i < 6; ++i)
        if (r == kStatNames[i])
          f.offset = i * sizeof(double);
      fields.push_back(f);
      continue;
    }
    f.offset = bytes;
    if (r == "hist") {
      f.kind = ResultField::Counts;
      f.count = bins;
      bytes += align16(bins * 4);
    } else if (r == "topk") {
      f.kind = ResultField::TopKeys;
      f.count = k;
      bytes += align16(std::max<int64_t>(k, 1) * 8);
    } else if (r == "sketch") {
      f.kind = ResultField::Floats;
      f.count = sketchRows * dim;
      f.shape = {sketchRows, dim};
      bytes += align16(f.count * 4);
    } else if (r == "raw") {
      f.kind = ResultField::Floats;
      f.count = cap4;
      f.shape = {cap4};
      bytes += align16(cap4 * 4);
    } else {
      fail("probe ", probeId, ": reduction '", r, "' cannot be combined "
           "with others on the device");
    }
    if (f.kind != ResultField::Floats)
      f.shape = {f.count};
    fields.push_back(f);
  }

  uint8_t *slot = cap.reserve(
      bytes, "probe " + std::to_string(probeId) + " ('" +
                 a.attrs.getStr("point", "") + "')");
  // A slot must be committed or cancelled, or the worker waits for it.
  try {
    if (needStats) {
      StatPartial *part = static_cast<StatPartial *>(
          cap.work(kStatBlocks * sizeof(StatPartial), 1));
      double *res = reinterpret_cast<double *>(slot);
      statsKernel<<<kStatBlocks, kThreads, 0, st>>>(
          sel, n, a.attrs.getFloat("eps", 1e-6), part);
      MAPP_CUDA_LAUNCHED();
      statsFinal<<<1, 32, 0, st>>>(part, kStatBlocks, n, res);
      MAPP_CUDA_LAUNCHED();
      if (needStd) {
        double *vpart = reinterpret_cast<double *>(part); // stats consumed
        varianceKernel<<<kStatBlocks, kThreads, 0, st>>>(sel, n, res, vpart);
        MAPP_CUDA_LAUNCHED();
        varianceFinal<<<1, 32, 0, st>>>(vpart, kStatBlocks, n, res);
        MAPP_CUDA_LAUNCHED();
      }
    }
    for (const ResultField &f : fields) {
      uint8_t *out = slot + f.offset;
      if (f.reduction == "hist") {
        MAPP_CUDA_CHECK(cudaMemsetAsync(out, 0, bins * 4, st));
        if (!n)
          continue;
        int copies = bins * (kThreads / 32) <= kMaxSharedBins ? kThreads / 32
                     : bins <= kMaxSharedBins                  ? 1
                                                               : 0;
        histKernel<<<gridFor(n, kThreads, kStatBlocks), kThreads,
                     copies * bins * 4, st>>>(
            sel, n, a.attrs.getFloat("lo", -8), a.attrs.getFloat("hi", 8), bins,
            reinterpret_cast<unsigned *>(out), copies);
        MAPP_CUDA_LAUNCHED();
      } else if (f.reduction == "topk") {
        auto *keys = reinterpret_cast<unsigned long long *>(out);
        MAPP_CUDA_CHECK(cudaMemsetAsync(keys, 0, std::max<int64_t>(k, 1) * 8, st));
        for (int j = 0; j < k; ++j) {
          topkPass<<<gridFor(n, kThreads, kStatBlocks), kThreads, 0, st>>>(
              sel, n, keys, j);
          MAPP_CUDA_LAUNCHED();
        }
      } else if (f.reduction == "sketch" && f.count) {
        const double *r = cap.constants().projection(
            static_cast<uint64_t>(a.attrs.getInt("seed", 0)), dim, inner, st);
        int64_t blocks = (sketchRows + 7) / 8; // 8 warps, a row each
        sketchKernel<<<static_cast<unsigned>(blocks), kThreads, 0, st>>>(
            sel, r, sketchRows, dim, reinterpret_cast<float *>(out));
        MAPP_CUDA_LAUNCHED();
      } else if (f.reduction == "raw" && f.count) {
        rawKernel<<<gridFor(f.count, kThreads), kThreads, 0, st>>>(
            sel, f.count, reinterpret_cast<float *>(out));
        MAPP_CUDA_LAUNCHED();
      }
    }
  } catch (...) {
    cap.cancel();
    throw;
  }
  cap.commit(std::move(fields), rt, probeId, a.ctx.step, a.ctx.microbatch);
}
