//===- Softmax.cu - softmax and fused cross-entropy -----------------------===//
//
// One block per row with an online (max, sum) pass. cross_entropy keeps each
// row's log-sum-exp for cross_entropy_grad (CudaBackend::ceSaved), so the
// gradient reads the logits once and writes dlogits once; without a saved
// forward (kernel tests) it recomputes the statistic.
//
//===----------------------------------------------------------------------===//
#include "CudaBackend.h"

#include <cmath>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

constexpr int kThreads = 256;

/// Block-wide combine of per-thread online-softmax states (m, s).
__device__ __forceinline__ void blockMaxSum(float &m, float &s) {
  __shared__ float shm[32], shs[32];
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    float mm = fmaxf(m, m2);
    s = (m == -INFINITY ? 0.0f : s * expf(m - mm)) +
        (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mm));
    m = mm;
  }
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) {
    shm[w] = m;
    shs[w] = s;
  }
  __syncthreads();
  int nw = blockDim.x >> 5;
  m = lane < nw ? shm[lane] : -INFINITY;
  s = lane < nw ? shs[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    float mm = fmaxf(m, m2);
    s = (m == -INFINITY ? 0.0f : s * expf(m - mm)) +
        (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mm));
    m = mm;
  }
  __syncthreads(); // shm/shs are reused by the next call
}

__device__ __forceinline__ float blockSum(float v) {
  __shared__ float sh[32];
  v = warpSum(v);
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0)
    sh[w] = v;
  __syncthreads();
  v = lane < (blockDim.x >> 5) ? sh[lane] : 0.0f;
  v = warpSum(v);
  __syncthreads();
  return v;
}

/// Whether a row kernel over x (and y) may take 8 elements (16 bytes of
/// bf16) per access: rows of a multiple of 8 elements, aligned storage.
inline bool rowsVec8(int64_t n, const void *x, const void *y = nullptr) {
  return n % 8 == 0 && aligned16(x) && aligned16(y);
}

/// Adds 8 values to a thread's online-softmax state (m, s): one rescale for
/// the group's maximum, then its exponentials.
__device__ __forceinline__ void onlineAdd8(const float (&v)[8], float &m,
                                           float &s) {
  float mx = v[0];
#pragma unroll
  for (int j = 1; j < 8; ++j)
    mx = fmaxf(mx, v[j]);
  if (mx == -INFINITY)
    return; // all eight are -inf: they add nothing
  if (mx > m) {
    s = m == -INFINITY ? 0.0f : s * expf(m - mx);
    m = mx;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j)
    s += expf(v[j] - m);
}

/// Row log-sum-exp (natural log) of x[row*n .. +n); vec: rowsVec8 holds.
__device__ __forceinline__ float rowLse(DView x, int64_t base, int64_t n,
                                        bool vec = false) {
  float m = -INFINITY, s = 0;
  if (vec) {
    float v[8];
    for (int64_t c = threadIdx.x * int64_t(8); c < n; c += blockDim.x * int64_t(8)) {
      x.ld8(base + c, v);
      onlineAdd8(v, m, s);
    }
  } else {
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
      float v = x.ld(base + c);
      if (v > m) {
        s = (m == -INFINITY ? 0.0f : s * expf(m - v)) + 1.0f;
        m = v;
      } else {
        s += expf(v - m);
      }
    }
  }
  blockMaxSum(m, s);
  return m == -INFINITY ? m : m + logf(s);
}

__global__ void softmaxKernel(DView x, DView y, int64_t rows, int64_t n) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float lse = rowLse(x, r * n, n);
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x)
      y.st(r * n + c, expf(x.ld(r * n + c) - lse));
  }
}

__global__ void softmaxGradKernel(DView dy, DView y, DView dx, int64_t rows,
                                  int64_t n) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float dot = 0;
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x)
      dot += dy.ld(r * n + c) * y.ld(r * n + c);
    dot = blockSum(dot);
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x)
      dx.st(r * n + c, y.ld(r * n + c) * (dy.ld(r * n + c) - dot));
  }
}

/// Per row: lse, and loss_r = lse − x[target] (0 for ignored rows).
__global__ void ceForward(DView x, const int32_t *t, int64_t rows, int64_t v,
                          int64_t ignore, float *lseOut, float *rowLoss,
                          DeviceError *err, bool vec) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float lse = rowLse(x, r * v, v, vec);
    if (threadIdx.x == 0) {
      lseOut[r] = lse;
      int32_t tr = t[r];
      float loss = 0;
      if (tr != ignore) {
        if (tr < 0 || tr >= v)
          reportError(err, kErrCeTarget, tr, r, v);
        else
          loss = lse - x.ld(r * v + tr);
      }
      rowLoss[r] = loss;
    }
  }
}

/// loss = Σ rowLoss / count (NaN when every row is ignored); count saved.
__global__ void ceFinish(const float *rowLoss, const int32_t *t, int64_t rows,
                         int64_t ignore, float *loss, int *countOut) {
  double s = 0;
  int c = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    s += rowLoss[r];
    c += t[r] != ignore;
  }
  __shared__ double shs[32];
  __shared__ int shc[32];
  for (int o = 16; o > 0; o >>= 1) {
    s += __shfl_xor_sync(0xffffffffu, s, o);
    c += __shfl_xor_sync(0xffffffffu, c, o);
  }
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) {
    shs[w] = s;
    shc[w] = c;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double ts = 0;
    int tc = 0;
    for (int i = 0; i < int(blockDim.x >> 5); ++i) {
      ts += shs[i];
      tc += shc[i];
    }
    *loss = tc ? static_cast<float>(ts / tc) : NAN;
    if (countOut)
      *countOut = tc;
  }
}

__global__ void ceCount(const int32_t *t, int64_t rows, int64_t ignore,
                        int *countOut) {
  int c = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
    c += t[r] != ignore;
  c = static_cast<int>(warpSum(static_cast<float>(c)) + 0.5f);
  __shared__ int sh[32];
  if ((threadIdx.x & 31) == 0)
    sh[threadIdx.x >> 5] = c;
  __syncthreads();
  if (threadIdx.x == 0) {
    int tc = 0;
    for (int i = 0; i < int(blockDim.x >> 5); ++i)
      tc += sh[i];
    *countOut = tc;
  }
}

__global__ void ceBackward(const float *dloss, DView x, const int32_t *t,
                           DView dx, int64_t rows, int64_t v, int64_t ignore,
                           const float *lseIn, const int *count,
                           DeviceError *err, bool vec) {
  float coef = *count ? *dloss / *count : 0.0f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    int32_t tr = t[r];
    int64_t base = r * v;
    bool ignored = tr == ignore;
    if (!ignored && (tr < 0 || tr >= v) && threadIdx.x == 0)
      reportError(err, kErrCeGradTarget, tr, r, v);
    // An ignored row's gradient is zero (no exp of its logits: no inf·0).
    float lse = ignored ? 0.0f : lseIn ? lseIn[r] : rowLse(x, base, v, vec);
    if (vec) {
      float e[8];
      for (int64_t c = threadIdx.x * int64_t(8); c < v; c += blockDim.x * int64_t(8)) {
        if (!ignored)
          x.ld8(base + c, e);
#pragma unroll
        for (int j = 0; j < 8; ++j)
          e[j] = ignored ? 0.0f
                         : coef * (expf(e[j] - lse) - (c + j == tr ? 1.0f : 0.0f));
        dx.st8(base + c, e);
      }
    } else {
      for (int64_t c = threadIdx.x; c < v; c += blockDim.x)
        dx.st(base + c, ignored ? 0.0f
                                : coef * (expf(x.ld(base + c) - lse) -
                                          (c == tr ? 1.0f : 0.0f)));
    }
  }
}

int rowGrid(CudaBackend &be, int64_t rows) {
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(rows, 1),
                                            int64_t(be.smCount()) * 16));
}

} // namespace

void cuda::softmax(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  int64_t n = a.in[0].dim(-1), rows = n ? a.in[0].numel() / n : 0;
  if (!rows)
    return;
  softmaxKernel<<<rowGrid(be, rows), kThreads, 0, be.stream()>>>(
      view(a.in[0]), view(a.out[0]), rows, n);
  MAPP_CUDA_LAUNCHED();
}

void cuda::softmax_grad(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  int64_t n = a.in[1].dim(-1), rows = n ? a.in[1].numel() / n : 0;
  if (!rows)
    return;
  softmaxGradKernel<<<rowGrid(be, rows), kThreads, 0, be.stream()>>>(
      view(a.in[0]), view(a.in[1]), view(a.out[0]), rows, n);
  MAPP_CUDA_LAUNCHED();
}

void cuda::cross_entropy(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  int64_t v = a.in[0].dim(-1), rows = v ? a.in[0].numel() / v : 0;
  int64_t ignore = a.attrs.getInt("ignore_index", -100);
  if (isBf16(a.out[0]))
    fail("cross_entropy: the loss must be stored fp32");
  CeSaved &sv = be.ceSaved(a.in[0].data, std::max<int64_t>(rows, 1));
  sv.logits = a.in[0].data;
  sv.targets = a.in[1].data;
  float *rowLoss = static_cast<float *>(be.scratch(std::max<int64_t>(rows, 1) * 4, 1));
  if (rows) {
    ceForward<<<rowGrid(be, rows), kThreads, 0, be.stream()>>>(
        view(a.in[0]), a.in[1].i32(), rows, v, ignore, sv.lse, rowLoss,
        be.deviceError(), rowsVec8(v, a.in[0].data));
    MAPP_CUDA_LAUNCHED();
  }
  ceFinish<<<1, 1024, 0, be.stream()>>>(rowLoss, a.in[1].i32(), rows, ignore,
                                        a.out[0].f32(), sv.countDev);
  MAPP_CUDA_LAUNCHED();
}

void cuda::cross_entropy_grad(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  int64_t v = a.in[1].dim(-1), rows = v ? a.in[1].numel() / v : 0;
  int64_t ignore = a.attrs.getInt("ignore_index", -100);
  if (!rows)
    return;
  if (isBf16(a.in[0]))
    fail("cross_entropy_grad: dloss must be stored fp32");
  CeSaved *sv = be.findCe(a.in[1].data, a.in[2].data);
  const float *lse = nullptr;
  const int *count;
  if (sv && sv->rows >= rows) {
    lse = sv->lse;
    count = sv->countDev;
    sv->logits = nullptr; // consumed (see attention_grad)
  } else {
    int *c = static_cast<int *>(be.scratch(sizeof(int), 1));
    ceCount<<<1, 1024, 0, be.stream()>>>(a.in[2].i32(), rows, ignore, c);
    MAPP_CUDA_LAUNCHED();
    count = c;
  }
  ceBackward<<<rowGrid(be, rows), kThreads, 0, be.stream()>>>(
      a.in[0].f32(), view(a.in[1]), a.in[2].i32(), view(a.out[0]), rows, v,
      ignore, lse, count, be.deviceError(), rowsVec8(v, a.in[1].data, a.out[0].data));
  MAPP_CUDA_LAUNCHED();
}
