//===- Fp8.cu - fp8 quantize, transpose, delayed scaling -------------------===//
//
// See Fp8.h. Rounding is the hardware conversion with __NV_SATFINITE (round
// to nearest even, saturate to the largest finite value, NaN stays NaN),
// which is mapp::rt::fp8Round of mapp/rt/Fp8.h bit for bit; the scale
// multiply is one fp32 multiply as on the CPU. The amax is a max over the
// bits of |v| (ordered like |v|, NaN above infinity), so it can be taken
// with atomicMax on unsigned ints in the meta's h[0] and matches the CPU's
// amaxBits. Nothing here synchronizes with the host.
//
//===----------------------------------------------------------------------===//
#include "Fp8.h"
#include "CudaCommon.h"

#include <cuda_fp8.h>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

__device__ __forceinline__ uint8_t toFp8(float v, int e5m2) {
  return e5m2 ? __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2)
              : __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ float fromFp8(uint8_t q, int e5m2) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(q, e5m2 ? __NV_E5M2 : __NV_E4M3);
  return __half2float(__half(h));
}

__device__ __forceinline__ unsigned absBitsDev(float v) {
  return __float_as_uint(v) & 0x7FFFFFFFu;
}

/// Block-wide max of `m`, one atomicMax per block into *dst.
__device__ __forceinline__ void amaxCommit(unsigned m, unsigned *dst) {
  m = __reduce_max_sync(0xffffffffu, m);
  __shared__ unsigned blockMax;
  int t = threadIdx.x + threadIdx.y * blockDim.x;
  if (t == 0)
    blockMax = 0;
  __syncthreads();
  if ((t & 31) == 0 && m)
    atomicMax(&blockMax, m);
  __syncthreads();
  if (t == 0 && blockMax)
    atomicMax(dst, blockMax);
}

/// Straight copy: 8 elements a thread when aligned.
__global__ void quantizeStraight(DView src, int64_t n, int e5m2, float *meta,
                                 uint8_t *out, float *descale, int vec8) {
  const float scale = meta[0];
  if (blockIdx.x == 0 && threadIdx.x == 0 && descale)
    *descale = 1.0f / scale;
  unsigned m = 0;
  int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i0 = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (vec8) {
    for (int64_t i = i0; i < n / 8; i += stride) {
      float v[8];
      src.ld8(i * 8, v);
      uint32_t lo = 0, hi = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        m = max(m, absBitsDev(v[j]));
        uint32_t q = toFp8(v[j] * scale, e5m2);
        if (j < 4)
          lo |= q << (8 * j);
        else
          hi |= q << (8 * (j - 4));
      }
      reinterpret_cast<uint2 *>(out)[i] = make_uint2(lo, hi);
    }
  } else {
    for (int64_t i = i0; i < n; i += stride) {
      float v = src.ld(i);
      m = max(m, absBitsDev(v));
      out[i] = toFp8(v * scale, e5m2);
    }
  }
  amaxCommit(m, reinterpret_cast<unsigned *>(meta + 1));
}

constexpr int kTile = 32;

/// 32×32 tiles through shared memory: the transposed copy (and the straight
/// one from the same read when asked: cast and transpose fused).
__global__ void quantizeTransposed(DView src, int64_t rows, int64_t cols,
                                   int e5m2, float *meta, uint8_t *straight,
                                   uint8_t *transposed, float *descale) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const float scale = meta[0];
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 &&
      threadIdx.y == 0 && descale)
    *descale = 1.0f / scale;
  unsigned m = 0;
  int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  for (int j = threadIdx.y; j < kTile; j += blockDim.y) {
    int64_t r = r0 + j, c = c0 + threadIdx.x;
    uint8_t q = 0;
    if (r < rows && c < cols) {
      float v = src.ld(r * cols + c);
      m = max(m, absBitsDev(v));
      q = toFp8(v * scale, e5m2);
      if (straight)
        straight[r * cols + c] = q;
    }
    tile[j][threadIdx.x] = q;
  }
  __syncthreads();
  if (transposed)
    for (int j = threadIdx.y; j < kTile; j += blockDim.y) {
      int64_t c = c0 + j, r = r0 + threadIdx.x;
      if (r < rows && c < cols)
        transposed[c * rows + r] = tile[threadIdx.x][j];
    }
  amaxCommit(m, reinterpret_cast<unsigned *>(meta + 1));
}

__device__ float fp8MaxDev(int e5m2) { return e5m2 ? 57344.0f : 448.0f; }

/// One thread per meta row: the rule of mapp::rt::fp8UpdateRow.
__global__ void updateMeta(float *meta, int64_t history, int64_t margin,
                           int f0, int f1, int f2) {
  int r = threadIdx.x;
  if (r >= 3)
    return;
  int e5m2 = r == 0 ? f0 : r == 1 ? f1 : f2;
  float *row = meta + r * (1 + history);
  unsigned m = 0;
  for (int64_t i = 0; i < history; ++i)
    m = max(m, absBitsDev(row[1 + i]));
  float amax = __uint_as_float(m);
  if (isfinite(amax) && amax > 0.0f) {
    float s = __fdiv_rn(__fdiv_rn(fp8MaxDev(e5m2), amax),
                        ldexpf(1.0f, static_cast<int>(margin)));
    if (isfinite(s))
      row[0] = s;
  }
  for (int64_t i = history - 1; i >= 1; --i)
    row[1 + i] = row[i];
  row[1] = 0.0f;
}

constexpr int kGT = 16; // tiled GEMM: 16×16 outputs a block, K in steps of 16

__global__ void gemmTiled(const uint8_t *a, int ea, const uint8_t *b, int eb,
                          const float *da, const float *db, DView c,
                          const float *bias, int64_t M, int64_t N, int64_t K) {
  __shared__ float as[kGT][kGT + 1], bs[kGT][kGT + 1];
  int tx = threadIdx.x, ty = threadIdx.y;
  int64_t row = int64_t(blockIdx.y) * kGT + ty, col = int64_t(blockIdx.x) * kGT + tx;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += kGT) {
    int64_t ka = k0 + tx;
    as[ty][tx] = row < M && ka < K ? fromFp8(a[row * K + ka], ea) : 0.0f;
    int64_t brow = int64_t(blockIdx.x) * kGT + ty;
    bs[ty][tx] = brow < N && ka < K ? fromFp8(b[brow * K + ka], eb) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kGT; ++k)
      acc = fmaf(as[ty][k], bs[tx][k], acc);
    __syncthreads();
  }
  if (row < M && col < N) {
    float v = acc * (*da * *db);
    if (bias)
      v += bias[col];
    c.st(row * N + col, v);
  }
}

} // namespace

void cuda::fp8Quantize(const void *srcp, bool srcBf16, int64_t rows, int64_t cols, Fp8Format fmt,
                       float *meta, uint8_t *straight, uint8_t *transposed,
                       float *descale, cudaStream_t s) {
  DView src{const_cast<void *>(srcp), srcBf16 ? 1 : 0};
  int64_t n = rows * cols;
  int e5m2 = fmt == Fp8Format::E5M2;
  if (n == 0) {
    // Still the descale (the GEMM reads it).
    quantizeStraight<<<1, 32, 0, s>>>(src, 0, e5m2, meta, straight, descale, 0);
    MAPP_CUDA_LAUNCHED();
    return;
  }
  if (!transposed) {
    int vec8 = n % 8 == 0 && aligned16(src.p) &&
               (reinterpret_cast<uintptr_t>(straight) & 7) == 0;
    int64_t work = vec8 ? n / 8 : n;
    quantizeStraight<<<gridFor(work, 256), 256, 0, s>>>(src, n, e5m2, meta,
                                                       straight, descale, vec8);
    MAPP_CUDA_LAUNCHED();
    return;
  }
  if (rows > int64_t(65535) * kTile)
    fail("fp8 quantize: ", rows, " rows is too many for the transposing kernel");
  dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile),
            static_cast<unsigned>((rows + kTile - 1) / kTile));
  quantizeTransposed<<<grid, dim3(kTile, 8), 0, s>>>(
      src, rows, cols, e5m2, meta, straight, transposed, descale);
  MAPP_CUDA_LAUNCHED();
}

void cuda::fp8UpdateMeta(float *meta, int64_t history, int64_t margin,
                         const Fp8Format (&f)[3], cudaStream_t s) {
  auto e = [](Fp8Format x) { return x == Fp8Format::E5M2 ? 1 : 0; };
  updateMeta<<<1, 32, 0, s>>>(meta, history, margin, e(f[0]), e(f[1]), e(f[2]));
  MAPP_CUDA_LAUNCHED();
}

void cuda::fp8GemmTiled(const uint8_t *a, Fp8Format fa, const uint8_t *b,
                        Fp8Format fb, const float *da, const float *db,
                        void *cp, bool cBf16, const float *bias, int64_t M,
                        int64_t N, int64_t K, cudaStream_t s) {
  DView c{cp, cBf16 ? 1 : 0};
  if (M == 0 || N == 0)
    return;
  if (M > int64_t(65535) * kGT)
    fail("fp8 tiled GEMM: M = ", M, " is too large");
  dim3 grid(static_cast<unsigned>((N + kGT - 1) / kGT),
            static_cast<unsigned>((M + kGT - 1) / kGT));
  gemmTiled<<<grid, dim3(kGT, kGT), 0, s>>>(a, fa == Fp8Format::E5M2, b,
                                           fb == Fp8Format::E5M2, da, db, c,
                                           bias, M, N, K);
  MAPP_CUDA_LAUNCHED();
}
