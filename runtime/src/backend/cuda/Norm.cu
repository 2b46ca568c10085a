//===- Norm.cu - layer_norm, rms_norm and their gradients -----------------===//
//
// One warp per row. Forward: statistics in fp32 with a two-pass variance (the
// second pass re-reads the row from L1), one write. Backward: dx per row (the
// row statistics saved to scratch), then dgamma/dbeta as column sums over row
// chunks and a fixed-order fp64 sum of the chunks (deterministic, no atomics).
//
//===----------------------------------------------------------------------===//
#include "CudaBackend.h"

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

constexpr int kWarps = 8;

struct Stats {
  float mean, rstd;
};

__device__ __forceinline__ Stats rowStats(DView x, int64_t base, int64_t h,
                                          float eps, bool rms, int lane) {
  float s = 0;
  if (!rms) {
    for (int64_t c = lane; c < h; c += 32)
      s += x.ld(base + c);
    s = warpSum(s);
  }
  float mean = rms ? 0.0f : s / h;
  float v = 0;
  for (int64_t c = lane; c < h; c += 32) {
    float d = x.ld(base + c) - mean;
    v += d * d;
  }
  v = warpSum(v);
  return {mean, rsqrtf(v / h + eps)};
}

__global__ void normForward(DView x, const float *g, const float *b, DView y,
                            int64_t rows, int64_t h, float eps, bool rms) {
  int lane = threadIdx.x & 31;
  int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
       r < rows; r += warps) {
    int64_t base = r * h;
    Stats st = rowStats(x, base, h, eps, rms, lane);
    for (int64_t c = lane; c < h; c += 32) {
      float xh = (x.ld(base + c) - st.mean) * st.rstd;
      y.st(base + c, b ? xh * g[c] + b[c] : xh * g[c]);
    }
  }
}

/// dx per row (one warp a row); the row statistics go to stats[2r..2r+1]
/// for the column pass.
__global__ void normBackwardRows(DView dy, DView x, const float *g, DView dx,
                                 int64_t rows, int64_t h, float eps, bool rms,
                                 float *stats) {
  int lane = threadIdx.x & 31;
  int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
       r < rows; r += warps) {
    int64_t base = r * h;
    Stats st = rowStats(x, base, h, eps, rms, lane);
    float sg = 0, sgx = 0;
    for (int64_t c = lane; c < h; c += 32) {
      float xh = (x.ld(base + c) - st.mean) * st.rstd;
      float gdy = dy.ld(base + c) * g[c];
      sg += gdy;
      sgx += gdy * xh;
    }
    sg = warpSum(sg) / h;
    sgx = warpSum(sgx) / h;
    for (int64_t c = lane; c < h; c += 32) {
      float xh = (x.ld(base + c) - st.mean) * st.rstd;
      float gdy = dy.ld(base + c) * g[c];
      // layer: rstd·(gdy − mean(gdy) − xhat·mean(gdy·xhat));
      // rms:   rstd·(gdy − xhat·mean(gdy·xhat)).
      dx.st(base + c, st.rstd * (gdy - (rms ? 0.0f : sg) - xh * sgx));
    }
    if (lane == 0) {
      stats[2 * r] = st.mean;
      stats[2 * r + 1] = st.rstd;
    }
  }
}

/// Column partial sums of dy·xhat (and dy) over row chunks:
/// partial[chunk][0..h) (and [h..2h)). 32 columns × 8 warps per block.
__global__ void normBackwardCols(DView dy, DView x, const float *stats,
                                 int64_t rows, int64_t h, bool rms,
                                 int64_t rowsPer, float *partial) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int64_t c = blockIdx.x * 32 + lane;
  int64_t r0 = blockIdx.y * rowsPer, r1 = min(rows, r0 + rowsPer);
  float s0 = 0, s1 = 0;
  if (c < h)
    for (int64_t r = r0 + w; r < r1; r += kWarps) {
      float d = dy.ld(r * h + c);
      s0 += d * (x.ld(r * h + c) - stats[2 * r]) * stats[2 * r + 1];
      s1 += d;
    }
  __shared__ float sh0[kWarps][33], sh1[kWarps][33];
  sh0[w][lane] = s0;
  sh1[w][lane] = s1;
  __syncthreads();
  if (w == 0 && c < h) {
    float t0 = 0, t1 = 0;
    for (int i = 0; i < kWarps; ++i) {
      t0 += sh0[i][lane];
      t1 += sh1[i][lane];
    }
    int nacc = rms ? 1 : 2;
    partial[blockIdx.y * nacc * h + c] = t0;
    if (!rms)
      partial[blockIdx.y * nacc * h + h + c] = t1;
  }
}

__global__ void sumPartials(const float *partial, int64_t blocks, int64_t width,
                            float *out0, float *out1, int64_t h) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < width;
       c += int64_t(gridDim.x) * blockDim.x) {
    double s = 0;
    for (int64_t k = 0; k < blocks; ++k)
      s += partial[k * width + c];
    if (c < h)
      out0[c] = static_cast<float>(s);
    else
      out1[c - h] = static_cast<float>(s);
  }
}

float epsOf(const KernelArgs &a) {
  return static_cast<float>(a.attrs.getFloat("eps", 1e-5));
}

const float *f32Param(const Tensor &t, const char *kernel) {
  if (isBf16(t))
    fail(kernel, ": the CUDA backend expects fp32 norm parameters");
  return t.f32();
}

void forward(const KernelArgs &a, bool rms) {
  CudaBackend &be = backendOf(a);
  const char *k = rms ? "rms_norm" : "layer_norm";
  int64_t h = a.in[0].dim(-1), rows = h ? a.in[0].numel() / h : 0;
  if (!rows)
    return;
  const float *g = f32Param(a.in[1], k);
  const float *b = rms ? nullptr : f32Param(a.in[2], k);
  normForward<<<gridFor(rows * 32, 32 * kWarps), 32 * kWarps, 0, be.stream()>>>(
      view(a.in[0]), g, b, view(a.out[0]), rows, h, epsOf(a), rms);
  MAPP_CUDA_LAUNCHED();
}

void backward(const KernelArgs &a, bool rms) {
  CudaBackend &be = backendOf(a);
  const char *k = rms ? "rms_norm_grad" : "layer_norm_grad";
  int64_t h = a.in[1].dim(-1), rows = h ? a.in[1].numel() / h : 0;
  int nacc = rms ? 1 : 2;
  float *out0 = a.out[1].f32(), *out1 = rms ? nullptr : a.out[2].f32();
  if (isBf16(a.out[1]) || (!rms && isBf16(a.out[2])))
    fail(k, ": the CUDA backend expects fp32 parameter gradients");
  if (!h)
    return;
  if (!rows) {
    MAPP_CUDA_CHECK(cudaMemsetAsync(out0, 0, h * 4, be.stream()));
    if (out1)
      MAPP_CUDA_CHECK(cudaMemsetAsync(out1, 0, h * 4, be.stream()));
    return;
  }
  float *stats = static_cast<float *>(be.scratch(rows * 2 * sizeof(float), 5));
  normBackwardRows<<<gridFor(rows * 32, 32 * kWarps), 32 * kWarps, 0, be.stream()>>>(
      view(a.in[0]), view(a.in[1]), f32Param(a.in[2], k), view(a.out[0]), rows, h,
      epsOf(a), rms, stats);
  MAPP_CUDA_LAUNCHED();
  int64_t rowsPer = std::max<int64_t>(64, (rows + 127) / 128);
  int64_t blocks = (rows + rowsPer - 1) / rowsPer;
  float *partial = static_cast<float *>(be.scratch(blocks * nacc * h * 4, 0));
  dim3 grid(static_cast<unsigned>((h + 31) / 32), static_cast<unsigned>(blocks));
  normBackwardCols<<<grid, 32 * kWarps, 0, be.stream()>>>(
      view(a.in[0]), view(a.in[1]), stats, rows, h, rms, rowsPer, partial);
  MAPP_CUDA_LAUNCHED();
  sumPartials<<<gridFor(nacc * h, 256), 256, 0, be.stream()>>>(
      partial, blocks, nacc * h, out0, out1, h);
  MAPP_CUDA_LAUNCHED();
}

} // namespace

void cuda::layer_norm(const KernelArgs &a) { forward(a, false); }
void cuda::rms_norm(const KernelArgs &a) { forward(a, true); }
void cuda::layer_norm_grad(const KernelArgs &a) { backward(a, false); }
void cuda::rms_norm_grad(const KernelArgs &a) { backward(a, true); }
