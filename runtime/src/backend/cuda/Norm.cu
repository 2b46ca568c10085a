//===- Norm.cu - layer_norm, rms_norm and their gradients -----------------===//
//
// One warp per row. Forward: statistics in fp32 with a two-pass variance (the
// second pass re-reads the row from L1), one write. Backward: dx per row;
// dgamma/dbeta accumulate per block in shared memory, then per-block partials
// are summed column-wise in a fixed order (deterministic, fp64 final sum).
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

/// dx per row; per-block partial sums of dy·xhat (and dy) into
/// partial[block][0..h) (and [h..2h)).
__global__ void normBackward(DView dy, DView x, const float *g, DView dx,
                             int64_t rows, int64_t h, float eps, bool rms,
                             int64_t rowsPer, float *partial) {
  extern __shared__ float acc[]; // [2h] (layer) or [h] (rms)
  int nacc = rms ? 1 : 2;
  for (int64_t c = threadIdx.x; c < nacc * h; c += blockDim.x)
    acc[c] = 0;
  __syncthreads();
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int64_t r0 = blockIdx.x * rowsPer, r1 = min(rows, r0 + rowsPer);
  for (int64_t r = r0 + w; r < r1; r += kWarps) {
    int64_t base = r * h;
    Stats st = rowStats(x, base, h, eps, rms, lane);
    float sg = 0, sgx = 0;
    for (int64_t c = lane; c < h; c += 32) {
      float xv = x.ld(base + c), d = dy.ld(base + c);
      float xh = (xv - st.mean) * st.rstd;
      float gdy = d * g[c];
      sg += gdy;
      sgx += gdy * xh;
      atomicAdd(&acc[c], d * xh);
      if (!rms)
        atomicAdd(&acc[h + c], d);
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
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < nacc * h; c += blockDim.x)
    partial[blockIdx.x * nacc * h + c] = acc[c];
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
  size_t smem = static_cast<size_t>(nacc) * h * sizeof(float);
  if (smem > 200 * 1024)
    fail(k, ": hidden size ", h, " exceeds the CUDA kernel's shared memory");
  static bool raised = false;
  if (!raised) {
    MAPP_CUDA_CHECK(cudaFuncSetAttribute(
        normBackward, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    raised = true;
  }
  int64_t blocks = std::min<int64_t>(rows, 2 * be.smCount());
  int64_t rowsPer = (rows + blocks - 1) / blocks;
  blocks = (rows + rowsPer - 1) / rowsPer;
  float *partial = static_cast<float *>(be.scratch(blocks * nacc * h * 4, 0));
  normBackward<<<static_cast<unsigned>(blocks), 32 * kWarps, smem, be.stream()>>>(
      view(a.in[0]), view(a.in[1]), f32Param(a.in[2], k), view(a.out[0]), rows,
      h, epsOf(a), rms, rowsPer, partial);
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
