//===- Norm.cu - layer_norm, rms_norm and their gradients -----------------===//
//
// One warp per row, 8-element accesses where the width and alignment allow.
// Forward: statistics in fp32 with a two-pass variance (the second pass
// re-reads the row from L1), one write. Backward: dx per row (the
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

/// rowStats with 8-element accesses (h % 8 == 0, aligned rows): lane owns
/// columns [8j, 8j + 8) for j = lane, lane + 32, ...
__device__ __forceinline__ Stats rowStatsVec(DView x, int64_t base, int64_t h,
                                             float eps, bool rms, int lane) {
  float v[8], s = 0;
  if (!rms) {
    for (int64_t c = lane * 8; c < h; c += 256) {
      x.ld8(base + c, v);
#pragma unroll
      for (int j = 0; j < 8; ++j)
        s += v[j];
    }
    s = warpSum(s);
  }
  float mean = rms ? 0.0f : s / h, var = 0;
  for (int64_t c = lane * 8; c < h; c += 256) {
    x.ld8(base + c, v);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      var += (v[j] - mean) * (v[j] - mean);
  }
  return {mean, rsqrtf(warpSum(var) / h + eps)};
}

/// normForward with 8-element accesses (h % 8 == 0, aligned rows).
__global__ void normForwardVec(DView x, const float *g, const float *b, DView y,
                               int64_t rows, int64_t h, float eps, bool rms) {
  int lane = threadIdx.x & 31;
  int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
       r < rows; r += warps) {
    int64_t base = r * h;
    Stats st = rowStatsVec(x, base, h, eps, rms, lane);
    float mean = st.mean, rstd = st.rstd, v[8];
    for (int64_t c = lane * 8; c < h; c += 256) {
      x.ld8(base + c, v);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float xh = (v[j] - mean) * rstd;
        v[j] = b ? xh * g[c + j] + b[c + j] : xh * g[c + j];
      }
      y.st8(base + c, v);
    }
  }
}

/// dx per row (one warp a row); the row statistics go to stats[2r..2r+1]
/// for the column pass.
/// dx of each row; with res.p set, dx + res is written instead (the
/// residual-gradient add fused, Fusion.h).
__global__ void normBackwardRows(DView dy, DView x, const float *g, DView dx,
                                 DView res, int64_t rows, int64_t h, float eps,
                                 bool rms, float *stats) {
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
      float d = st.rstd * (gdy - (rms ? 0.0f : sg) - xh * sgx);
      dx.st(base + c, res.p ? d + res.ld(base + c) : d);
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

/// normBackwardRows with 8-element accesses (h % 8 == 0, aligned rows); the
/// repeated passes over the row hit L1.
__global__ void normBackwardRowsVec(DView dy, DView x, const float *g, DView dx,
                                    DView res, int64_t rows, int64_t h,
                                    float eps, bool rms, float *stats) {
  int lane = threadIdx.x & 31;
  int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
       r < rows; r += warps) {
    int64_t base = r * h;
    Stats st = rowStatsVec(x, base, h, eps, rms, lane);
    float mean = st.mean, rstd = st.rstd, xv[8], dv[8];
    float sg = 0, sgx = 0;
    for (int64_t c = lane * 8; c < h; c += 256) {
      x.ld8(base + c, xv);
      dy.ld8(base + c, dv);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float gdy = dv[j] * g[c + j];
        sg += gdy;
        sgx += gdy * (xv[j] - mean) * rstd;
      }
    }
    sg = warpSum(sg) / h;
    sgx = warpSum(sgx) / h;
    for (int64_t c = lane * 8; c < h; c += 256) {
      x.ld8(base + c, xv);
      dy.ld8(base + c, dv);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float gdy = dv[j] * g[c + j];
        xv[j] = rstd * (gdy - (rms ? 0.0f : sg) - (xv[j] - mean) * rstd * sgx);
      }
      if (res.p) {
        res.ld8(base + c, dv);
#pragma unroll
        for (int j = 0; j < 8; ++j)
          xv[j] += dv[j];
      }
      dx.st8(base + c, xv);
    }
    if (lane == 0) {
      stats[2 * r] = mean;
      stats[2 * r + 1] = rstd;
    }
  }
}

/// normBackwardCols with 8 columns a thread: a warp reads 256 consecutive
/// columns of a row (h % 8 == 0, aligned rows).
__global__ void normBackwardColsVec(DView dy, DView x, const float *stats,
                                    int64_t rows, int64_t h, bool rms,
                                    int64_t rowsPer, float *partial) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int64_t c = (blockIdx.x * int64_t(32) + lane) * 8;
  int64_t r0 = blockIdx.y * rowsPer, r1 = min(rows, r0 + rowsPer);
  float s0[8] = {}, s1[8] = {}, dv[8], xv[8];
  if (c < h)
    for (int64_t r = r0 + w; r < r1; r += kWarps) {
      dy.ld8(r * h + c, dv);
      x.ld8(r * h + c, xv);
      float mean = stats[2 * r], rstd = stats[2 * r + 1];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        s0[j] += dv[j] * (xv[j] - mean) * rstd;
        s1[j] += dv[j];
      }
    }
  __shared__ float sh[2][kWarps][32 * 8 + 1];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    sh[0][w][lane * 8 + j] = s0[j];
    sh[1][w][lane * 8 + j] = s1[j];
  }
  __syncthreads();
  // 256 threads sum the 256 columns of this block over the warps.
  int col = threadIdx.x;
  int64_t cc = blockIdx.x * int64_t(256) + col;
  if (cc < h) {
    float t0 = 0, t1 = 0;
    for (int i = 0; i < kWarps; ++i) {
      t0 += sh[0][i][col];
      t1 += sh[1][i][col];
    }
    int nacc = rms ? 1 : 2;
    partial[blockIdx.y * nacc * h + cc] = t0;
    if (!rms)
      partial[blockIdx.y * nacc * h + h + cc] = t1;
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

__global__ void offsetGain(const float *g, float *out, int64_t h, float offset) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < h;
       c += int64_t(gridDim.x) * blockDim.x)
    out[c] = g[c] + offset;
}

/// The gain an rms_norm multiplies by: gamma, or gamma + weight_offset
/// (Gemma's 1 + weight) in scratch slot 4. Its gradient is dgamma itself.
const float *gainOf(CudaBackend &be, const KernelArgs &a, const Tensor &gamma,
                    const char *kernel) {
  const float *g = f32Param(gamma, kernel);
  float offset = static_cast<float>(a.attrs.getFloat("weight_offset", 0.0));
  if (offset == 0)
    return g;
  int64_t h = gamma.numel();
  float *out = static_cast<float *>(be.scratch(h * sizeof(float), 4));
  offsetGain<<<gridFor(h, 256), 256, 0, be.stream()>>>(g, out, h, offset);
  MAPP_CUDA_LAUNCHED();
  return out;
}

void forward(const KernelArgs &a, bool rms) {
  CudaBackend &be = backendOf(a);
  const char *k = rms ? "rms_norm" : "layer_norm";
  int64_t h = a.in[0].dim(-1), rows = h ? a.in[0].numel() / h : 0;
  if (!rows)
    return;
  const float *g = rms ? gainOf(be, a, a.in[1], k) : f32Param(a.in[1], k);
  const float *b = rms ? nullptr : f32Param(a.in[2], k);
  DView x = view(a.in[0]), y = view(a.out[0]);
  int grid = gridFor(rows * 32, 32 * kWarps);
  if (h % 8 == 0 && aligned16(x.p) && aligned16(y.p) && aligned16(g) &&
      (!b || aligned16(b)))
    normForwardVec<<<grid, 32 * kWarps, 0, be.stream()>>>(x, g, b, y, rows, h,
                                                          epsOf(a), rms);
  else
    normForward<<<grid, 32 * kWarps, 0, be.stream()>>>(x, g, b, y, rows, h,
                                                       epsOf(a), rms);
  MAPP_CUDA_LAUNCHED();
}

/// The norm gradient of `a`; with `res` set, out[0] := dx + res is written
/// to `sum` instead of dx to out[0].
void backward(const KernelArgs &a, bool rms, const Tensor *res = nullptr,
              const Tensor *sum = nullptr) {
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
  DView dy = view(a.in[0]), x = view(a.in[1]);
  DView dx = view(sum ? *sum : a.out[0]), r = res ? view(*res) : DView{nullptr, 0};
  const float *g = rms ? gainOf(be, a, a.in[2], k) : f32Param(a.in[2], k);
  bool vec = h % 8 == 0 && aligned16(dy.p) && aligned16(x.p) &&
             aligned16(dx.p) && aligned16(g) && aligned16(r.p);
  int rowGrid = gridFor(rows * 32, 32 * kWarps);
  if (vec)
    normBackwardRowsVec<<<rowGrid, 32 * kWarps, 0, be.stream()>>>(
        dy, x, g, dx, r, rows, h, epsOf(a), rms, stats);
  else
    normBackwardRows<<<rowGrid, 32 * kWarps, 0, be.stream()>>>(
        dy, x, g, dx, r, rows, h, epsOf(a), rms, stats);
  MAPP_CUDA_LAUNCHED();
  int64_t rowsPer = std::max<int64_t>(64, (rows + 127) / 128);
  int64_t blocks = (rows + rowsPer - 1) / rowsPer;
  float *partial = static_cast<float *>(be.scratch(blocks * nacc * h * 4, 0));
  int64_t colsPerBlock = vec ? 256 : 32;
  dim3 grid(static_cast<unsigned>((h + colsPerBlock - 1) / colsPerBlock),
            static_cast<unsigned>(blocks));
  if (vec)
    normBackwardColsVec<<<grid, 32 * kWarps, 0, be.stream()>>>(
        dy, x, stats, rows, h, rms, rowsPer, partial);
  else
    normBackwardCols<<<grid, 32 * kWarps, 0, be.stream()>>>(
        dy, x, stats, rows, h, rms, rowsPer, partial);
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
void cuda::normGradResidual(const KernelArgs &a, bool rms, const Tensor &res,
                            const Tensor &sum) {
  backward(a, rms, &res, &sum);
}
