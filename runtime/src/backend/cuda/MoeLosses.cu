//===- MoeLosses.cu - MoE router losses on the device (docs/moe.md) -------===//
//
// The CPU kernels' semantics (runtime/src/backend/cpu/Moe.cpp) on the device:
//
//   aux / z losses    fixed-grid per-block partials, summed in a fixed order
//                     (deterministic, no float atomics).
//
//===----------------------------------------------------------------------===//
#include "CudaBackend.h"
#include "MoeInternal.h"

#include <cub/block/block_reduce.cuh>

#include <algorithm>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cuda;
using namespace mapp::rt::cuda::moe;

namespace {

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


} // namespace

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
